"""`SimSettings`: every setting of one simulated engine, validated once at start-up.

Field names match the `tandem sim` flags (`max_num_seqs` is `--max-num-seqs`). Fields left unset
(or None) that a profile knows are filled from it: `model` (the profile's model id),
`served_model_name` (= model) and `max_model_len`.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tandem.sim.engine.core import EngineConfig
from tandem.sim.engine.kvlayout import DEFAULT_BYTES_SCALE, PoolLayout
from tandem.sim.engine.lora import LoRAConfig
from tandem.sim.engine.profiles import PROFILES, Profile, get_profile
from tandem.sim.engine.scheduler import SchedulerConfig

KVRole = Literal["none", "producer", "consumer", "both"]
KVEventsEncoding = Literal["array", "map"]
#: vLLM's `MaxLoRARanks` (`vllm/config/lora.py`), the values `--max-lora-rank` accepts.
MaxLoRARank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
_ZMQ_ADDRESS = r"^(tcp|ipc|inproc)://\S+$"
DEFAULT_PROFILE = "qwen2.5-7b-h100"


class LoRAModule(BaseModel):
    """One `--lora-modules` entry (vLLM's `LoRAModulePath`): an adapter served from the start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    base_model_name: str | None = None


def parse_lora_module(item: str) -> LoRAModule:
    """One `--lora-modules` value as vLLM's `LoRAParserAction` reads it: `name=path` when it has an
    `=` and no comma, else a JSON object `{"name", "path"[, "base_model_name"]}`. Raises ValueError
    with vLLM's wording. Example: `sql=/adapters/sql` → name "sql", path "/adapters/sql"."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return LoRAModule(name=name, path=path)
    try:
        fields = json.loads(item)
    except json.JSONDecodeError:
        raise ValueError(f"Invalid JSON format for --lora-modules: {item}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"Invalid fields for --lora-modules: {item} - expected a JSON object")
    try:
        return LoRAModule.model_validate(fields)
    except ValidationError as exc:
        raise ValueError(f"Invalid fields for --lora-modules: {item} - {exc.errors()[0]['msg']}") from None


class SimSettings(BaseModel):
    """One engine's settings. Sizes are tokens unless named blocks or bytes; `time_scale` is
    simulated seconds per wall second."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = Field(default=DEFAULT_PROFILE, description="Model/GPU profile (--list-profiles).")
    model: str = Field(default="", min_length=1, description="Model name, as used in KV pool keys.")
    served_model_name: str = Field(default="", min_length=1, description="Name clients send.")
    max_model_len: int = Field(default=0, ge=16, le=1_048_576, description="Context limit, tokens.")
    max_num_seqs: int = Field(default=256, ge=1, le=65_536)
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=1_048_576)
    block_size: int = Field(default=16, ge=1, le=1024, description="Tokens per KV block.")
    num_gpu_blocks: int | None = Field(default=None, ge=1, description="Overrides the profile's.")
    time_scale: float = Field(default=1.0, gt=0, le=1_000_000)
    kv_role: KVRole = "none"
    kv_pool: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://")
    kv_chunk_size: int = Field(default=256, ge=1, le=65_536)
    kv_bytes_scale: float = Field(default=DEFAULT_BYTES_SCALE, gt=0, le=1)
    kv_generation: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The engine's KV generation: chunks another generation wrote are told apart.",
    )
    kv_layout: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The engine's KV layout (its pod's tandem.dev/kv-layout), put in its pool keys' "
        "scope as Tandem's connector does: engines of two layouts share no chunk.",
    )
    seed: int | None = Field(default=None, description="Seeds unseeded sampling (None: random).")
    kv_events_endpoint: str | None = Field(
        default=None, pattern=_ZMQ_ADDRESS, description="ZMQ PUB address to bind for KV events."
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None, pattern=_ZMQ_ADDRESS, description="ZMQ ROUTER address to bind for replays."
    )
    kv_events_topic: str = Field(default="", description="Topic frame of every KV-event message.")
    otlp_traces_endpoint: str | None = Field(
        default=None,
        description="Where vLLM's llm_request spans go (OTLP; file://DIR: JSON lines, Tandem's own).",
    )
    kv_events_encoding: KVEventsEncoding = "map"
    kv_events_buffer_steps: int = Field(default=10_000, ge=1, le=10_000_000)
    enable_lora: bool = Field(default=False, description="Serve LoRA adapters (vLLM's --enable-lora).")
    max_loras: int = Field(default=1, ge=1, le=1024, description="Most distinct adapters in one batch.")
    max_lora_rank: MaxLoRARank = 16
    max_cpu_loras: int | None = Field(
        default=None, ge=1, description="Adapters kept in CPU memory (None: max_loras); >= max_loras."
    )
    lora_modules: tuple[LoRAModule, ...] = Field(
        default=(), description="Adapters served from the start: `name=path` or JSON, as vLLM's."
    )
    api_key: str | None = Field(
        default=None,
        min_length=1,
        repr=False,
        description="Key /v1/* requires as `Authorization: Bearer <key>` (vLLM's --api-key); None: open.",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, value: object) -> object:
        return value or None  # as vLLM: an empty key requires nothing

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _parse_lora_modules(cls, value: object) -> object:
        """Strings in vLLM's two forms (`parse_lora_module`); empty ones are skipped, as vLLM does."""
        items = [value] if isinstance(value, str | dict) else value
        if not isinstance(items, list | tuple):
            return value
        return tuple(parse_lora_module(i) if isinstance(i, str) else i for i in items if i not in (None, ""))

    @model_validator(mode="before")
    @classmethod
    def _fill_from_profile(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        profile = PROFILES.get(data.get("profile") or DEFAULT_PROFILE)
        if profile is None:
            return data  # the `profile` field reports it
        filled = {key: value for key, value in data.items() if value is not None}
        filled.setdefault("model", profile.model.model_id)
        filled.setdefault("served_model_name", filled["model"])
        filled.setdefault("max_model_len", profile.max_model_len)
        return filled

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"unknown profile {value!r}; known: {', '.join(sorted(PROFILES))}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kv_chunk_size % self.block_size:
            raise ValueError(
                f"--kv-chunk-size ({self.kv_chunk_size}) must be a multiple of "
                f"--block-size ({self.block_size})"
            )
        if self.kv_role != "none" and self.kv_pool is None:
            raise ValueError(f"--kv-role {self.kv_role} needs --kv-pool redis://HOST:PORT")
        if self.kv_events_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}).")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora (LoRA is not enabled)")
        capacity = self.total_gpu_blocks * self.block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"--max-model-len ({self.max_model_len}) is larger than the KV cache "
                f"({self.total_gpu_blocks} blocks x {self.block_size} = {capacity} tokens): "
                "lower it or raise --num-gpu-blocks"
            )
        return self

    @property
    def engine_profile(self) -> Profile:
        return get_profile(self.profile)

    @property
    def total_gpu_blocks(self) -> int:
        """KV blocks of the engine: the override, else what fits the profile's KV cache."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        return self.engine_profile.num_gpu_blocks(self.block_size)

    @property
    def produces_kv(self) -> bool:
        return self.kv_role in ("producer", "both")

    @property
    def consumes_kv(self) -> bool:
        return self.kv_role in ("consumer", "both")

    def lora_config(self) -> LoRAConfig | None:
        """The LoRA limits with `--enable-lora`, else None; `max_cpu_loras` defaults to `max_loras`."""
        if not self.enable_lora:
            return None
        cpu = self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
        return LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, max_cpu_loras=cpu)

    def engine_config(self) -> EngineConfig:
        lora = self.lora_config()
        return EngineConfig(
            profile=self.engine_profile,
            num_gpu_blocks=self.total_gpu_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_loras=lora.max_loras if lora is not None else None,
            ),
            lora=lora,
        )

    def pool_layout(self, *, key: bytes | None = None) -> PoolLayout:
        """The pool layout of these settings, keyed with the pool key `key` (None: unkeyed)."""
        return PoolLayout(
            model_name=self.model,
            shape=self.engine_profile.model,
            chunk_size=self.kv_chunk_size,
            bytes_scale=self.kv_bytes_scale,
            generation=self.kv_generation,
            key=key,
        )
