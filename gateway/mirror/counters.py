"""Per-candidate and process-wide mirror counters, and their Prometheus rendering (pure).

The accounting identities (DESIGN.md §3.4) hold at every moment the event loop is between
callbacks, not only when the mirror is idle, because `pending` counts queued *and* in-flight
copies and a copy moves from `pending` to `sent` in one synchronous step when its outcome is
known:

    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload + sent + pending
    sent    = observed_ok + observed_error + timed_out

Copies still queued when a candidate is removed or the gateway shuts down are counted in
`dropped_overflow` (and, for information only, in `dropped_on_stop`). In-flight copies cancelled
at the end of a shutdown drain are `timed_out`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from domain.accounting import IDENTITY_FIELDS, identity_holds

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

    __slots__ = (*IDENTITY_FIELDS, "dropped_on_stop")

    def __init__(self) -> None:
        self.sampled = 0
        self.deduplicated = 0
        self.dropped_overflow = 0
        self.dropped_oversize = 0
        self.shed_overload = 0
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

    __slots__ = ("skipped_loop", "skipped_unparseable", "unknown_candidate")

    def __init__(self) -> None:
        self.skipped_unparseable = 0  # needed for sampling or mirroring, but not a JSON request
        self.skipped_loop = 0  # already carried X-Canary-Mirror: a copy is never mirrored again
        # A worker chose a candidate this mirror process no longer (or not yet) runs.
        self.unknown_candidate = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "skipped_unparseable": self.skipped_unparseable,
            "skipped_loop": self.skipped_loop,
            "skipped_unknown_candidate": self.unknown_candidate,
        }


_GAUGES: Final = (
    ("pending", "canary_mirror_pending", "Copies queued or in flight."),
    ("inflight", "canary_mirror_inflight", "Copies being sent to the candidate now."),
    ("buffer_items", "canary_mirror_buffer_items", "Copies waiting in the ring buffer."),
    ("buffer_bytes", "canary_mirror_buffer_bytes", "Request bytes waiting in the ring buffer."),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
) -> Iterator[str]:
    """Prometheus text exposition lines for the mirror (HELP/TYPE included)."""
    yield "# HELP canary_mirror_copies_total Mirror copies by candidate and outcome."
    yield "# TYPE canary_mirror_copies_total counter"
    for name, c in lanes.items():
        prefix = f'canary_mirror_copies_total{{candidate="{_esc(name)}",outcome="'
        for outcome in IDENTITY_FIELDS:
            yield f'{prefix}{outcome}"}} {c[outcome]}'
    # A subset of dropped_overflow, so not an outcome label (sums by outcome would count it twice).
    yield "# HELP canary_mirror_dropped_on_stop_total Queued copies dropped at removal or shutdown."
    yield "# TYPE canary_mirror_dropped_on_stop_total counter"
    yield from _per_lane("canary_mirror_dropped_on_stop_total", "dropped_on_stop", lanes.items())
    for key, metric, help_text in _GAUGES:
        yield f"# HELP {metric} {help_text}"
        yield f"# TYPE {metric} gauge"
        yield from _per_lane(metric, key, lanes.items())
    yield "# HELP canary_mirror_skipped_total Requests not mirrored at all, by reason."
    yield "# TYPE canary_mirror_skipped_total counter"
    for reason, value in process.items():
        if reason.startswith("skipped_"):
            label = reason.removeprefix("skipped_")
            yield f'canary_mirror_skipped_total{{reason="{label}"}} {value}'
    yield "# HELP canary_mirror_out_of_order_turns_total Turns that arrived after a later one."
    yield "# TYPE canary_mirror_out_of_order_turns_total counter"
    yield f"canary_mirror_out_of_order_turns_total {process.get('out_of_order_turns', 0)}"
    yield "# HELP canary_mirror_memory_bytes Request bytes held by all ring buffers together."
    yield "# TYPE canary_mirror_memory_bytes gauge"
    yield f"canary_mirror_memory_bytes {budget_used}"
    yield "# HELP canary_mirror_memory_budget_bytes The process-wide mirror memory budget."
    yield "# TYPE canary_mirror_memory_budget_bytes gauge"
    yield f"canary_mirror_memory_budget_bytes {budget_limit}"
    yield "# HELP canary_mirror_shedding 1 while the mirror process sheds a share of new copies."
    yield "# TYPE canary_mirror_shedding gauge"
    yield f"canary_mirror_shedding {int(shedding)}"
    yield "# HELP canary_mirror_shed_episodes_total Times shedding switched on."
    yield "# TYPE canary_mirror_shed_episodes_total counter"
    yield f"canary_mirror_shed_episodes_total {shed_episodes}"
    yield "# HELP canary_mirror_loop_lag_max_seconds Largest event-loop lag measured so far."
    yield "# TYPE canary_mirror_loop_lag_max_seconds gauge"
    yield f"canary_mirror_loop_lag_max_seconds {max_lag_s:.6f}"
    yield "# HELP canary_mirror_cpu_busy Share of one core this process used, last window."
    yield "# TYPE canary_mirror_cpu_busy gauge"
    yield f"canary_mirror_cpu_busy {cpu_busy:.3f}"
    yield "# HELP canary_mirror_shed_fraction Share of new copies shed now (sustained overload)."
    yield "# TYPE canary_mirror_shed_fraction gauge"
    yield f"canary_mirror_shed_fraction {shed_fraction:.3f}"
    yield "# HELP canary_mirror_shed_total Copies shed, by the overload signal that shed them."
    yield "# TYPE canary_mirror_shed_total counter"
    for reason, value in (shed_reasons or {}).items():
        yield f'canary_mirror_shed_total{{reason="{reason}"}} {value}'


def _per_lane(
    metric: str, key: str, items: Iterable[tuple[str, Mapping[str, int]]]
) -> Iterator[str]:
    for name, c in items:
        yield f'{metric}{{candidate="{_esc(name)}"}} {c[key]}'


_RATE_GAUGES: Final = (
    (
        "target_rps",
        "canary_mirror_target_copies_per_second",
        "Copies per second the candidate asks for (target_rps; only candidates that set it).",
    ),
    (
        "effective_sample_rate",
        "canary_mirror_effective_sample_rate",
        "Share of eligible requests (or sessions) sampled for the candidate now.",
    ),
    (
        "realized_copies_per_second",
        "canary_mirror_realized_copies_per_second",
        "Copies per second sampled for the candidate on this host, smoothed.",
    ),
)
_RATE_COUNTERS: Final = (
    (
        "rate_changes",
        "canary_mirror_sample_rate_changes_total",
        "Times the adaptive share (target_rps) of the candidate changed.",
    ),
    (
        "sessions_cut",
        "canary_mirror_sessions_cut_total",
        "Conversations in progress a lowered adaptive share stopped mirroring.",
    ),
    (
        "sessions_joined",
        "canary_mirror_sessions_joined_total",
        "Conversations a raised adaptive share began mirroring after their first turn.",
    ),
)


def rate_lines(
    rates: Mapping[str, Mapping[str, float | None]], eligible_rps: float | None
) -> Iterator[str]:
    """Adaptive sampling: per candidate target, effective share, realized rate and the cost of
    changes; the host's eligible request rate (HELP/TYPE included; None values are omitted)."""
    yield "# HELP canary_mirror_eligible_requests_per_second Requests on mirrored routes, host."
    yield "# TYPE canary_mirror_eligible_requests_per_second gauge"
    if eligible_rps is not None:
        yield f"canary_mirror_eligible_requests_per_second {eligible_rps:.6g}"
    for kind, table in (("gauge", _RATE_GAUGES), ("counter", _RATE_COUNTERS)):
        for key, metric, help_text in table:
            yield f"# HELP {metric} {help_text}"
            yield f"# TYPE {metric} {kind}"
            for name, r in rates.items():
                value = r.get(key)
                if value is not None:
                    text = f"{value:.6g}" if kind == "gauge" else str(int(value))
                    yield f'{metric}{{candidate="{_esc(name)}"}} {text}'
