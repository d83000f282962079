"""Multi-node engine pools: a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) instead of a Deployment.

A pool with `nodesPerReplica: N` > 1 runs each engine replica as a group of N pods: vLLM data
parallel across nodes, as KServe's LLMInferenceService (`config-llm-worker-data-parallel.yaml`) and
llm-d's wide expert-parallel guides run it. Every pod runs `GPUs / tensorParallel` data-parallel
ranks (`--data-parallel-size-local`) of a group of `N ×` that (`--data-parallel-size`); pod `i`'s
first rank is `i × local`. The leader (worker index 0) serves the OpenAI API on port 8000 and runs
vLLM's data-parallel coordinator on `--data-parallel-rpc-port` 5555; the workers run `--headless`
and join it at `LWS_LEADER_ADDRESS`, which LeaderWorkerSet puts in their environment (the address
is resolved to an IP first: some vLLM versions' ZMQ binds do not resolve names). Expert parallelism
(`--enable-expert-parallel`) is one of the user's engine arguments.

- `restartPolicy: RecreateGroupOnPodRestart`: when one pod of a group restarts, the whole group is
  recreated (a data-parallel group cannot lose a member and go on);
- `networkConfig.subdomainPolicy: UniquePerReplica`: LeaderWorkerSet's DNS Service is one per group,
  named as its leader, so none takes the name of the pool's own Service;
- the workers have no port, probes or drain hook (they serve no HTTP); they carry the pool's labels,
  so its NetworkPolicy lets the group's pods reach each other, and the pool's Service selects the
  leaders only (`services.py`), so the gateway routes to leaders only.
Pure builders.
"""

from __future__ import annotations

import copy
from typing import Any

from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources.meta import Owner, Role, child_name, object_meta

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
#: The label LeaderWorkerSet puts on every pod of a group: 0 on the leader.
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: What each pod of a group runs: its first rank from LWS_WORKER_INDEX, the leader's address as an IP.
START_SCRIPT = """\
addr="$LWS_LEADER_ADDRESS"
i=0
while [ "$i" -lt 60 ]; do
  ip=$(python3 -c "import socket, sys; print(socket.gethostbyname(sys.argv[1]))" "$addr" 2>/dev/null) \\
    && [ -n "$ip" ] && addr="$ip" && break
  i=$((i + 1)); sleep 2
done
exec vllm serve "$@" --data-parallel-address "$addr" \\
  --data-parallel-start-rank $((LWS_WORKER_INDEX * TANDEM_DP_LOCAL)) $TANDEM_DP_HEADLESS
"""
_SERVING_ONLY = ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle")


def group_pod(template: dict[str, Any], *, local_ranks: int, leader: bool) -> dict[str, Any]:
    """A leader's or a worker's pod template from the pool's (single-node) engine pod template: the
    engine container starts through `START_SCRIPT`; a worker's runs headless and serves nothing."""
    pod = copy.deepcopy(template)
    for container in pod["spec"]["containers"]:
        if container["name"] != "engine":
            continue
        container["command"] = ["/bin/sh", "-c", START_SCRIPT, "vllm"]
        container["env"] = [
            *container.get("env", []),
            {"name": "TANDEM_DP_LOCAL", "value": str(local_ranks)},
            {"name": "TANDEM_DP_HEADLESS", "value": "" if leader else "--headless"},
        ]
        if not leader:
            for key in _SERVING_ONLY:
                container.pop(key, None)
    if not leader:  # nothing to scrape on a worker
        annotations = pod["metadata"].get("annotations", {})
        for key in [k for k in annotations if k.startswith("prometheus.io/")]:
            del annotations[key]
    return pod


def build_leader_worker_set(
    spec: InferenceServiceSpec, *, owner: Owner, role: Role, template: dict[str, Any], local_ranks: int
) -> dict[str, Any]:
    """LeaderWorkerSet `<name>-prefill` or `<name>-decode`: `replicas` groups of `nodesPerReplica`
    pods built from the pool's engine pod `template` (module docstring)."""
    pool = spec.prefill if role is Role.PREFILL else spec.decode
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": object_meta(owner, name=child_name(owner, role.value), role=role),
        "spec": {
            "replicas": pool.replicas,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "leaderWorkerTemplate": {
                "size": pool.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": group_pod(template, local_ranks=local_ranks, leader=True),
                "workerTemplate": group_pod(template, local_ranks=local_ranks, leader=False),
            },
        },
    }
