"""The promotion report's model: the `Report` Struct and its JSON codec.

The JSON form is a stable, documented schema (evaluators/SCHEMA.md; bump SCHEMA_VERSION on any
breaking change). Renderers and the builder import this module; it imports neither.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from evaluators.judge.metric import Detail, MetricResult
from evaluators.judge.verdict import Reason, VerdictName
from evaluators.metrics.throughput import Row

SCHEMA_VERSION = 1
Format = Literal["text", "markdown", "json", "html"]
FORMATS: tuple[Format, ...] = ("text", "markdown", "json", "html")


class PairsSummary(msgspec.Struct, kw_only=True):
    """How many pairs there were and which of them each analysis could use."""

    n: int  # exchanges with a candidate observation
    lost: int  # exchanges without one (older than the candidate's timeout)
    pending: int  # exchanges without one, still within the timeout
    used_latency: int  # pairs where candidate and reference both answered OK
    with_control: int
    temperature0: int
    json_requested: int
    tools_requested: int
    sessions: int
    later_turns: int
    reference: str  # "control" or "production"
    control: str | None
    live: str | None
    window_start: float | None
    window_end: float | None
    coverage: float | None  # observed / (sampled - deduplicated - pending)
    planned_look: bool
    # Sessions whose turns more than one gateway replica handled, their pairs and the share of
    # all pairs these hold: left out of TTFT by turn and the turn-1 / later-turn metrics.
    split_sessions: int = 0
    split_pairs: int = 0
    split_share: float = 0.0


class Report(msgspec.Struct, kw_only=True):
    """The whole report; its JSON encoding is the documented schema."""

    schema_version: int
    candidate: str
    kind: str
    verdict: VerdictName
    reasons: list[Reason]
    pairs: PairsSummary
    metrics: dict[str, MetricResult]
    accounting: dict[str, int]
    ttft_by_turn: list[Detail]
    arms_load: dict[str, Row]
    generated_at: float
    caveats: list[str]
    # How each arm's output tokens were counted (evaluators.metrics.tokens.arm_counts), and
    # each token-derived metric's gating state ("gating", or why not).
    token_counts: dict[str, Detail] = msgspec.field(default_factory=dict)
    token_metrics: dict[str, str] = msgspec.field(default_factory=dict)


_encoder = msgspec.json.Encoder()


def report_to_json(report: Report) -> bytes:
    """The report in its documented JSON schema (NaN and infinities encode as null)."""
    return _encoder.encode(report)


def report_from_json(data: bytes | str) -> Report:
    """Decode a JSON report (e.g. a promotion's stored snapshot)."""
    return msgspec.json.decode(data, type=Report)
