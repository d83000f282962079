"""Reading the engine pods' `adapters-sync` reports (`GET /adapters`, `tandem.cli.adaptersync`).

A pod is read when it has an IP and its sidecar has started (`initContainerStatuses[].started`);
the port is the sidecar's port named `adapter-sync` in the pod's own spec (so a pod of an older
template is read where it listens). Up to `MAX_PARALLEL` pods at once, `TIMEOUT_S` each, so a
reconcile waits at most a few seconds for pods that do not answer; their entry is the reason.
The engine pods' NetworkPolicy admits the operator's namespace on that port
(`tandem.operator.resources.netpol`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tandem.core.adaptersync import SYNC_PORT
from tandem.operator.resources.lora import SYNC_CONTAINER, SYNC_PORT_NAME

TIMEOUT_S = 2.0
MAX_PARALLEL = 8
#: A report larger than this is not read (hundreds of adapters are a few tens of KiB).
MAX_REPORT_BYTES = 4 * 1024 * 1024


class SidecarError(Exception):
    """A sidecar's report could not be read; the message says why, in one line."""


#: Reads one pod's report (raises `SidecarError`).
ReportReader = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def sidecar_port(pod: Mapping[str, Any]) -> int:
    """The port the pod's sidecar serves on (its spec's `adapter-sync` port, else the default)."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") == SYNC_CONTAINER:
            for port in container.get("ports") or []:
                if port.get("name") == SYNC_PORT_NAME and isinstance(port.get("containerPort"), int):
                    return int(port["containerPort"])
    return SYNC_PORT


def sidecar_started(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has an IP and its sidecar has started."""
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    return any(
        s.get("name") == SYNC_CONTAINER and s.get("started") is True
        for s in status.get("initContainerStatuses") or []
    )


def http_report(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """GET the pod's `/adapters` over HTTP."""
    host = str((pod.get("status") or {}).get("podIP"))
    url = f"http://{f'[{host}]' if ':' in host else host}:{sidecar_port(pod)}/adapters"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            body = answer.read(MAX_REPORT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise SidecarError(f"{url} answered {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise SidecarError(f"{url}: {getattr(exc, 'reason', None) or exc}") from None
    if len(body) > MAX_REPORT_BYTES:
        raise SidecarError(f"{url}: the report is over {MAX_REPORT_BYTES} bytes")
    try:
        report = json.loads(body)
    except ValueError:
        raise SidecarError(f"{url}: the report is not JSON") from None
    if not isinstance(report, dict):
        raise SidecarError(f"{url}: the report is not a JSON object")
    return report


def read_reports(
    pods: Sequence[Mapping[str, Any]], *, read: ReportReader | None = None
) -> dict[str, Mapping[str, Any] | str]:
    """Each started pod's report by pod name, or why it could not be read (module docstring)."""
    reader = read or http_report
    started = [p for p in pods if sidecar_started(p)]
    if not started:
        return {}

    def one(pod: Mapping[str, Any]) -> Mapping[str, Any] | str:
        try:
            return reader(pod)
        except SidecarError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(started))) as pool:
        answers = list(pool.map(one, started))
    return {str((p.get("metadata") or {}).get("name")): a for p, a in zip(started, answers, strict=True)}
