"""The adapters an engine serves, as vLLM 0.32's API server keeps them (`OpenAIServingModels`).

An adapter is a directory holding a PEFT `adapter_config.json`; the simulator reads `r` (the rank),
`lora_alpha`, `target_modules` (required, as vLLM's `PEFTHelper`), `peft_type` and
`base_model_name_or_path` (the resolver's checks), and no weights. Adapters come from
`--lora-modules` (checked when the app is built: a bad one stops start-up, as vLLM's
`init_static_loras` does), from `POST /v1/load_lora_adapter` and from the filesystem resolver
(`VLLM_PLUGINS`, `VLLM_LORA_RESOLVER_CACHE_DIR`; only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, as in
vLLM's `_check_model`). Each gets the next integer id (1, 2, ...; a resolver lookup takes one even
when it finds nothing, as vLLM's counter does). Loading hands the adapter to the engine core
(`EngineCore.add_lora`), which charges the disk read to its clock.

The messages and status codes are vLLM 0.32's (`vllm/entrypoints/openai/models/serving.py`,
`vllm/lora/worker_manager.py`, `vllm/lora/peft_helper.py`); engine-side failures are 500s whose
message starts "Call to add_lora method failed: ", as vLLM's engine-core client wraps them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.sim.engine.core import EngineCore
from tandem.sim.engine.lora import LoRARef

RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
PLUGINS_ENV = "VLLM_PLUGINS"
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
FILESYSTEM_RESOLVER = "lora_filesystem_resolver"
_REQUIRED = ("r", "lora_alpha", "target_modules")
_ENGINE_FAILED = "Call to add_lora method failed: "
_NOT_ENABLED = "LoRA is not enabled. Use --enable-lora to enable LoRA."
_SERVER_ERROR = "InternalServerError"


class LoRAError(Exception):
    """A LoRA operation vLLM answers with an error: HTTP `status`, vLLM's `err_type` and message."""

    def __init__(self, status: int, message: str, err_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": None, "code": self.status}}


@dataclass(frozen=True)
class LoRAEnv:
    """The environment variables vLLM reads for LoRA, read once by the composition root.
    `runtime_updating`: `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is `1` or `true` (any case);
    `resolver_dir`: the filesystem resolver's directory when `VLLM_PLUGINS` is unset (vLLM then loads
    every plugin) or lists `lora_filesystem_resolver`, and `VLLM_LORA_RESOLVER_CACHE_DIR` is set."""

    runtime_updating: bool = False
    resolver_dir: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> LoRAEnv:
        """Raises ValueError (vLLM's start-up error) when the resolver's directory is not one."""
        runtime = environ.get(RUNTIME_ENV, "0").strip().lower() in ("1", "true")
        plugins = environ.get(PLUGINS_ENV)
        allowed = plugins is None or FILESYSTEM_RESOLVER in plugins.split(",")
        cache_dir = environ.get(RESOLVER_DIR_ENV) or None
        if not allowed or cache_dir is None:
            return cls(runtime_updating=runtime)
        if not os.path.isdir(cache_dir):
            raise ValueError(
                f"{RESOLVER_DIR_ENV} must be set to a valid directory "
                "for Filesystem Resolver plugin to function"
            )
        return cls(runtime_updating=runtime, resolver_dir=cache_dir)


@dataclass(frozen=True)
class Adapter:
    """A served adapter: what requests run under (`ref`) and what `/v1/models` shows."""

    ref: LoRARef
    base_model_name: str | None


class AdapterRegistry:
    """The served adapters by name (module docstring). Not thread-safe; every call is synchronous
    (an adapter config is a small local file), so no two loads interleave."""

    def __init__(
        self, *, base_model: str, served_model: str, max_lora_rank: int | None, bytes_per_rank: float
    ) -> None:
        self.base_model = base_model
        self.served_model = served_model
        self.max_lora_rank = max_lora_rank  # None: LoRA is not enabled
        self._bytes_per_rank = bytes_per_rank
        self._adapters: dict[str, Adapter] = {}
        self._last_id = 0

    def __len__(self) -> int:
        return len(self._adapters)

    def adapters(self) -> list[Adapter]:
        return list(self._adapters.values())

    def get(self, name: str | None) -> LoRARef | None:
        adapter = self._adapters.get(name) if name is not None else None
        return adapter.ref if adapter is not None else None

    def load(
        self,
        name: str,
        path: str,
        *,
        core: EngineCore | None,
        load_inplace: bool = False,
        base_model_name: str | None = None,
    ) -> str:
        """`/v1/load_lora_adapter` (and `--lora-modules` with `core` None: checked now, handed to the
        engine when it starts). Returns vLLM's success text; raises LoRAError."""
        if not name or not path:
            raise LoRAError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.served_model:
            raise LoRAError(
                400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput"
            )
        previous = self._adapters.get(name)
        if previous is not None and not load_inplace:
            raise LoRAError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        int_id = previous.ref.int_id if previous is not None else self._next_id()
        ref = self._read(name, path, int_id=int_id)
        if core is not None:
            core.add_lora(ref, reload=previous is not None)
        parent = base_model_name if base_model_name == self.served_model else None
        self._adapters[name] = Adapter(ref, parent)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        """`/v1/unload_lora_adapter`: forget the adapter (vLLM 0.32 leaves its weights cached in the
        engine until evicted; requests already running under it finish under it)."""
        if not name:
            raise LoRAError(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
            )
        if name not in self._adapters:
            raise LoRAError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self._adapters[name]
        return f"Success: LoRA adapter '{name}' removed successfully."

    def resolve(self, name: str, *, resolver_dir: str | None, core: EngineCore) -> LoRARef | None:
        """vLLM's `resolve_lora` with the filesystem resolver: `<resolver_dir>/<name>` with an
        `adapter_config.json` whose `peft_type` is `LORA` and whose `base_model_name_or_path` is the
        engine's `--model` is loaded and served; None when there is no such adapter. A found adapter
        that does not load is vLLM's 400 "LoRA adapter 'x' was found but could not be loaded."."""
        loaded = self.get(name)
        if loaded is not None:
            return loaded
        int_id = self._next_id()
        path = _inside(resolver_dir, name) if resolver_dir is not None else None
        config = _read_config(path) if path is not None else None
        if config is None or config.get("peft_type") != "LORA":
            return None
        if config.get("base_model_name_or_path") != self.base_model:
            return None
        try:
            ref = self._read(name, path or "", int_id=int_id)
            core.add_lora(ref)
        except (LoRAError, ValueError):
            raise LoRAError(
                400, f"LoRA adapter '{name}' was found but could not be loaded.", "BadRequestError"
            ) from None
        self._adapters[name] = Adapter(ref, None)
        return ref

    def cards(self, *, created: int) -> list[dict[str, Any]]:
        """The adapters' `/v1/models` entries, in load order (vLLM's `ModelCard`: `root` the path,
        `parent` the base model's served name)."""
        return [
            {
                "id": adapter.ref.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": adapter.ref.path,
                "parent": adapter.base_model_name or self.served_model,
                "max_model_len": None,
            }
            for adapter in self._adapters.values()
        ]

    def _next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def _read(self, name: str, path: str, *, int_id: int) -> LoRARef:
        """The adapter at `path`, checked as vLLM's worker checks it before loading weights."""
        if self.max_lora_rank is None:
            raise LoRAError(
                500,
                _ENGINE_FAILED + _NOT_ENABLED,
                _SERVER_ERROR,
            )
        try:
            with open(
                os.path.join(os.path.expanduser(path), "adapter_config.json"), encoding="utf-8"
            ) as file:
                text = file.read()
        except (FileNotFoundError, NotADirectoryError):
            raise LoRAError(
                404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError"
            ) from None
        rank = _rank(text)
        if rank > self.max_lora_rank:
            message = f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            raise LoRAError(500, _ENGINE_FAILED + message, _SERVER_ERROR)
        return LoRARef(name=name, int_id=int_id, path=path, rank=rank, nbytes=rank * self._bytes_per_rank)


def _rank(text: str) -> int:
    """`r` of an adapter config, after vLLM's `PEFTHelper.from_dict` checks; raises LoRAError (500)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoRAError(500, _ENGINE_FAILED + str(exc), _SERVER_ERROR) from None
    if not isinstance(config, dict):
        raise LoRAError(500, _ENGINE_FAILED + "adapter_config.json is not a JSON object", _SERVER_ERROR)
    missing = sorted(set(_REQUIRED) - set(config))
    if missing:
        fields = "{" + ", ".join(repr(m) for m in missing) + "}"
        raise LoRAError(
            500, _ENGINE_FAILED + f"Missing required configuration fields: {fields}", _SERVER_ERROR
        )
    rank = config["r"]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoRAError(
            500, _ENGINE_FAILED + f"LoRA rank must be a positive integer: {rank!r}", _SERVER_ERROR
        )
    return rank


def _inside(root: str, name: str) -> str | None:
    """`<root>/<name>` when `name` is one path component (vLLM joins the two as they are; the
    simulator refuses names such as `../x` or `a/b` that would name another directory). The entry may
    be a link: `tandem up` links each adapter into the resolver's folder."""
    if name in ("", ".", "..") or "/" in name or os.sep in name or "\x00" in name:
        return None
    return os.path.join(root, name)


def _read_config(path: str) -> dict[str, Any] | None:
    """The adapter config in `path`, or None when there is none or it is not a JSON object."""
    try:
        with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
