"""The gateway's `router ready` line says what encodes prompts: fastokens for a byte-level BPE it
matched at load time, Hugging Face with the reason for a tokenizer fastokens cannot load; either
serves a request. A policy that never reads the prompt never tokenizes it.

Real: the gateway on loopback, `tokenizers`, `fastokens`, tokenizer files trained by the tests
(tests/core/tokenizer_files.py). Faked: the engine (tests/router/fake_engine.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.core.tokenizer_files import write_metaspace, write_qwen2
from tests.router.harness import MODEL, Launcher, router_config

from tandem.core.tokenizer_files import load_tokenizer


async def ready_line(
    launcher: Launcher, directory: Path, caplog: pytest.LogCaptureFixture
) -> logging.LogRecord:
    engine = await launcher.engine("d0")
    config = router_config(decode=[engine.url]).model_copy(update={"tokenizer_path": str(directory)})
    with caplog.at_level(logging.INFO):
        router = await launcher.router_for(config)
    prompt = "A system prompt.\n\nQuestion: <|im_start|> why?"
    answer = await router.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}
    )
    assert answer.status_code == 200
    [line] = [r for r in caplog.records if r.getMessage() == "router ready"]
    return line


async def test_the_ready_line_names_fastokens_for_a_qwen2_tokenizer(
    launcher: Launcher, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = await ready_line(launcher, write_qwen2(tmp_path, vocab=600), caplog)
    assert line.__dict__["tokenizer_backend"].startswith("fastokens ")
    assert line.__dict__["tokenizer_fast_refused"] is None


async def test_the_ready_line_says_why_hugging_face_encodes_a_metaspace_tokenizer(
    launcher: Launcher, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = await ready_line(launcher, write_metaspace(tmp_path), caplog)
    assert line.__dict__["tokenizer_backend"].startswith("tokenizers ")
    assert "cannot load this tokenizer" in line.__dict__["tokenizer_fast_refused"]
    assert load_tokenizer(tmp_path).fast_refused == line.__dict__["tokenizer_fast_refused"]


@pytest.mark.parametrize(
    ("policy", "mode", "counted"),
    [("round-robin", "auto", False), ("round-robin", "off", False), ("tandem", "auto", True)],
)
async def test_a_policy_that_never_reads_the_prompt_never_tokenizes_it(
    launcher: Launcher, caplog: pytest.LogCaptureFixture, policy: str, mode: str, counted: bool
) -> None:
    """Round robin with no prefill pool, whatever the P/D mode: the request's log line has no
    `prompt_tokens` (they are counted only when something reads them); the `tandem` policy reads them."""
    engine = await launcher.engine("d0")
    config = router_config(decode=[engine.url], mode=mode, spec={"router": {"policy": policy}})  # type: ignore[arg-type]
    router = await launcher.router_for(config)
    with caplog.at_level(logging.INFO, logger="tandem.router"):
        answer = await router.http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Count me? " * 50}],
                "max_tokens": 2,
            },
        )
    assert answer.status_code == 200
    [line] = [r for r in caplog.records if r.getMessage() == "request"]
    assert ("prompt_tokens" in line.__dict__) is counted
