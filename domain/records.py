"""Plain records that cross the package boundaries: what the gateway hands to storage and what
storage hands back. msgspec Structs, no SQLAlchemy, no IO.

Times are epoch seconds (float) for wall-clock instants and seconds (float) for durations, so a
million rows load without datetime parsing.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from domain.observation import Measured, Quantity

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


class ObservationRecord(Measured, kw_only=True):
    """One arm's answer to one exchange: who answered, and what the meter measured (the
    `Measured` fields, declared once in domain.observation). The table's columns are generated
    from this declaration (storage.models)."""

    exchange_id: Annotated[str, Quantity(length=36)]
    endpoint: Annotated[str, Quantity(length=63)]
    arm: Annotated[Arm, Quantity(length=16)]
    started_at: Annotated[float, Quantity("epoch s")]
    # None when ok; one of domain.outcomes.ERROR_KINDS (connect, timeout, http_5xx, ...).
    error_kind: Annotated[str | None, Quantity(length=32)] = None
    output_text: str | None = None  # domain.observation.kept_text; None when store_text=false
    tool_calls: str | None = None  # JSON: [{"name": ..., "arguments": ...}]


class RampRecord(msgspec.Struct, array_like=True, frozen=True):
    """One live request of an open rollout, as the ramp's evidence stores it (never a body).

    `generation` names the rollout (`gateway.server.arms.Rollout.generation`), `arm` is 0
    (production) or 1 (candidate), `session` the unsalted xxh3_64 of the session key as a signed
    int64, `turn` its 1-based place among the session's requests of this rollout (filled in by
    the mirror process), `status` the HTTP status sent (0: none), `error_kind` one of
    domain.outcomes.ERROR_KINDS or None, `ttft_s` / `e2e_s` NaN when absent, `finished` whether
    the stream's final event reached the client, `at` the end (epoch s), `replica` the host's.
    """

    generation: int
    arm: int
    session: int
    turn: int
    status: int
    error_kind: str | None
    ttft_s: float
    e2e_s: float
    finished: bool
    at: float
    replica: str


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
