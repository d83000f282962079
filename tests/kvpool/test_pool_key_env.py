"""The pool key from the environment (`tandem.kvpool.client.pool_key_from_env`), as engines, the gateway
and the simulator read it.

Pure: the environment is a dict passed in; nothing is faked.
"""

from __future__ import annotations

import pytest

from tandem.kvpool.client import POOL_KEY_ENV, pool_key_from_env
from tandem.kvpool.keys import pool_key


def test_the_key_is_derived_from_tandem_kv_pool_key() -> None:
    assert POOL_KEY_ENV == "TANDEM_KV_POOL_KEY"
    assert pool_key_from_env({"TANDEM_KV_POOL_KEY": "s3cret"}) == pool_key("s3cret")


@pytest.mark.parametrize("environ", [{}, {"TANDEM_KV_POOL_KEY": ""}])
def test_unset_or_empty_means_an_unkeyed_pool(environ: dict[str, str]) -> None:
    assert pool_key_from_env(environ) is None


def test_another_variable_may_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pool_key_from_env({"OTHER": "x"}, "OTHER") == pool_key("x")
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", "from-process")
    assert pool_key_from_env() == pool_key("from-process")
