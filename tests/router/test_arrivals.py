"""The arrival counters the autoscaler reads: every generation request past the rate limits is counted
as it arrives, with its prompt tokens (exact when the prefill pool autoscales)."""

from __future__ import annotations

from tests.router.harness import MODEL, Launcher, metric


async def test_arrivals_and_their_prompt_tokens_are_counted(launcher: Launcher) -> None:
    decode = await launcher.engine("d0")
    router = await launcher.router(
        decode=[decode], spec={"prefill": {"replicas": 1, "autoscaling": {"enabled": True}}}
    )
    await router.openai.completions.create(model=MODEL, prompt="one two three", max_tokens=1)
    first = await metric(router, "tandem_router_arrival_prompt_tokens_total")
    await router.openai.completions.create(model=MODEL, prompt="one two three " * 20, max_tokens=1)
    both = await metric(router, "tandem_router_arrival_prompt_tokens_total")
    assert await metric(router, "tandem_router_arrivals_total") == 2
    assert first is not None and both is not None
    assert first > 0 and both - first > 10 * first  # the second prompt is 20 times the first
