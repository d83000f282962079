"""Build a tiny Qwen2 model on this machine, so real vLLM runs without downloading anything.

What is built (deterministic for a given seed):
- a byte-level BPE tokenizer, vocabulary 4096, trained here on the Python standard library's `*.py`
  files, with Qwen2's pre-tokenizer (its split regex, then byte-level without a regex of its own:
  `transformers` loads every `qwen2` model's tokenizer as `Qwen2Tokenizer`, which installs exactly
  this pre-tokenizer whatever `tokenizer.json` says, so `tokenizer.json` must say the same for a
  reader of the file, such as the gateway, to get vLLM's ids), with the specials `<|endoftext|>`,
  `<|im_start|>`, `<|im_end|>`, `<|pad|>` and a ChatML chat template (as Qwen2 chat models use);
- `Qwen2ForCausalLM` with hidden size 256, intermediate 512, 2 layers, 4 attention heads, 2 KV heads,
  head dim 64, tied embeddings, bf16, weights drawn from a seeded normal distribution. Its KV is 1 KiB
  per token (2 layers × K and V × 2 heads × 64 × 2 bytes), so a 256-token chunk is 256 KiB.

The weights are random: the model produces fluent-looking nonsense, but deterministically, which is
what P/D identity checks need. `transformers` and `torch` are imported inside `build` because only
the `vllm-cpu` extra installs them (`tokenizers`, inside `train_tokenizer`, is the gateway's own).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
MAX_POSITIONS = 4096
#: Qwen2's pre-tokenization split (contractions, letters with one leading non-letter, single digits,
#: punctuation runs with trailing newlines, newline runs, other whitespace).
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
#: Standard deviation of the random weights: large enough that greedy decoding has clear winners
#: (the default 0.02 gives near-flat logits, where bf16 rounding decides ties).
INIT_STD = 0.2


def corpus_files(limit: int = 400) -> list[Path]:
    """The training corpus: the first `limit` standard-library modules, in name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))[:limit]


def _texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(texts: Iterable[str], *, vocab: int = VOCAB_SIZE) -> Any:
    """The tiny model's kind of tokenizer (a `tokenizers.Tokenizer`): Qwen2's split regex, then
    byte-level without a regex of its own, the four `SPECIAL_TOKENS`, BPE trained on `texts` up to
    `vocab` ids. Tests train larger ones the same way (tests/core/tokenizer_files.py)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build(directory: Path, *, seed: int = 0) -> Path:
    """Write tokenizer and model files into `directory` (created if needed); returns it."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(_texts(corpus_files()))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(directory)
    eos = int(fast.convert_tokens_to_ids("<|im_end|>"))
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
        bos_token_id=int(fast.convert_tokens_to_ids("<|endoftext|>")),
        eos_token_id=eos,
        pad_token_id=int(fast.convert_tokens_to_ids("<|pad|>")),
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(directory)
    return directory
