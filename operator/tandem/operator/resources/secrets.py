"""The Secrets of a service: the three the operator generates, and which Secrets a spec may use. Pure.

**Generated.** Every service has these credentials, whether or not its spec names them:

- the managed Redis' password (`kvPool.redis.passwordSecret`), default: the Secret `<name>-kv-auth`,
  key `password`; an external Redis (`kvPool.redis.url`) gets none generated (its owner sets it up);
- the engines' API key (`engine.apiKeySecret`), default: the Secret `<name>-engine-key`, key `api-key`;
- with `router.metricsToken` only, the gateway's metrics token: the Secret `<name>-metrics-token`, key `token`
  (`TANDEM_METRICS_TOKEN`: the bearer token of the gateway's diagnostics port, 9090, where `/metrics`
  is served; give it to the Prometheus that scrapes the gateway);
- the cache keys, always the Secret `<name>-cache-keys` (the spec has no field naming another), two
  keys: `pool-key`, the pool secret (`TANDEM_KV_POOL_KEY` in engines and gateways: keyed chunk hashes
  and the tag on every chunk Tandem's connector writes, `tandem.kvpool.keys`), and `salt-key`, the
  gateway's key of the tenants' `cache_salt` (`TANDEM_CACHE_KEY`, gateways only: an engine that could
  compute salts could pick another tenant's). Each is drawn on its own.

A generated Secret is created once, with a fresh random value (`new_secret`, 32 random bytes as
URL-safe base64: letters, digits, `-` and `_`, so the password fits a `redis://:<password>@` URL),
and its `data` is never patched afterwards (`Child.create_only`): a reconcile does not rotate it.
Deleting the Secret makes the next reconcile create a new one (the pods that read it pick the new
value up when they restart). It is owned by the InferenceService, so it goes with it.

`with_generated_secrets` fills these defaults into the spec, so every other builder sees a spec whose
pool password and engine key always name a Secret.

**Usable.** A Secret the spec author names (`router.auth.apiKeysSecret`, `kvPool.redis.passwordSecret`,
`engine.apiKeySecret`) is mounted into pods that may run the author's own image. The operator uses it
only when it carries the label `tandem.dev/usable: "true"`, which whoever may write Secrets in the
namespace sets deliberately (`refusal` says why one is refused). Generated Secrets carry the label.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from tandem.core.spec import InferenceServiceSpec, SecretKeyRef
from tandem.operator.objects import Child, FieldPath
from tandem.operator.resources.meta import Owner, Role, child_name, object_meta

KV_AUTH_SUFFIX = "kv-auth"
KV_AUTH_KEY = "password"
ENGINE_KEY_SUFFIX = "engine-key"
ENGINE_KEY_KEY = "api-key"
CACHE_KEYS_SUFFIX = "cache-keys"
POOL_KEY_KEY = "pool-key"
SALT_KEY_KEY = "salt-key"
METRICS_TOKEN_SUFFIX = "metrics-token"
METRICS_TOKEN_KEY = "token"
#: The label that makes a Secret usable by an InferenceService's spec (value "true").
USABLE_LABEL = "tandem.dev/usable"
#: A generated Secret's value is written once, at creation.
SECRET_DATA: FieldPath = ("data",)


def new_secret() -> str:
    """A fresh credential: 32 random bytes, URL-safe base64 without padding (43 characters)."""
    return secrets.token_urlsafe(32)


def kv_auth_ref(owner: Owner) -> SecretKeyRef:
    """The generated Redis password's Secret key."""
    return SecretKeyRef(name=child_name(owner, KV_AUTH_SUFFIX), key=KV_AUTH_KEY)


def engine_key_ref(owner: Owner) -> SecretKeyRef:
    """The generated engine API key's Secret key."""
    return SecretKeyRef(name=child_name(owner, ENGINE_KEY_SUFFIX), key=ENGINE_KEY_KEY)


class CacheKeyRefs(NamedTuple):
    """The two keys of the generated `<name>-cache-keys` Secret."""

    pool_key: SecretKeyRef
    salt_key: SecretKeyRef


def cache_keys_refs(owner: Owner) -> CacheKeyRefs:
    """The pool key's and the salt key's Secret keys (module docstring)."""
    name = child_name(owner, CACHE_KEYS_SUFFIX)
    return CacheKeyRefs(SecretKeyRef(name=name, key=POOL_KEY_KEY), SecretKeyRef(name=name, key=SALT_KEY_KEY))


def metrics_token_ref(owner: Owner) -> SecretKeyRef:
    """The gateway's metrics token (module docstring): `<name>-metrics-token` / `token`; an
    InferenceGateway's is `<gateway>-metrics-token`."""
    return SecretKeyRef(name=child_name(owner, METRICS_TOKEN_SUFFIX), key=METRICS_TOKEN_KEY)


def build_metrics_token_secret(
    owner: Owner, *, role: Role = Role.ROUTER, new_value: Callable[[], str] = new_secret
) -> dict[str, Any]:
    """The Secret `<name>-metrics-token` holding a token drawn with `new_value`."""
    return build_generated_secret(owner, ref=metrics_token_ref(owner), role=role, value=new_value())


def generated_refs(spec: InferenceServiceSpec, owner: Owner) -> list[tuple[Role, SecretKeyRef]]:
    """The Secrets the operator generates for `spec` (those it names none for), with their role."""
    refs: list[tuple[Role, SecretKeyRef]] = []
    redis = spec.kv_pool.redis
    if redis.url is None and redis.password_secret is None:
        refs.append((Role.KV_POOL, kv_auth_ref(owner)))
    if spec.engine.api_key_secret is None:
        refs.append((Role.ROUTER, engine_key_ref(owner)))
    return refs


def with_generated_secrets(spec: InferenceServiceSpec, owner: Owner) -> InferenceServiceSpec:
    """`spec` with the generated Secrets filled in where it names none (module docstring)."""
    redis = spec.kv_pool.redis
    if redis.url is None and redis.password_secret is None:
        redis = redis.model_copy(update={"password_secret": kv_auth_ref(owner)})
    engine = spec.engine
    if engine.api_key_secret is None:
        engine = engine.model_copy(update={"api_key_secret": engine_key_ref(owner)})
    kv_pool = spec.kv_pool.model_copy(update={"redis": redis})
    return spec.model_copy(update={"kv_pool": kv_pool, "engine": engine})


def build_generated_secret(owner: Owner, *, ref: SecretKeyRef, role: Role, value: str) -> dict[str, Any]:
    """The Secret `ref.name` holding `value` under `ref.key`, labelled usable."""
    return build_secret(owner, name=ref.name, role=role, values={ref.key: value})


def build_secret(owner: Owner, *, name: str, role: Role, values: Mapping[str, str]) -> dict[str, Any]:
    """The Secret `name` holding `values` (key → value), labelled usable."""
    meta = object_meta(owner, name=name, role=role)
    meta["labels"][USABLE_LABEL] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in values.items()},
    }


def build_cache_keys_secret(owner: Owner, *, new_value: Callable[[], str] = new_secret) -> dict[str, Any]:
    """The Secret `<name>-cache-keys`: a pool key and a salt key, each drawn with `new_value`."""
    refs = cache_keys_refs(owner)
    values = {refs.pool_key.key: new_value(), refs.salt_key.key: new_value()}
    return build_secret(owner, name=refs.pool_key.name, role=Role.ROUTER, values=values)


def secret_children(
    spec: InferenceServiceSpec, owner: Owner, *, new_value: Callable[[], str] = new_secret
) -> list[Child]:
    """The generated Secrets as children whose `data` is written only at creation."""
    children = [
        Child(
            build_generated_secret(owner, ref=ref, role=role, value=new_value()), create_only=(SECRET_DATA,)
        )
        for role, ref in generated_refs(spec, owner)
    ]
    children.append(Child(build_cache_keys_secret(owner, new_value=new_value), create_only=(SECRET_DATA,)))
    if spec.router.metrics_token:
        token = build_metrics_token_secret(owner, new_value=new_value)
        children.append(Child(token, create_only=(SECRET_DATA,)))
    return children


def named_secrets(spec: InferenceServiceSpec) -> list[tuple[str, SecretKeyRef]]:
    """The Secrets the spec author names, with the field naming each (before defaults are filled)."""
    named: list[tuple[str, SecretKeyRef | None]] = [
        (
            "spec.router.auth.apiKeysSecret",
            spec.router.auth.api_keys_secret if spec.router.auth.enabled else None,
        ),
        ("spec.kvPool.redis.passwordSecret", spec.kv_pool.redis.password_secret),
        ("spec.engine.apiKeySecret", spec.engine.api_key_secret),
    ]
    return [(path, ref) for path, ref in named if ref is not None]


def refusal(path: str, ref: SecretKeyRef, secret: Mapping[str, Any] | None) -> str | None:
    """Why the Secret `ref` (as read from the API, None: absent) may not be used; None when it may."""
    if secret is None:
        return f"{path}: Secret {ref.name!r} does not exist"
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(USABLE_LABEL) != "true":
        return f'{path}: Secret {ref.name!r} lacks the label {USABLE_LABEL}: "true"'
    if ref.key not in (secret.get("data") or {}) and ref.key not in (secret.get("stringData") or {}):
        return f"{path}: Secret {ref.name!r} has no key {ref.key!r}"
    return None
