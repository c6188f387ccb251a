"""Failed admin authentication: counted, logged at a bounded rate, and slowed down per peer.

After `failures_allowed` failed attempts from one peer address, each further attempt from it is
refused with 429 for a back-off that doubles from 1 s up to `backoff_max_s`; a success clears the
peer. The table of peers is bounded (`MAX_PEERS`, least recently failed evicted first), so a
spray of source addresses costs memory once, not forever. Pure: no aiohttp, no IO besides one
log line per `log_interval_s` at most. It must never log a presented token.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from domain.exposition import Family, Sample

log = logging.getLogger("canary.admin")

AUTH_FAILURES: Final = Family(
    "canary_admin_auth_failures_total",
    "counter",
    "Admin requests with a missing or wrong token.",
)
AUTH_REFUSED: Final = Family(
    "canary_admin_auth_backoff_refused_total",
    "counter",
    "Admin requests refused (429) while their peer was backing off after failed authentications.",
)
MAX_PEERS = 10_000  # peers remembered; beyond, the least recently failing one is forgotten


class _Peer:
    __slots__ = ("failures", "until")

    def __init__(self) -> None:
        self.failures = 0
        self.until = 0.0


class AuthGuard:
    """Per-peer failure counts and back-off; `failed_total` and `refused_total` for metrics."""

    def __init__(
        self,
        failures_allowed: int = 10,
        backoff_max_s: float = 60.0,
        log_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_allowed = failures_allowed
        self.backoff_max_s = backoff_max_s
        self.log_interval_s = log_interval_s
        self._clock = clock
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self.failed_total = 0
        self.refused_total = 0
        self._unlogged = 0
        self._next_log = 0.0

    def retry_after(self, peer: str) -> float:
        """Seconds this peer must still wait (0: it may try now). A refusal is counted."""
        entry = self._peers.get(peer)
        if entry is None:
            return 0.0
        wait = entry.until - self._clock()
        if wait > 0:
            self.refused_total += 1
            return wait
        return 0.0

    def failed(self, peer: str) -> None:
        """Record a failed attempt; arm the back-off once past the allowance."""
        now = self._clock()
        entry = self._peers.pop(peer, None) or _Peer()
        self._peers[peer] = entry
        if len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        entry.failures += 1
        over = entry.failures - self.failures_allowed
        if over > 0:
            entry.until = now + min(self.backoff_max_s, 2.0 ** (over - 1))
        self.failed_total += 1
        self._unlogged += 1
        if now >= self._next_log:
            log.warning(
                "admin: failed authentication",
                extra={"fields": {"peer": peer, "failures": self._unlogged,
                                  "peer_failures": entry.failures}},
            )  # fmt: skip
            self._unlogged = 0
            self._next_log = now + self.log_interval_s

    def succeeded(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def prometheus_lines(self) -> list[Sample]:
        return [AUTH_FAILURES.sample(self.failed_total), AUTH_REFUSED.sample(self.refused_total)]
