"""The P/D handoff bodies, as vLLM's NIXL connector protocol expects them (pure functions).

1. Prefill request: the client's body with `max_tokens=1`, `stream=false`, no `stream_options`,
   no `max_completion_tokens` (vLLM's chat endpoint prefers it over `max_tokens`), no `min_tokens`
   (vLLM rejects `min_tokens > max_tokens`), and `kv_transfer_params=PREFILL_KV_PARAMS`, which
   asks the prefill engine to keep the prompt's KV for a remote decode.
2. The prefill engine answers with a top-level `kv_transfer_params` naming where the KV is
   (`remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, ...).
3. Decode request: the client's original body plus `kv_transfer_params` = the prefill's answer, or
   `DEFAULT_DECODE_KV_PARAMS` when the engine returned none (connectors that hand KV over through
   the shared pool, such as LMCache with Redis, find it by prompt hash and need no address).

4. Decode-only after a prefill of another KV layout (`away_from_layout_body`): the prefill's chunks
   are in the pool under keys that do not carry the layout, so the decode engine would load them as
   its own; the body goes with a `cache_salt` of its own, derived from the client's (or none) and
   the prefill's layout, under which Tandem's connector roots its pool keys (and vLLM its prefix
   cache): the decode engine finds nothing there and computes the prompt.

5. LMCache's request configs: a body the gateway tagged for LMCache engines (an adapter's or a
   salted request, `lmcache_tagged`: `kv_transfer_params: {"lmcache.tag.lora": "sql",
   "lmcache.tag.salt": <hash of the salt>}`) keeps its `lmcache.*` entries in the prefill's and the
   decode's `kv_transfer_params`, so both engines' LMCache keys carry the tags
   (`tandem.core.kvkeys.lmcache_tags`). A decode-only body after a prefill of another layout (4)
   carries its new salt in the salt tag too, since LMCache's keys do not carry `cache_salt`.

Unknown fields are kept as they are: the gateway forwards vLLM extensions untouched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tandem.core.kvkeys import LMCACHE_SALT_PARAM, lmcache_params, lmcache_salt_tag

#: Sent to the prefill engine: "compute the prompt, keep its KV for a remote decode".
PREFILL_KV_PARAMS: Mapping[str, Any] = MappingProxyType(
    {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
)

#: Sent to the decode engine when the prefill response carried no `kv_transfer_params`.
DEFAULT_DECODE_KV_PARAMS: Mapping[str, Any] = MappingProxyType(
    {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
)

_DROPPED_FOR_PREFILL = ("stream_options", "max_completion_tokens", "min_tokens")


def lmcache_tagged(body: dict[str, Any], *, adapter: str | None = None, salt: str | None = None) -> None:
    """Tag `body` (the gateway's own copy; a client's `kv_transfer_params` never gets this far,
    `tandem.router.request.parse`) for LMCache engines: its LMCache keys carry `adapter` and `salt`
    (the tenant's `cache_salt`); a body with neither is left as it is."""
    params = lmcache_params(adapter=adapter, salt=salt)
    if params:
        body["kv_transfer_params"] = params


def _lmcache_configs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The `lmcache.*` entries of the body's `kv_transfer_params` (module docstring, 5)."""
    params = body.get("kv_transfer_params")
    if not isinstance(params, Mapping):
        return {}
    return {k: v for k, v in params.items() if isinstance(k, str) and k.startswith("lmcache.")}


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill request for a client body (completions or chat); `body` is not modified."""
    out = {k: v for k, v in body.items() if k not in _DROPPED_FOR_PREFILL}
    out["max_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = {**_lmcache_configs(body), **PREFILL_KV_PARAMS}
    return out


def kv_params_from_prefill(response: object) -> dict[str, Any]:
    """The `kv_transfer_params` to hand to decode, from the prefill engine's parsed JSON response:
    its top-level `kv_transfer_params` when that is an object, else `DEFAULT_DECODE_KV_PARAMS`."""
    if isinstance(response, Mapping):
        params = response.get("kv_transfer_params")
        if isinstance(params, Mapping):
            return dict(params)
    return dict(DEFAULT_DECODE_KV_PARAMS)


def away_from_layout_body(body: Mapping[str, Any], prefill_layout: str) -> dict[str, Any]:
    """The client's body for a decode-only request whose prompt a prefill engine of
    `prefill_layout` wrote to the pool (module docstring, 4): `cache_salt` replaced by
    `kv-layout-<16 hex digits of SHA-256(salt, layout)>`. Example: no salt, layout `g1` → always the
    same salt for `g1`, another for `g2`."""
    salt = body.get("cache_salt")
    seed = f"{salt if isinstance(salt, str) else ''}\x00{prefill_layout}".encode()
    out = dict(body)
    out["cache_salt"] = "kv-layout-" + hashlib.sha256(seed).hexdigest()[:16]
    configs = _lmcache_configs(body)
    if configs:  # tagged for LMCache engines, whose keys hold the salt only as a tag
        out["kv_transfer_params"] = {**configs, LMCACHE_SALT_PARAM: lmcache_salt_tag(out["cache_salt"])}
    return out


def decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The decode request: the client's body unchanged except for `kv_transfer_params` (with the
    body's LMCache configs, module docstring, 5)."""
    out = dict(body)
    out["kv_transfer_params"] = {**_lmcache_configs(body), **kv_transfer_params}
    return out
