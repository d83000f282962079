"""Where engines publish their KV events, and where the gateway finds them (`spec.router.prefixSource:
precise`; docs/routing.md, "Precise prefix state").

The control plane decides both ends, so it writes them in one place:

- **Engines** bind a ZMQ PUB socket for the live stream and a ROUTER socket for replays. vLLM takes them
  in `--kv-events-config` (`vllm_kv_events_config`: `enable_kv_cache_events`, `publisher: zmq`,
  `endpoint`, `replay_endpoint`); the simulator in `--kv-events-endpoint` and
  `--kv-events-replay-endpoint` (`sim_kv_events_args`), the same wire protocol.
- **The gateway** connects to each engine it discovers. `KVEventsAddresses` holds the two addresses as
  templates over the engine's base URL: `{host}` and `{port}` are the URL's host and port. In a cluster
  every engine pod binds `tcp://*:5557` and `tcp://*:5558` and the gateway connects to
  `tcp://{host}:5557` and `tcp://{host}:5558` (`cluster_addresses`); on one machine (`tandem up`) every
  engine shares the loopback address, so each binds a Unix socket named after its HTTP port
  (`ipc://<state dir>/kv-events/{port}.pub`, `local_addresses`), which also covers engines the local
  autoscaler starts later.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field

from tandem.core.spec import SpecModel

#: vLLM's default KV-event PUB port; the replay port next to it.
KV_EVENTS_PORT = 5557
KV_EVENTS_REPLAY_PORT = 5558
#: A Unix socket path must fit `sockaddr_un.sun_path` (108 bytes with its NUL on Linux).
MAX_IPC_PATH = 100

_ADDRESS = r"^(tcp|ipc)://\S+$"


class KVEventsAddresses(SpecModel):
    """The gateway's side: templates of each engine's KV-event addresses (module docstring)."""

    events: str = Field(
        pattern=_ADDRESS,
        description="The engine's PUB address; `{host}` and `{port}` are its base URL's host and port.",
    )
    replay: str | None = Field(
        default=None, pattern=_ADDRESS, description="Its replay (ROUTER) address, same placeholders."
    )

    def for_engine(self, url: str) -> tuple[str, str | None]:
        """(events, replay) of the engine at base URL `url`. Example: `tcp://{host}:5557` for
        `http://10.0.0.5:8000` is `tcp://10.0.0.5:5557`."""
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)

        def fill(template: str) -> str:
            return template.replace("{host}", host).replace("{port}", str(port))

        return fill(self.events), fill(self.replay) if self.replay is not None else None


def cluster_addresses() -> KVEventsAddresses:
    """Every engine pod publishes on its own IP, on the fixed ports."""
    return KVEventsAddresses(
        events=f"tcp://{{host}}:{KV_EVENTS_PORT}", replay=f"tcp://{{host}}:{KV_EVENTS_REPLAY_PORT}"
    )


def cluster_binds() -> tuple[str, str]:
    """What an engine pod binds: every interface, the fixed ports."""
    return f"tcp://*:{KV_EVENTS_PORT}", f"tcp://*:{KV_EVENTS_REPLAY_PORT}"


def local_addresses(state_dir: Path) -> KVEventsAddresses:
    """Unix sockets per engine HTTP port under `state_dir/kv-events` (engines on one machine share
    the loopback address). A state directory whose path would not fit a Unix socket name gets one
    in the temporary directory instead, named by a hash of it (stable across runs)."""
    folder = state_dir / "kv-events"
    if len(str(folder)) + len("/65535.replay") > MAX_IPC_PATH:
        digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"tandem-kv-events-{digest}"
    return KVEventsAddresses(events=f"ipc://{folder}/{{port}}.pub", replay=f"ipc://{folder}/{{port}}.replay")


def ipc_folder(addresses: KVEventsAddresses) -> Path | None:
    """The folder of `ipc://` addresses (it must exist before an engine binds there); None for tcp."""
    if not addresses.events.startswith("ipc://"):
        return None
    return Path(addresses.events.removeprefix("ipc://")).parent


def vllm_kv_events_config(*, endpoint: str, replay: str | None) -> dict[str, object]:
    """vLLM's `--kv-events-config` (vllm.config.KVEventsConfig) publishing on `endpoint`."""
    config: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": "",
    }
    if replay is not None:
        config["replay_endpoint"] = replay
    return config


def sim_kv_events_args(*, endpoint: str, replay: str | None) -> list[str]:
    """The simulator's flags for the same."""
    args = ["--kv-events-endpoint", endpoint]
    if replay is not None:
        args += ["--kv-events-replay-endpoint", replay]
    return args
