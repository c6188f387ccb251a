"""The admin API's wire types, and the pure conversions of storage records into them.

Request bodies are msgspec Structs with `forbid_unknown_fields`, so one decode validates types,
bounds and patterns, and an unknown field (say, a raw `api_key`) is a 422 instead of being
stored. The bounds are also what keeps storage honest: 32-bit integer columns, no NUL bytes in
text (PostgreSQL refuses them), no credentials inside a URL. Response Structs are what handlers
encode and what `gateway.cli.client` decodes; `gateway.control.admin.openapi` generates the OpenAPI
document from all of them. Nothing here does IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from domain.endpoint import CandidateSpec, Endpoint, Reason
from domain.records import MAX_STEPS, PromotionRecord, Rollout, RolloutEvent, RolloutState

# The values of a report's `final` query parameter (the planned final look), exactly: the
# handler accepts these and the OpenAPI document lists them, so neither can drift.
FINAL_TRUE: Final = ("true", "1", "yes")
FINAL_FALSE: Final = ("false", "0", "no")


class CandidateCreate(CandidateSpec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/candidates`: the candidate spec itself, the same fields, bounds and
    defaults as a `[[candidates]]` table (a named subclass only so that the OpenAPI document
    keeps its component name)."""


class PromoteRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/candidates/{name}/promote` (optional)."""

    reason: Reason = ""
    force: bool = False


class RollbackRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/rollback` (optional)."""

    reason: Reason = ""


Percent = Annotated[float, msgspec.Meta(gt=0, le=100)]


class RolloutStart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/candidates/{name}/rollout` (optional): steps in percent of new
    sessions (strictly increasing, in (0, 100], ending at 100; default 1, 5, 25, 50, 100), the
    minimum dwell per step, and `force` (needs a `reason`) to ramp without a promote verdict."""

    steps: Annotated[list[Percent], msgspec.Meta(min_length=1, max_length=MAX_STEPS)] | None = None
    min_step_s: Annotated[float, msgspec.Meta(ge=0, le=7 * 86400)] | None = None
    force: bool = False
    reason: Reason = ""


class RolloutAction(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/rollout/{pause,resume,advance,abort}` (optional)."""

    reason: Reason = ""


class RolloutView(msgspec.Struct, kw_only=True):
    """`GET /admin/rollout` and every rollout change's answer: the open rollout, else the most
    recent one (`state` "none" before the first). Weight and steps are percents of new
    sessions; `events` are the newest changes, oldest first."""

    state: RolloutState | Literal["none"]
    candidate: str | None = None
    live: str | None = None
    id: int | None = None
    weight: float = 0.0
    step: int = 0
    steps: list[float] = msgspec.field(default_factory=list)
    min_step_s: float = 0.0
    started_at: float | None = None
    step_started_at: float | None = None
    generation: int = 0
    events: list[RolloutEvent] = msgspec.field(default_factory=list)


class EndpointView(Endpoint, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """An endpoint as the API returns it: configuration, role and version; never a secret.
    Its fields are `domain.endpoint.Endpoint`'s, declared there once."""


class Counters(msgspec.Struct, kw_only=True):
    """This replica's copy accounting for one candidate (docs/design.md, "The mirror path"):
    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload + shed_capacity
    + shed_session_broken + sent + pending and sent = observed_ok + observed_error + timed_out."""

    sampled: int = 0
    deduplicated: int = 0
    dropped_overflow: int = 0
    dropped_oversize: int = 0
    shed_overload: int = 0
    shed_capacity: int = 0  # by hash under the capacity share: a sampling decision
    shed_session_broken: int = 0  # later turns of a session an earlier turn of which was lost
    sent: int = 0
    pending: int = 0
    observed_ok: int = 0
    observed_error: int = 0
    timed_out: int = 0
    dropped_on_stop: int = 0  # included in dropped_overflow
    # Scoring copies asked of this endpoint (domain.accounting.SCORE_IDENTITY_FIELDS):
    # score_sampled = score_dropped + score_sent + score_pending and
    # score_sent = score_ok + score_unsupported + score_failed.
    score_sampled: int = 0
    score_dropped: int = 0
    score_sent: int = 0
    score_pending: int = 0
    score_ok: int = 0
    score_unsupported: int = 0
    score_failed: int = 0


class BufferFill(msgspec.Struct, kw_only=True):
    """How full this replica's ring buffer for the candidate is."""

    items: int
    max_items: int
    bytes: int
    max_bytes: int
    fill_ratio: float  # the larger of items/max_items and bytes/max_bytes


class RateView(msgspec.Struct, kw_only=True):
    """The sampling rate as this gateway host realizes it (the host's mirror process measures
    it; None until it has). With `target_rps` the effective share adapts so copies/s approach
    the target, never above `sample_rate`; session-mode changes cut conversations in progress
    (`sessions_cut`) or join them after their first turn (`sessions_joined`)."""

    target_rps: float | None
    sample_rate: float  # the ceiling
    effective_sample_rate: float | None = None
    realized_copies_per_second: float | None = None
    eligible_requests_per_second: float | None = None
    rate_changes: int = 0
    sessions_cut: int = 0
    sessions_joined: int = 0
    worker: str = ""  # the worker that answered, and the share it applies now
    worker_sample_rate: float | None = None


class CandidateDetail(EndpointView, frozen=True, kw_only=True):
    """`GET /admin/candidates/{name}`: the endpoint plus live counters, buffer fill and the
    realized sampling rate."""

    counters: Counters
    buffer: BufferFill
    rate: RateView


class CandidateList(msgspec.Struct, kw_only=True):
    """`GET /admin/candidates`: every endpoint that is not live (candidates and retired), and
    the realized sampling rate of those this gateway host mirrors to, by name."""

    registry_version: int
    candidates: list[EndpointView]
    rates: dict[str, RateView] = msgspec.field(default_factory=dict)


class PromotionView(msgspec.Struct, kw_only=True):
    """An audit row of `promotions` (without the report snapshot)."""

    id: int
    action: Literal["promote", "rollback"]
    from_endpoint: str | None
    to_endpoint: str
    actor: str
    reason: str
    forced: bool
    verdict: str | None
    at: float


class PromotionResult(msgspec.Struct, kw_only=True):
    """Answer to a promote or a rollback: the audit row and the endpoint now live."""

    promotion: PromotionView
    live: EndpointView


class StatusView(msgspec.Struct, kw_only=True):
    """`GET /admin/status`: this replica's view of the registry, mirror and writer. It answers
    during a storage outage too, from the last loaded registry, with `storage_ok` false."""

    storage_ok: bool
    registry_version: int
    live: EndpointView
    candidates: list[CandidateDetail]
    writer: dict[str, int]
    last_promotion: PromotionView | None


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    message: str
    type: str
    code: int
    field: str | None = None  # set on 422: the offending body field (dotted path)
    detail: dict[str, Any] | None = None  # e.g. a refused promote: verdict and reasons


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every error the admin API returns, whatever the status."""

    error: ErrorInfo


# --- records -> views (pure) ----------------------------------------------------------------


def view(ep: Endpoint) -> EndpointView:
    """The endpoint as the API shows it: the same fields."""
    return EndpointView(**msgspec.structs.asdict(ep))


def rate_view(ep: Endpoint, rate: Mapping[str, float | None], worker: str = "") -> RateView:
    """The endpoint's sampling rate as the host realizes it (unknown names ignored)."""

    def num(key: str) -> float | None:
        value = rate.get(key)
        return None if value is None else float(value)

    def count(key: str) -> int:
        return int(rate.get(key) or 0)

    return RateView(
        target_rps=ep.target_rps,
        sample_rate=ep.sample_rate,
        effective_sample_rate=num("effective_sample_rate"),
        realized_copies_per_second=num("realized_copies_per_second"),
        eligible_requests_per_second=num("eligible_requests_per_second"),
        rate_changes=count("rate_changes"),
        sessions_cut=count("sessions_cut"),
        sessions_joined=count("sessions_joined"),
        worker=worker,
        worker_sample_rate=num("worker_sample_rate"),
    )


def detail(
    ep: Endpoint,
    counters: Mapping[str, int],
    rate: Mapping[str, float | None] | None = None,
    worker: str = "",
) -> CandidateDetail:
    """The endpoint plus this replica's counters (unknown names ignored), buffer fill and the
    host's realized sampling rate."""
    known = {f: counters[f] for f in Counters.__struct_fields__ if f in counters}
    items, size = counters.get("buffer_items", 0), counters.get("buffer_bytes", 0)
    fill = max(items / ep.buffer_max_items, size / ep.buffer_max_bytes)
    buffer = BufferFill(
        items=items,
        max_items=ep.buffer_max_items,
        bytes=size,
        max_bytes=ep.buffer_max_bytes,
        fill_ratio=round(fill, 4),
    )
    return CandidateDetail(
        **msgspec.structs.asdict(view(ep)),
        counters=Counters(**known),
        buffer=buffer,
        rate=rate_view(ep, rate or {}, worker),
    )


def rollout_view(r: Rollout | None) -> RolloutView:
    if r is None:
        return RolloutView(state="none")
    return RolloutView(
        state=r.state,
        candidate=r.candidate,
        live=r.live,
        id=r.id,
        weight=r.weight,
        step=r.step,
        steps=r.steps,
        min_step_s=r.min_step_s,
        started_at=r.started_at,
        step_started_at=r.step_started_at,
        generation=r.generation,
        events=r.events,
    )


def promotion_view(rec: PromotionRecord) -> PromotionView:
    """An audit row without its report snapshot."""
    fields = msgspec.structs.asdict(rec)
    del fields["report_snapshot"]
    return PromotionView(**fields)
