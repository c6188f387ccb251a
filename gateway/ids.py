"""Time-ordered unique ids (UUIDv7, RFC 9562) for exchanges and request ids.

Time ordering keeps primary-key inserts append-only in both SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import time


def uuid7() -> str:
    """A UUIDv7 string: 48-bit Unix milliseconds, version 7, 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
