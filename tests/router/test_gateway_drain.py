"""A gateway told to stop (SIGTERM, as Kubernetes does when a rollout replaces its pod, e.g. after a
service was removed from an InferenceGateway) drains: the stream it was serving runs to its end, no
new connection is accepted, and it exits by the signal (status 143) once drained.

Real: `tandem router` as a child process in front of one simulated engine process slow enough that a
40-token stream takes seconds (`tests.router.processes`), httpx as the clients. Nothing is faked.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import yaml
from tests.router.harness import router_config
from tests.router.processes import MODEL, router_process, sim_processes
from tests.servers import LOOPBACK, free_port


def test_a_stopping_gateway_finishes_its_streams_and_takes_no_new_connection(tmp_path: Path) -> None:
    with sim_processes(tmp_path, ["d0"], time_scale=0.2) as [engine]:
        config = tmp_path / "router.yaml"
        document = router_config(decode=[engine.url]).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        config.write_text(yaml.safe_dump(document))
        port = free_port()
        with router_process(tmp_path, config, port=port) as gateway:
            body = {
                "model": MODEL,
                "prompt": "drain me",
                "max_tokens": 40,
                "ignore_eos": True,
                "stream": True,
            }
            texts: list[str] = []
            refused = None
            with (
                httpx.Client(trust_env=False, timeout=60) as http,
                http.stream("POST", f"{gateway.url}/v1/completions", json=body) as response,
            ):
                assert response.status_code == 200
                lines = response.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        texts.append(json.loads(line[6:])["choices"][0]["text"])
                        break
                gateway.process.send_signal(signal.SIGTERM)
                for line in lines:
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        texts.extend(c["text"] for c in event.get("choices", []))
                        if refused is None:  # once the gateway has had time to close its socket
                            with socket.socket() as sock:
                                sock.settimeout(5)
                                refused = sock.connect_ex((LOOPBACK, port)) != 0
                    elif line == "data: [DONE]":
                        texts.append("[DONE]")
            code = gateway.process.wait(timeout=30)
    assert texts[-1] == "[DONE]"
    assert len([t for t in texts[:-1] if t]) == 40, "every token of the stream arrived"
    assert refused, "no new connection while draining"
    # uvicorn re-raises the signal it caught once it has drained: the process ends by SIGTERM, as
    # Kubernetes expects (exit status 143), after the stream is over.
    assert code == -signal.SIGTERM
