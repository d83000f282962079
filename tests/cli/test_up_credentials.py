"""`tandem up`'s credentials: drawn at random per run, except those the caller's environment names (to
call the engines directly or compute the pool's keys in tests).

Pure: the environment is a dict passed in; nothing is faked.
"""

from __future__ import annotations

from tandem.cli.up import _credentials


def test_every_credential_is_drawn_when_the_environment_names_none() -> None:
    drawn = _credentials({})
    assert drawn.engine_api_key and drawn.pool_key and drawn.cache_key
    assert len({drawn.redis_password, drawn.engine_api_key, drawn.pool_key, drawn.cache_key}) == 4


def test_the_environment_names_the_engine_key_the_pool_key_and_the_salt_key() -> None:
    given = _credentials(
        {"TANDEM_ENGINE_API_KEY": "ek", "TANDEM_KV_POOL_KEY": "pk", "TANDEM_CACHE_KEY": "sk"}
    )
    assert (given.engine_api_key, given.pool_key, given.cache_key) == ("ek", "pk", "sk")
    assert _credentials({"TANDEM_KV_POOL_KEY": ""}).pool_key  # empty: drawn, as if unset
