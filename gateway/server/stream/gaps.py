"""The meter's clock of token events: when the first came, and the inter-event gaps over the
token span (`server/meter.py` inherits it).

Several events that arrive in one read share one timestamp, so the gap before a read is spread
over the events it carried (k gaps of d/k, never k-1 gaps of 0). The gaps then sum to the token
span and number token events - 1. Only a bounded number of gaps is kept for the percentiles;
count, mean and max stay exact past it.

It must never import asyncio or aiohttp, never block, never keep more than `MAX_GAPS` gaps.
"""

from __future__ import annotations

from domain.observation import Measured

# Gaps kept for the percentiles; count, mean and max stay exact past it.
MAX_GAPS = 1 << 16


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as vLLM reports)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class TokenTimes:
    """The first token's time, the token events counted, and their inter-event gaps; a
    subclass calls `_tokens(count, now)` for every read that carried token events."""

    __slots__ = (
        "_carry",
        "_gap_count",
        "_gap_max",
        "_gap_sum",
        "_gaps",
        "_last_token",
        "_prev_read",
        "_read_tokens",
        "first_token_at",
        "token_chunk_count",
    )

    def __init__(self) -> None:
        self.first_token_at: float | None = None
        self.token_chunk_count = 0
        self._last_token = 0.0
        self._prev_read = 0.0  # time of the token-bearing read before the current one
        self._read_tokens = 0  # token events in the current read, not yet turned into gaps
        self._carry = -1  # token events of the first read past the first token; -1: none yet
        self._gaps: list[float] = []
        self._gap_count = 0
        self._gap_sum = 0.0
        self._gap_max = 0.0

    def _tokens(self, count: int, now: float) -> None:
        """`count` token events that arrived in one read at `now`."""
        self.token_chunk_count += count
        if self.first_token_at is None:
            self.first_token_at = now
            self._read_tokens = count
        elif now == self._last_token:  # the same read: its tokens arrived together
            self._read_tokens += count
        else:
            self._close_read()
            self._prev_read = self._last_token
            self._read_tokens = count
        self._last_token = now

    def _close_read(self) -> None:
        """Turn the current read's token events into inter-event gaps.

        Tokens that arrive in one read were generated over the time since the previous
        token-bearing read, so that interval is spread evenly over them (k gaps of d/k) instead
        of giving k-1 gaps of 0. The first read's extra tokens (those that came with the first
        token) have no interval of their own: they are carried into the next one. The gaps then
        sum to the token span and number token events - 1, so the mean inter-event latency
        equals the span per gap.
        """
        tokens = self._read_tokens
        if tokens == 0:
            return
        self._read_tokens = 0
        if self._carry < 0:  # the first read
            self._carry = tokens - 1
            return
        count = tokens + self._carry
        self._carry = 0
        span = self._last_token - self._prev_read
        gap = span / count
        self._gap_count += count
        self._gap_sum += span
        if gap > self._gap_max:
            self._gap_max = gap
        gaps = self._gaps
        if count == 1:  # one event a read, the usual case: no list to build
            if len(gaps) < MAX_GAPS:
                gaps.append(gap)
            return
        room = MAX_GAPS - len(gaps)
        if room > 0:
            gaps.extend([gap] * min(count, room))

    def _put_gaps(self, res: Measured) -> None:
        """The inter-event fields of `res`, when any gap was measured."""
        if not self._gap_count:
            return
        gaps = sorted(self._gaps)
        res.inter_event_count = self._gap_count
        res.inter_event_mean_s = self._gap_sum / self._gap_count
        res.inter_event_p50_s = _percentile(gaps, 0.5)
        res.inter_event_p99_s = _percentile(gaps, 0.99)
        res.inter_event_max_s = self._gap_max
