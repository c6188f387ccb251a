"""The header policy of every upstream exchange: what a proxy must not forward.

One home for the hop-by-hop rules (RFC 9110 §7.6.1: the fixed list, `Proxy-*`, and any header
named in `Connection`), used by the proxy for production requests and answers and by the mirror
lanes for copies. Pure: no IO, no aiohttp.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

# RFC 9110 §7.6.1 hop-by-hop headers, compared lower-case.
HOP_BY_HOP: Final = frozenset(
    ("connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade")
)
# Set by the proxy itself on a forwarded production request.
# `Expect` too: the gateway answers `100-continue` itself when it reads the body (as nginx and
# Envoy do) and forwards a complete request; an upstream asked to continue might never answer.
REQUEST_SKIP: Final = HOP_BY_HOP | {
    "host",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
    "expect",
}
RESPONSE_SKIP: Final = HOP_BY_HOP
# Not forwarded on a copy besides the hop-by-hop ones: set by the lane's client (Host,
# Content-Length), answered by the gateway (Expect), or replaced so that the lane only gets
# encodings its meter can read (Accept-Encoding).
COPY_SKIP: Final = HOP_BY_HOP | {"host", "content-length", "expect", "accept-encoding"}


def copy_skip(credential_headers: Iterable[str], forward_auth: bool) -> frozenset[str]:
    """What a copy must not carry: `COPY_SKIP`, plus the credential headers unless
    `forward_auth`. Computed when a lane is configured, never per copy."""
    if forward_auth:
        return COPY_SKIP
    return COPY_SKIP | {h.lower() for h in credential_headers}


def connection_tokens(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """Header names listed in `Connection` (hop-by-hop by declaration)."""
    return frozenset(
        t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(",")
    )


def copy_end_to_end(
    src: CIMultiDictProxy[str], skip: frozenset[str], out: CIMultiDict[str]
) -> None:
    """Add to `out` every header of `src` that is not hop-by-hop (`skip`, `Proxy-*`, or named
    in `Connection`). Inlined loop: this runs for every header of every request and answer."""
    named = connection_tokens(src) if "Connection" in src else None
    add = out.add
    for key, value in src.items():
        lower = key.lower()
        if lower in skip or lower.startswith("proxy-") or (named and lower in named):
            continue
        add(key, value)
