"""A loopback TCP port for a process the test starts (torchrun's rendezvous, a gloo group, doctor's listener), or one
that must stay unanswered.

Binding port 0, reading the port and closing the socket left the port free until the child bound it: meanwhile the
test running beside it (pytest -n 2) could bind the same port, or any connect() on the machine take it as its local
port. Here the socket stays bound, with SO_REUSEADDR and never listening, until the block ends: the kernel hands the
port to no other bind(0) nor connect(), a connection to it is refused as if nothing were there, and a child that binds
with SO_REUSEADDR too and listens (torch's TCPStore, Python's socket.create_server) takes it. A listener of another
process that binds without SO_REUSEADDR, or one still listening there, still meets "Address already in use"."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def held_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port on `host` that nothing listens on, kept from every other process until the block ends."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        yield s.getsockname()[1]
