"""Time-ordered unique ids (UUIDv7, RFC 9562) for exchanges and request ids.

Time ordering keeps primary-key inserts append-only in both SQLite and PostgreSQL. The random
bits come from a per-process PRNG seeded from os.urandom (reseeded in a forked child), so the
proxy makes an id per request without a syscall: ids need uniqueness, not secrecy.
"""

from __future__ import annotations

import os
import random
from time import time_ns

_rng = random.Random(os.urandom(16))
_rand = _rng.getrandbits


def _reseed() -> None:
    _rng.seed(os.urandom(16))


os.register_at_fork(after_in_child=_reseed)


def uuid7() -> str:
    """A UUIDv7 string: 48-bit Unix milliseconds, version 7, 74 random bits."""
    value = ((time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7000 << 64 | _rand(12) << 64 | 0b10 << 62 | _rand(62)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
