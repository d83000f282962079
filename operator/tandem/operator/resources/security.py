"""Least privilege for every pod the operator creates. Pure builders.

Every child pod runs as a non-root user with the RuntimeDefault seccomp profile; every container has
a read-only root filesystem, no privilege escalation and no Linux capabilities. Processes write only
to emptyDir volumes mounted where they need to (`/tmp` everywhere; vLLM's home for ~/.cache and
~/.config; Redis' data directory). Pods that do not talk to the Kubernetes API (engines, Redis) get
no service-account token.

The Redis password (`kvPool.redis.passwordSecret`, generated when the spec names none) and the
engines' API key (`engine.apiKeySecret`, likewise) reach containers only as environment variables
from a `secretKeyRef` (`TANDEM_KVPOOL_PASSWORD`; `VLLM_API_KEY` in engines, `TANDEM_ENGINE_API_KEY` in
the gateway): never in a ConfigMap, an argument list or the pod spec itself.
"""

from __future__ import annotations

from typing import Any

from tandem.core.spec import InferenceServiceSpec
from tandem.kvpool.engine_config import PASSWORD_ENV

#: The uid/gid vLLM runs as: the vLLM images default to root, which `runAsNonRoot` refuses.
VLLM_UID = 1000
#: The `redis` user of the official Redis images.
REDIS_UID = 999
TMP_MOUNT = "/tmp"
#: Where engines read the key they require on /v1/* (vLLM's own variable; `tandem sim` reads it too).
ENGINE_KEY_ENV = "VLLM_API_KEY"
#: Where the gateway reads the key it sends to engines (`tandem router`).
GATEWAY_ENGINE_KEY_ENV = "TANDEM_ENGINE_API_KEY"


def pod_security_context(*, run_as_user: int | None = None) -> dict[str, Any]:
    """The pod-level context: non-root, RuntimeDefault seccomp; with `run_as_user`, that uid and gid
    (and the gid owns the emptyDirs, `fsGroup`). Without it the image's numeric USER applies."""
    context: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        context |= {"runAsUser": run_as_user, "runAsGroup": run_as_user, "fsGroup": run_as_user}
    return context


def container_security_context() -> dict[str, Any]:
    """The container-level context every child container gets (module docstring)."""
    return {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def scratch_volumes(paths: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """emptyDir volumes named by `paths`' keys and their mounts at its values."""
    volumes = [{"name": name, "emptyDir": {}} for name in paths]
    mounts = [{"name": name, "mountPath": path} for name, path in paths.items()]
    return volumes, mounts


def password_env(spec: InferenceServiceSpec, name: str = PASSWORD_ENV) -> list[dict[str, Any]]:
    """`[name = the Secret's key]` when the pool has a password Secret, else nothing."""
    secret = spec.kv_pool.redis.password_secret
    if secret is None:
        return []
    ref = {"secretKeyRef": {"name": secret.name, "key": secret.key}}
    return [{"name": name, "valueFrom": ref}]


def engine_key_env(spec: InferenceServiceSpec, name: str = ENGINE_KEY_ENV) -> list[dict[str, Any]]:
    """`[name = the engine API key Secret's key]` when the spec names one, else nothing."""
    secret = spec.engine.api_key_secret
    if secret is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}]
