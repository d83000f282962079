"""How the pool's Redis is configured: from `spec.kvPool.redis` to `redis-server` arguments. Pure.

The pool is a cache, so Redis runs with a memory bound and an eviction policy, and without persistence:

    redis-server --port P --maxmemory <kvPool.redis.memory in bytes> --maxmemory-policy <evictionPolicy>
                 --save '' --appendonly no [--bind ...] [--dir ...]

`--save ''` turns RDB snapshots off, `--appendonly no` the AOF: a restarted pool starts empty, which
costs only recomputation. With `allkeys-lru` (the default) Redis evicts either key of a chunk pair on
its own; readers treat a pair with one half missing as absent (`tandem.kvpool.keys`).

The password (`requirepass`) never appears in a command line, where `ps` and the pod spec would show
it. The pool always has one: in a cluster a generated Secret's when the spec names none, locally a
random one `tandem up` draws. The container (or `tandem up`) runs `AUTH_SCRIPT`: a shell builtin
(`printf`) writes `requirepass` from the environment variable (filled from the Secret
`kvPool.redis.passwordSecret`) into a file on the pod's private emptyDir, and `redis-server` starts
with that file as its configuration, followed by the ordinary arguments. Passwords must be URL-safe
(letters, digits, `-._~`): LMCache takes the password inside its `redis://:<password>@host` URL, and
Redis' config parser splits on spaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.core.quantity import parse_bytes
from tandem.core.spec import RedisSpec
from tandem.kvpool.engine_config import PASSWORD_ENV

#: Default Redis port.
REDIS_PORT = 6379
#: Where the in-container script writes the config holding `requirepass` (inside the data emptyDir).
AUTH_CONF = "auth.conf"
#: `sh -c AUTH_SCRIPT <redis-server binary> <args...>`: the script refuses an empty password (Redis
#: would read `requirepass ""` as none), writes the password from `$PASSWORD_ENV` to
#: `$REDIS_DATA_DIR/auth.conf` (mode 600) and replaces itself with the binary (`$0`).
_CONF_PATH = '"${REDIS_DATA_DIR}/' + AUTH_CONF + '"'
AUTH_SCRIPT = (
    f'test -n "${{{PASSWORD_ENV}}}" || {{ echo "{PASSWORD_ENV} is empty" >&2; exit 1; }}'
    f' && umask 077 && printf "requirepass %s\\n" "${{{PASSWORD_ENV}}}" > {_CONF_PATH}'
    f' && exec "$0" {_CONF_PATH} "$@"'
)


@dataclass(frozen=True)
class PoolRedisConfig:
    """The settings of one pool Redis: `maxmemory` in bytes and its `maxmemory-policy`."""

    maxmemory_bytes: int
    eviction_policy: str


def pool_config(redis: RedisSpec) -> PoolRedisConfig:
    """The pool's Redis settings from the spec; `memory: 32Gi` → 34359738368 bytes."""
    return PoolRedisConfig(parse_bytes(redis.memory), redis.eviction_policy)


def server_args(
    config: PoolRedisConfig,
    *,
    port: int = REDIS_PORT,
    bind: str | None = None,
    data_dir: str | None = None,
    protected_mode: bool | None = None,
) -> list[str]:
    """`redis-server` arguments (without the binary) for a pool with `config` (module docstring).

    `bind`: the address to listen on (Redis' default: every interface); `data_dir`: its working
    directory (`--dir`, where it would write dumps); `protected_mode`: set it explicitly (a Redis
    without a password refuses non-loopback clients unless protected mode is off).
    """
    args = ["--port", str(port)]
    if bind is not None:
        args += ["--bind", bind]
    if data_dir is not None:
        args += ["--dir", data_dir]
    args += [
        "--maxmemory", str(config.maxmemory_bytes),
        "--maxmemory-policy", config.eviction_policy,
        "--save", "",
        "--appendonly", "no",
    ]  # fmt: skip
    if protected_mode is not None:
        args += ["--protected-mode", "yes" if protected_mode else "no"]
    return args


def authenticated_command(binary: str = "redis-server") -> list[str]:
    """A container `command` that starts `binary` (redis-server) with `requirepass` from the environment.

    The container's `args` are then `server_args(...)`; it needs `$TANDEM_KVPOOL_PASSWORD` (not empty)
    and `$REDIS_DATA_DIR` (a writable directory, e.g. an emptyDir) in its environment.
    """
    return ["sh", "-c", AUTH_SCRIPT, binary]
