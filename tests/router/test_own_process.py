"""A gateway that owns its process (`tandem router` and its workers) moves the objects alive after
start-up out of the cyclic collector's reach; one built by tests or an embedding application leaves
the process's collector alone (`tandem.router.app`)."""

from __future__ import annotations

import gc

import pytest
from tests.router.harness import MODEL, Launcher


@pytest.mark.parametrize("own_process", [True, False], ids=["own-process", "embedded"])
async def test_start_up_freezes_the_long_lived_objects_only_in_a_process_of_its_own(
    launcher: Launcher, own_process: bool
) -> None:
    engine = await launcher.engine("d0")
    before = gc.get_freeze_count()
    try:
        router = await launcher.router(decode=[engine], own_process=own_process)
        frozen = gc.get_freeze_count()
        answer = await router.openai.completions.create(model=MODEL, prompt="hello there", max_tokens=2)
        assert answer.choices[0].text  # it serves as before
        assert (frozen > before) is own_process
    finally:
        gc.unfreeze()  # the test process keeps its collector as it was
