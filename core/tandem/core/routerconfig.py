"""The gateway's configuration file: what the operator (a ConfigMap) and `tandem up` (a file) hand to
`tandem router --config FILE`.

It carries the InferenceService spec itself (the router reads its `router`, `disaggregation` and `kvPool`
sections) plus where to find the engines. Living in `tandem.core` lets the operator and the local
runtime write it without importing the router.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from tandem.core.adapters import MAX_CATALOG_ENTRIES
from tandem.core.files import replace_text
from tandem.core.kvevents import KVEventsAddresses
from tandem.core.spec import ADAPTER_NAME_PATTERN, DNS_LABEL_PATTERN, InferenceServiceSpec, SpecModel

EngineURL = Annotated[str, Field(pattern=r"^https?://[^/\s]+/?$")]


class StaticDiscovery(SpecModel):
    """Fixed engine base URLs, e.g. `http://127.0.0.1:8101`."""

    kind: Literal["static"] = "static"
    prefill: list[EngineURL] = Field(default_factory=list)
    decode: list[EngineURL] = Field(min_length=1)


class KubernetesDiscovery(SpecModel):
    """Engines found through the EndpointSlices of each pool's headless Service."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(pattern=DNS_LABEL_PATTERN)
    prefill_service: str = Field(pattern=DNS_LABEL_PATTERN)
    decode_service: str = Field(pattern=DNS_LABEL_PATTERN)
    port: int = Field(default=8000, ge=1, le=65535)


class FileDiscovery(SpecModel):
    """Engines listed in a file (an `EndpointList` in JSON) that the router re-reads when it
    changes. The local runtime writes it as the autoscaler starts and drains engines."""

    kind: Literal["file"] = "file"
    path: str = Field(min_length=1, description="The endpoint file (absolute, or relative to the cwd).")
    poll_seconds: float = Field(default=0.5, gt=0, le=60, description="How often the file is checked.")


class EndpointList(SpecModel):
    """Contents of a `kind: file` discovery's file: the ready engines of each pool."""

    prefill: list[EngineURL] = Field(default_factory=list)
    decode: list[EngineURL] = Field(default_factory=list)


def write_endpoint_file(path: Path, endpoints: EndpointList) -> None:
    """Replace `path` atomically (`tandem.core.files.replace_text`), so a reader sees the old list or
    the new one, never half a file."""
    replace_text(path, endpoints.model_dump_json(by_alias=True, indent=2) + "\n")


def read_endpoint_file(path: Path) -> EndpointList:
    """Parse an endpoint file. Raises OSError when it cannot be read and ValueError (pydantic's
    ValidationError included) when it is not an `EndpointList` in JSON."""
    return EndpointList.model_validate_json(path.read_bytes())


class EngineKVKeys(SpecModel):
    """What vLLM engines put in their KV-pool chunk keys that the spec does not say, written by whoever
    starts them (the operator, `tandem up`), so the gateway computes the same keys for its pool
    look-ups (docs/router.md, 'Barrier')."""

    connector: Literal["tandem", "lmcache"] = Field(
        description="The KV connector the engines run (the local runtime runs Tandem's where the spec "
        "says lmcache)."
    )
    model: str = Field(
        min_length=1,
        description="The model part of the keys: spec.model.name for Tandem's connector; vLLM's model "
        "argument (model_config.model: a path, a Hugging Face id) for LMCache's.",
    )
    python_hash_seed: str | None = Field(
        default=None,
        description="The engines' PYTHONHASHSEED, from which LMCache's chunk hashes start; unset: none "
        "(LMCache's keys are then random per process).",
    )


class RouterConfig(SpecModel):
    """Everything one gateway process needs besides its listen address."""

    service: str = Field(min_length=1, description="Name of the InferenceService this gateway fronts.")
    spec: InferenceServiceSpec
    discovery: StaticDiscovery | KubernetesDiscovery | FileDiscovery = Field(discriminator="kind")
    kv_pool_url: str | None = Field(
        default=None, pattern=r"^(redis|rediss|unix)://", description="The KV pool's Redis URL."
    )
    api_keys_file: str | None = Field(
        default=None,
        min_length=1,
        description="API key table (`key: tenant` lines; the mounted apiKeysSecret). Given: every /v1 "
        "request needs a key from it (docs/security.md).",
    )
    tokenizer_path: str | None = Field(
        default=None,
        min_length=1,
        description="Directory holding the model's tokenizer.json (and tokenizer_config.json): the "
        "gateway counts and hashes prompts in the model's own tokens. Unset: the simulator's tokenizer, "
        "exact for engine.kind sim and an estimate for real engines (docs/router.md, 'Prompt tokens').",
    )
    engine_kv_keys: EngineKVKeys | None = Field(
        default=None,
        description="How the vLLM engines name KV-pool chunks beyond the spec; unset: the spec's "
        "kvPool.connector, and with LMCache's no pool look-ups.",
    )
    kv_layout_in_keys: bool = Field(
        default=False,
        description="The engines put their KV layout (their pods' tandem.dev/kv-layout) in their pool "
        "keys' scope (the operator's engines with Tandem's connector or the simulator): the gateway's "
        "look-ups and KV barrier use the decode endpoint's layout too.",
    )
    adapter_names: list[Annotated[str, Field(pattern=ADAPTER_NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=MAX_CATALOG_ENTRIES,
        description="LoRA adapters the engines resolve beyond spec.adapters (a local catalog's: "
        "`tandem.local.plan.build_plan` writes the names it is given); the gateway accepts them as models.",
    )
    adapter_names_file: str | None = Field(
        default=None,
        min_length=1,
        description="A names.json (`tandem.core.adapternames`) listing the service's LoRA adapters, "
        "re-read while the gateway runs: adapters added or removed there are served or refused without "
        "a restart. The operator's gateways mount it (ConfigMap <service>-adapter-names); given, the "
        "gateway's adapters are its names together with spec.adapters' and adapterNames.",
    )
    adapter_load_dir: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^/",
        description="The absolute directory on the engines in which their filesystem resolver finds each "
        "LoRA adapter by name (VLLM_LORA_RESOLVER_CACHE_DIR); given, the gateway loads a hot adapter onto "
        "another engine through vLLM's runtime API (/v1/load_lora_adapter) before sending it requests "
        "there, instead of a request waiting for the load. The engines need "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING.",
    )
    kv_events: KVEventsAddresses | None = Field(
        default=None,
        description="Where each engine publishes KV events (spec.router.prefixSource: precise), as "
        "templates over its base URL; unset: `tcp://{host}:<--kv-events-port>`.",
    )
