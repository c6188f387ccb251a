"""Plain records that cross the package boundaries: what the gateway hands to storage and what
storage hands back. msgspec Structs, no SQLAlchemy, no IO.

Times are epoch seconds (float) for wall-clock instants and seconds (float) for durations, so a
million rows load without datetime parsing.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Arm = Literal["production", "candidate"]


class ExchangeRecord(msgspec.Struct, kw_only=True):
    """One sampled production request (mirrored to at least one candidate)."""

    id: str
    received_at: float
    route: str
    model: str | None = None
    stream: bool = False
    temperature: float | None = None
    session_key: str | None = None  # hex hash of the session key, never the raw value
    turn_index: int = 0  # number of assistant messages in the request
    request_hash: str = ""  # hex xxh3_128 of the body
    json_requested: bool = False  # response_format asked for JSON
    tools_requested: bool = False
    replica: str = ""
    # Candidates whose ring accepted the copy: a pair is "lost" only for these.
    targets: tuple[str, ...] = ()
    prompt_tokens: int | None = None  # production's, when the engine reported usage
    cached_tokens: int | None = None


class ObservationRecord(msgspec.Struct, kw_only=True):
    """One arm's answer to one exchange, as the meter saw it."""

    exchange_id: str
    endpoint: str
    arm: Arm
    started_at: float
    status: int = 0  # HTTP status; 0 when no response arrived
    error_kind: str | None = None  # None when ok; e.g. connect, timeout, reset, http_5xx, garbage
    queue_wait_s: float | None = None  # time spent in the ring buffer (candidates only)
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_count: int = 0
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    output_tokens: int | None = None
    output_tokens_source: Literal["usage", "chunks"] | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    output_text: str | None = None  # truncated to store_text_max_chars; None when store_text=false
    output_hash: str | None = None  # hex xxh3_128 of the full output text
    text_truncated: bool = False
    tool_calls: str | None = None  # JSON: [{"name": ..., "arguments": ...}]


class PromotionRecord(msgspec.Struct, kw_only=True):
    """An audit row: a promotion or a rollback."""

    id: int
    action: Literal["promote", "rollback"]
    from_endpoint: str | None
    to_endpoint: str
    actor: str
    reason: str
    forced: bool
    verdict: str | None
    report_snapshot: str | None  # the JSON report at the time of the decision
    at: float
