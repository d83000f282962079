"""`SimSettings`: every setting of one simulated engine, validated once at start-up.

Field names match the `tandem sim` flags (`max_num_seqs` is `--max-num-seqs`). Fields left unset
(or None) that a profile knows are filled from it: `model` (the profile's model id),
`served_model_name` (= model) and `max_model_len`.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tandem.sim.engine.core import EngineConfig
from tandem.sim.engine.kvlayout import DEFAULT_BYTES_SCALE, PoolLayout
from tandem.sim.engine.profiles import PROFILES, Profile, get_profile
from tandem.sim.engine.scheduler import SchedulerConfig

KVRole = Literal["none", "producer", "consumer", "both"]
KVEventsEncoding = Literal["array", "map"]
_ZMQ_ADDRESS = r"^(tcp|ipc|inproc)://\S+$"
DEFAULT_PROFILE = "qwen2.5-7b-h100"


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
    seed: int | None = Field(default=None, description="Seeds unseeded sampling (None: random).")
    kv_events_endpoint: str | None = Field(
        default=None, pattern=_ZMQ_ADDRESS, description="ZMQ PUB address to bind for KV events."
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None, pattern=_ZMQ_ADDRESS, description="ZMQ ROUTER address to bind for replays."
    )
    kv_events_topic: str = Field(default="", description="Topic frame of every KV-event message.")
    kv_events_encoding: KVEventsEncoding = "map"
    kv_events_buffer_steps: int = Field(default=10_000, ge=1, le=10_000_000)
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

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            profile=self.engine_profile,
            num_gpu_blocks=self.total_gpu_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens
            ),
        )

    def pool_layout(self, *, key: bytes | None = None) -> PoolLayout:
        """The pool layout of these settings, keyed with the pool key `key` (None: unkeyed)."""
        return PoolLayout(
            model_name=self.model,
            shape=self.engine_profile.model,
            chunk_size=self.kv_chunk_size,
            bytes_scale=self.kv_bytes_scale,
            key=key,
        )
