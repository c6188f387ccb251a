"""A free TCP port on 127.0.0.1 for the servers a benchmark or a test starts; it opens nothing
that outlives the call."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
