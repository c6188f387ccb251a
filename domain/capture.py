"""Records of captured request bodies and of capacity results: what the capture sink hands to
storage, what the replay driver reads back, and what a capacity run stores for the report.

Plain msgspec Structs, no IO. Times are epoch seconds; durations are seconds.
"""

from __future__ import annotations

from typing import Final

import msgspec

# A capacity measurement ages with the deployment (engine versions, traffic mix); past a week
# the report falls back to the mirrored-load estimate rather than trust an old run. Storage
# selects the run by it, the cost metric explains it.
CAPACITY_MAX_AGE_S: Final = 7 * 86400.0


class CaptureRecord(msgspec.Struct, kw_only=True):
    """One captured request of a mirrored exchange, redacted, ready to be replayed."""

    exchange_id: str
    session_key: str  # hex hash of the conversation's key (the exchange's), never the raw value
    turn_index: int
    received_at: float  # when production received the request
    answered_at: float  # when production's answer ended (the capture's offer time)
    route: str
    model: str | None
    targets: tuple[str, ...]  # the candidates whose ring accepted the copy
    body: str  # the request body, JSON, with the configured fields redacted
    headers: str  # JSON object of the request headers kept, secrets redacted
    body_bytes: int  # size of the body as received (what the byte budget counts)


class CapturedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One turn of a conversation as the replay driver sends it."""

    route: str
    body: bytes
    # Seconds between the end of the previous turn's answer and this request (0 for turn 0).
    think_s: float


class CapturedSession(msgspec.Struct, frozen=True, kw_only=True):
    """A whole conversation: its turns in order, from turn 0 with no gap."""

    session_key: str
    turns: tuple[CapturedTurn, ...]


class CapacitySummary(msgspec.Struct, frozen=True, kw_only=True):
    """The stored headline of one capacity run (the full result is kept as JSON beside it)."""

    id: int
    endpoint: str
    reference: str
    created_at: float
    load_unit: str  # what the ramp offered: "sessions" (concurrent)
    slo: str  # e.g. "ttft<=0.5s,tpot<=0.05s"
    capacity: float | None  # goodput (req/s) at the SLO, the candidate
    capacity_low: float | None
    capacity_high: float | None
    reference_capacity: float | None
    reference_low: float | None
    reference_high: float | None
    ratio: float | None  # candidate / reference capacity
    ratio_low: float | None
    ratio_high: float | None
    usd_per_1m_tokens: float | None  # the candidate's, at capacity
    reference_usd_per_1m_tokens: float | None
    result_json: str = "{}"
