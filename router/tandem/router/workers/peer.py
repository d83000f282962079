"""Who may talk on the workers' bus: a process of the gateway's own user that knows this run's token.

An abstract Unix socket has no file and so no file permissions: any process on the host (any user, any
container sharing the network namespace) can connect to `@tandem-router-<key>-<i>`, and the name is
listed in `/proc/net/unix`. Two checks close it, on both ends of every connection:

- **The peer's uid** (`SO_PEERCRED`, Linux): the kernel's record of who opened the other end. A
  worker accepts only a peer of its own uid, and a worker connecting checks that the listener is of
  its own uid before it sends anything (a foreign process that bound a sibling's name first, say
  while that sibling restarts, would otherwise receive the token and the events).
- **The run's token**: 32 random bytes the parent (`tandem router --workers N`) makes once per run and
  hands each worker with its settings (through the spawn pipe: never in argv, the environment or a
  file). The first frame of every connection is `[token, purpose]`; a listener closes a connection
  whose first frame is not that within `HELLO_TIMEOUT_S`, or is longer than `MAX_HELLO` bytes. Tokens
  are compared in constant time. A process of the same uid that can read the workers' memory can
  also read the token: the uid check is what keeps other users out, the token what keeps out other
  programs of the same user that cannot (a second `tandem router`, a tool that opens the socket).

Refusals are counted by the bus (`WorkerBus.refused`) and logged, with the peer's pid and uid.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

#: Seconds a new connection has to present its first frame.
HELLO_TIMEOUT_S = 2.0
#: The longest first frame (bytes): a token and a purpose word.
MAX_HELLO = 512
#: The shortest token accepted (characters): 16 random bytes, hex.
MIN_TOKEN = 32

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(Exception):
    """A bus connection that is not a sibling's (wrong uid, no or wrong token, bad first frame)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a Unix socket, as the kernel recorded it."""

    pid: int
    uid: int


def peer_of(sock: Any) -> Peer | None:
    """The peer of a connected Unix socket (`SO_PEERCRED`); None where the platform has no such
    option (not Linux: there is no abstract namespace either, and the token alone guards)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sock is None:
        return None
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _CRED.size))
    return Peer(pid=pid, uid=uid)


def check_peer(peer: Peer | None, *, uid: int) -> None:
    """Raise `Refused` unless the peer runs as `uid` (unknown peers pass: module docstring)."""
    if peer is not None and peer.uid != uid:
        raise Refused(f"peer pid {peer.pid} runs as uid {peer.uid}, not {uid}")


def check_token(token: str) -> str:
    """The token itself, or ValueError when it is too short to be a secret."""
    if len(token) < MIN_TOKEN:
        raise ValueError(f"the bus token must have at least {MIN_TOKEN} characters")
    return token


def hello(token: str, purpose: str) -> list[str]:
    """The first frame a connection sends."""
    return [token, purpose]


def check_hello(frame: Any, *, token: str, purposes: tuple[str, ...]) -> str:
    """The purpose of a valid first frame; `Refused` for anything else."""
    if not (isinstance(frame, list) and len(frame) == 2 and all(isinstance(part, str) for part in frame)):
        raise Refused("the first frame is not [token, purpose]")
    given, purpose = str(frame[0]), str(frame[1])
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Refused("wrong token")
    if purpose not in purposes:
        raise Refused(f"unknown purpose {purpose[:32]!r}")
    return purpose


def own_uid() -> int:
    return os.geteuid()
