"""Least privilege for every pod the operator creates. Pure builders.

Every child pod runs as a non-root user with the RuntimeDefault seccomp profile; every container has
a read-only root filesystem, no privilege escalation and no Linux capabilities. Processes write only
to emptyDir volumes mounted where they need to (`/tmp` everywhere; vLLM's home for ~/.cache and
~/.config; Redis' data directory). Pods that do not talk to the Kubernetes API (engines, Redis) get
no service-account token.

The Redis password (`kvPool.redis.passwordSecret`, generated when the spec names none), the
engines' API key (`engine.apiKeySecret`, likewise) and the cache keys (the generated
`<name>-cache-keys`) reach containers only as environment variables from a `secretKeyRef`
(`TANDEM_KVPOOL_PASSWORD`; `VLLM_API_KEY` in engines, `TANDEM_ENGINE_API_KEY` in the gateway;
`TANDEM_KV_POOL_KEY` in engines and the gateway, `TANDEM_CACHE_KEY` in the gateway only): never in a
ConfigMap, an argument list or the pod spec itself.
"""

from __future__ import annotations

from typing import Any

from tandem.core.spec import InferenceServiceSpec, SecretKeyRef
from tandem.kvpool.engine_config import PASSWORD_ENV, POOL_KEY_ENV
from tandem.operator.resources.meta import Owner
from tandem.operator.resources.secrets import cache_keys_refs

#: The uid/gid vLLM runs as: the vLLM images default to root, which `runAsNonRoot` refuses.
VLLM_UID = 1000
#: The `redis` user of the official Redis images.
REDIS_UID = 999
TMP_MOUNT = "/tmp"
#: Where engines read the key they require on /v1/* (vLLM's own variable; `tandem sim` reads it too).
ENGINE_KEY_ENV = "VLLM_API_KEY"
#: Where the gateway reads the key it sends to engines (`tandem router`).
GATEWAY_ENGINE_KEY_ENV = "TANDEM_ENGINE_API_KEY"
#: Where the gateway reads the key it derives tenants' `cache_salt` from (`tandem router`).
CACHE_KEY_ENV = "TANDEM_CACHE_KEY"
#: The gateway's diagnostics-port token (`tandem router` reads it, `tandem.cli.router`).
METRICS_TOKEN_ENV = "TANDEM_METRICS_TOKEN"


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


def cache_keys_env(owner: Owner, *, gateway: bool) -> list[dict[str, Any]]:
    """The pool key (`TANDEM_KV_POOL_KEY`) for every engine and gateway, and for a gateway (`gateway`)
    the salt key (`TANDEM_CACHE_KEY`) too, from the generated `<name>-cache-keys` Secret."""
    refs = cache_keys_refs(owner)
    env = [_from_secret(POOL_KEY_ENV, refs.pool_key)]
    if gateway:
        env.append(_from_secret(CACHE_KEY_ENV, refs.salt_key))
    return env


def _from_secret(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
