"""Build a tiny LoRA adapter for the tiny model (`tandem.local.tiny_model`), so that real vLLM serves
adapters without downloading anything.

What is built (deterministic for a given model, rank and seed): a PEFT adapter directory,
`adapter_config.json` plus `adapter_model.safetensors`, as `peft` writes it, with LoRA on every
linear layer of every decoder layer (`q_proj k_proj v_proj o_proj gate_proj up_proj down_proj`;
not the tied embeddings). Tensor names are PEFT's, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` (`[rank, in]`) and `...lora_B.weight`
(`[out, rank]`), in float32 (PEFT keeps adapter weights in float32; vLLM casts them to the model's
dtype when it loads them). `target_modules` is written sorted, so that a rebuild writes the same bytes.

PEFT initialises `lora_B` to zero, which makes a fresh adapter the identity. Here both A and B are
drawn from a seeded normal distribution with standard deviation `WEIGHT_STD`, so that the adapter
visibly changes greedy outputs: the update `ΔW = (alpha / r)·B·A` has entries of standard deviation
`(alpha / r)·sqrt(r)·WEIGHT_STD²`, e.g. for r = 8, alpha = 16: 2 × 2.83 × 0.04 ≈ 0.23, as large as
the base weights (`tiny_model.INIT_STD` = 0.2), so different adapters (different seeds) and the
base model pick different tokens.

`base_model_name_or_path` is the model as vLLM is started with it (`--model`): vLLM's filesystem
resolver (`VLLM_PLUGINS=lora_filesystem_resolver`) loads an adapter only when the two strings are
equal (`vllm/plugins/lora_resolvers/filesystem_resolver.py`).

`torch`, `transformers`, `peft` and `safetensors` are imported inside `build`: only .venv-vllm has them
(scripts/bootstrap.sh installs `peft` there).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The tiny model's linear layers that get an adapter (every projection of a Qwen2 decoder layer).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Standard deviation of the random A and B weights (see the module docstring for the update's size).
WEIGHT_STD = 0.2
#: Ranks the builder accepts: vLLM's `--max-lora-rank` values up to 64 (an adapter of rank r needs
#: `--max-lora-rank` >= r; the tiny model's layers are 128 to 512 wide).
RANKS = (1, 8, 16, 32, 64)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def build(
    directory: Path, *, model: Path, rank: int = 8, seed: int = 0, base_name: str | None = None
) -> Path:
    """Write a LoRA adapter of `rank` for the model in `model` into `directory` (created if needed);
    returns it. `base_name`: the adapter's `base_model_name_or_path`, by default `model` made
    absolute. Raises `ValueError` for a rank not in `RANKS` or a model directory without config.json."""
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {', '.join(map(str, RANKS))}, got {rank}")
    if not (model / "config.json").is_file():
        raise ValueError(f"{model} holds no config.json (build it with `tandem dev tiny-model {model}`)")
    import torch
    from peft import LoraConfig, get_peft_model  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM

    base = base_name if base_name is not None else str(model.resolve())
    directory.mkdir(parents=True, exist_ok=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        bias="none",
        target_modules=list(TARGET_MODULES),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
    )
    adapted = get_peft_model(loaded, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(adapted.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * WEIGHT_STD
                parameter.copy_(drawn.to(parameter.dtype))
    adapted.save_pretrained(str(directory), save_embedding_layers=False)
    _finish_config(directory / CONFIG_FILE, base)
    (directory / "README.md").unlink(missing_ok=True)  # PEFT's empty model card
    return directory


def _finish_config(path: Path, base: str) -> None:
    """Make sure `base_model_name_or_path` is `base` (PEFT may fill in the loaded model's own path),
    and list `target_modules` sorted (PEFT writes a set, in hash order)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data["base_model_name_or_path"] = base
    data["target_modules"] = sorted(data.get("target_modules") or TARGET_MODULES)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
