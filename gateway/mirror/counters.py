"""Per-candidate and process-wide mirror counters, and their Prometheus rendering (pure).

The accounting identities (docs/design.md, "The mirror path") hold at every moment the event
loop is between callbacks, not only when the mirror is idle, because `pending` counts queued
*and* in-flight copies and a copy moves from `pending` to `sent` in one synchronous step when
its outcome is known:

    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload
              + shed_capacity + shed_session_broken + sent + pending
    sent    = observed_ok + observed_error + timed_out

Copies still queued when a candidate is removed or the gateway shuts down are counted in
`dropped_overflow` (and, for information only, in `dropped_on_stop`). In-flight copies cancelled
at the end of a shutdown drain are `timed_out`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from domain.accounting import IDENTITY_FIELDS, identity_holds
from domain.exposition import (
    Exposed,
    Family,
    Kind,
    Sample,
    fmt,
    integer,
    significant,
    six_digits,
    three_digits,
)

__all__ = [
    "IDENTITY_FIELDS",
    "LaneCounters",
    "MirrorCounters",
    "identity_holds",
    "prometheus_lines",
    "rate_lines",
]


class LaneCounters:
    """Monotonic counters for one candidate lane (plain ints: the hot path only adds)."""

    __slots__ = (*IDENTITY_FIELDS, "dropped_on_stop", "score_pending")

    def __init__(self) -> None:
        self.score_sampled = 0  # scoring copies (domain.accounting: SCORE_IDENTITY_FIELDS)
        self.score_dropped = 0
        self.score_sent = 0
        self.score_ok = 0
        self.score_unsupported = 0
        self.score_failed = 0
        self.score_pending = 0  # scoring copies selected, not yet sent or dropped (a gauge)
        self.sampled = 0
        self.deduplicated = 0
        self.dropped_overflow = 0
        self.dropped_oversize = 0
        self.shed_overload = 0  # the loop guard (timing: a lost copy)
        self.shed_capacity = 0  # by hash under a capacity share (a sampling decision)
        # Later turns of a session an earlier turn of which never reached the candidate.
        self.shed_session_broken = 0
        self.sent = 0
        self.observed_ok = 0
        self.observed_error = 0
        self.timed_out = 0
        self.dropped_on_stop = 0  # included in dropped_overflow

    def as_dict(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in IDENTITY_FIELDS}
        out["dropped_on_stop"] = self.dropped_on_stop
        return out


class MirrorCounters:
    """Process-wide counters for requests that were never offered to any candidate."""

    __slots__ = (
        "skipped_loop",
        "skipped_unmirrorable_state",
        "skipped_unparseable",
        "unknown_candidate",
    )

    def __init__(self) -> None:
        self.skipped_unparseable = 0  # needed for sampling or mirroring, but not a JSON request
        self.skipped_loop = 0  # already carried X-Canary-Mirror: a copy is never mirrored again
        # Continues state kept on the server that answered (a Responses previous_response_id or
        # conversation): the candidate never made that response, so a copy cannot be replayed.
        self.skipped_unmirrorable_state = 0
        # A worker chose a candidate this mirror process no longer (or not yet) runs.
        self.unknown_candidate = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "skipped_unparseable": self.skipped_unparseable,
            "skipped_loop": self.skipped_loop,
            "skipped_unmirrorable_state": self.skipped_unmirrorable_state,
            "skipped_unknown_candidate": self.unknown_candidate,
        }


def _lane(name: str, kind: Kind, help_text: str) -> Family:
    return Family(name, kind, help_text, ("candidate",))


def _one(name: str, kind: Kind, help_text: str, fmt: Callable[[float], str] = fmt) -> Family:
    return Family(name, kind, help_text, fmt=fmt)


COPIES: Final = Family(
    "canary_mirror_copies_total",
    "counter",
    "Mirror copies by candidate and outcome.",
    ("candidate", "outcome"),
)
# A subset of dropped_overflow, so not an outcome label (sums by outcome would count it twice).
DROPPED_ON_STOP: Final = _lane(
    "canary_mirror_dropped_on_stop_total",
    "counter",
    "Queued copies dropped at removal or shutdown.",
)
_GAUGES: Final = (
    ("pending", _lane("canary_mirror_pending", "gauge", "Copies queued or in flight.")),
    (
        "inflight",
        _lane("canary_mirror_inflight", "gauge", "Copies being sent to the candidate now."),
    ),
    (
        "buffer_items",
        _lane("canary_mirror_buffer_items", "gauge", "Copies waiting in the ring buffer."),
    ),
    (
        "buffer_bytes",
        _lane("canary_mirror_buffer_bytes", "gauge", "Request bytes waiting in the ring buffer."),
    ),
    (
        "score_pending",
        _lane(
            "canary_mirror_score_pending",
            "gauge",
            "Scoring copies selected for the endpoint, not yet sent or dropped.",
        ),
    ),
)
SKIPPED: Final = Family(
    "canary_mirror_skipped_total",
    "counter",
    "Requests not mirrored at all, by reason.",
    ("reason",),
)
OUT_OF_ORDER: Final = _one(
    "canary_mirror_out_of_order_turns_total", "counter", "Turns that arrived after a later one."
)
MEMORY: Final = _one(
    "canary_mirror_memory_bytes", "gauge", "Request bytes held by all ring buffers together."
)
MEMORY_BUDGET: Final = _one(
    "canary_mirror_memory_budget_bytes", "gauge", "The process-wide mirror memory budget."
)
SHEDDING: Final = _one(
    "canary_mirror_shedding", "gauge", "1 while the mirror process sheds a share of new copies."
)
SHED_EPISODES: Final = _one(
    "canary_mirror_shed_episodes_total", "counter", "Times shedding switched on."
)
LOOP_LAG: Final = _one(
    "canary_mirror_loop_lag_max_seconds",
    "gauge",
    "Largest event-loop lag measured so far.",
    six_digits,
)
CPU_BUSY: Final = _one(
    "canary_mirror_cpu_busy",
    "gauge",
    "Share of one core this process used, last window.",
    three_digits,
)
SHED_FRACTION: Final = _one(
    "canary_mirror_shed_fraction",
    "gauge",
    "Share of new copies shed now (sustained overload).",
    three_digits,
)
SHED: Final = Family(
    "canary_mirror_shed_total",
    "counter",
    "Copies shed, by the overload signal that shed them.",
    ("reason",),
)


def prometheus_lines(
    lanes: Mapping[str, Mapping[str, int]],
    process: Mapping[str, int],
    budget_used: int,
    budget_limit: int,
    shedding: bool,
    shed_episodes: int = 0,
    max_lag_s: float = 0.0,
    cpu_busy: float = 0.0,
    shed_fraction: float = 0.0,
    shed_reasons: Mapping[str, int] | None = None,
) -> Iterator[Exposed]:
    """The mirror's families and samples, for the metrics registry."""
    yield COPIES
    for name, c in lanes.items():
        for outcome in IDENTITY_FIELDS:
            yield COPIES.sample(c[outcome], name, outcome)
    yield DROPPED_ON_STOP
    yield from _per_lane(DROPPED_ON_STOP, "dropped_on_stop", lanes.items())
    for key, family in _GAUGES:
        yield family
        yield from _per_lane(family, key, lanes.items())
    yield SKIPPED
    for reason, value in process.items():
        if reason.startswith("skipped_"):
            yield SKIPPED.sample(value, reason.removeprefix("skipped_"))
    yield OUT_OF_ORDER.sample(process.get("out_of_order_turns", 0))
    yield MEMORY.sample(budget_used)
    yield MEMORY_BUDGET.sample(budget_limit)
    yield SHEDDING.sample(int(shedding))
    yield SHED_EPISODES.sample(shed_episodes)
    yield LOOP_LAG.sample(max_lag_s)
    yield CPU_BUSY.sample(cpu_busy)
    yield SHED_FRACTION.sample(shed_fraction)
    yield SHED
    for reason, value in (shed_reasons or {}).items():
        yield SHED.sample(value, reason)


def _per_lane(
    family: Family, key: str, items: Iterable[tuple[str, Mapping[str, int]]]
) -> Iterator[Sample]:
    for name, c in items:
        yield family.sample(c[key], name)


ELIGIBLE_RPS: Final = _one(
    "canary_mirror_eligible_requests_per_second",
    "gauge",
    "Requests on mirrored routes, host.",
    significant,
)
_RATE_GAUGES: Final = (
    (
        "target_rps",
        Family(
            "canary_mirror_target_copies_per_second",
            "gauge",
            "Copies per second the candidate asks for (target_rps; only candidates that set it).",
            ("candidate",),
            significant,
        ),
    ),
    (
        "effective_sample_rate",
        Family(
            "canary_mirror_effective_sample_rate",
            "gauge",
            "Share of eligible requests (or sessions) sampled for the candidate now.",
            ("candidate",),
            significant,
        ),
    ),
    (
        "realized_copies_per_second",
        Family(
            "canary_mirror_realized_copies_per_second",
            "gauge",
            "Copies per second sampled for the candidate on this host, smoothed.",
            ("candidate",),
            significant,
        ),
    ),
    (
        "capacity_share",
        Family(
            "canary_mirror_capacity_share",
            "gauge",
            "Share of eligible requests the overloaded mirror lets the workers keep for the "
            "candidate (absent: no limit); copies above it are shed by hash on the worker.",
            ("candidate",),
            significant,
        ),
    ),
)
CAPACITY_CUTS: Final = Family(
    "canary_mirror_capacity_cuts_total",
    "counter",
    "Times a candidate's capacity share was lowered, by the overload signal.",
    ("reason",),
    integer,
)
_RATE_COUNTERS: Final = (
    (
        "rate_changes",
        Family(
            "canary_mirror_sample_rate_changes_total",
            "counter",
            "Times the adaptive share (target_rps) of the candidate changed.",
            ("candidate",),
            integer,
        ),
    ),
    (
        "sessions_cut",
        Family(
            "canary_mirror_sessions_cut_total",
            "counter",
            "Conversations in progress a lowered adaptive share stopped mirroring.",
            ("candidate",),
            integer,
        ),
    ),
    (
        "sessions_joined",
        Family(
            "canary_mirror_sessions_joined_total",
            "counter",
            "Conversations a raised adaptive share began mirroring after their first turn.",
            ("candidate",),
            integer,
        ),
    ),
)


def rate_lines(
    rates: Mapping[str, Mapping[str, float | None]],
    eligible_rps: float | None,
    capacity_cuts: Mapping[str, int] | None = None,
) -> Iterator[Exposed]:
    """Adaptive sampling: per candidate target, effective share, capacity share, realized rate
    and the cost of changes; the host's eligible request rate (None values are omitted); the
    capacity shares' cuts by reason."""
    yield CAPACITY_CUTS
    for reason, cuts in (capacity_cuts or {}).items():
        yield CAPACITY_CUTS.sample(cuts, reason)
    yield ELIGIBLE_RPS
    if eligible_rps is not None:
        yield ELIGIBLE_RPS.sample(eligible_rps)
    for key, family in (*_RATE_GAUGES, *_RATE_COUNTERS):
        yield family
        for name, r in rates.items():
            value = r.get(key)
            if value is not None:
                yield family.sample(value, name)
