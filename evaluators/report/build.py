"""Build the promotion report: from pairs (pure) and, once, from storage (`evaluate`).

`build_report` runs every registered evaluator, judges the verdict and gathers the tables;
`evaluate` is the one load-and-build sequence (admin API, `canary report`, the demo): endpoints,
pairs, accounting from storage, then `build_report` off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import numpy as np

from domain.accounting import (
    CONTROL_TOKENIZE_REQUESTS_KEY,
    SHED_FIRST_AT,
    SHED_LAST_AT,
    SHED_SECONDS,
    TOKENIZE_REQUESTS_KEY,
)
from domain.capture import CapacitySummary
from domain.endpoint import Endpoint
from evaluators.human.data import HumanLabels
from evaluators.judge.metric import Detail, EvalContext, MetricResult
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import Reason, judge, summary
from evaluators.metrics import cost, latency, throughput, tokens, toolcalls
from evaluators.metrics.catalog import run_all
from evaluators.pairs.gradings import Gradings
from evaluators.pairs.spill import Spill
from evaluators.pairs.types import PairSet, ProgressFactory
from evaluators.report.model import SCHEMA_VERSION, PairsSummary, Report

if TYPE_CHECKING:  # the loader (and the storage it reads) is imported when a report is loaded
    from evaluators.pairs.load import Engine

__all__ = ["ProgressFactory", "build_report", "coverage_of", "evaluate"]


def coverage_of(accounting: dict[str, int], pairs: PairSet) -> float | None:
    """Fraction of sampled copies observed: from the copy accounting, else from the pairs.

    When the counters lag what was stored (fewer copies observed than pairs present), the
    coverage is never more than the pairs support, present / (present + lost); after a crash
    (`stale_replicas`), the dead replica's pending copies count as missing too.

    A copy shed by hash under the mirror's capacity share (`shed_capacity`) is not due: the
    sampler's hash chose it out of the sample (sessions whole), as it chooses the copies never
    sampled, so it is a smaller sample, not a missing copy (the caveats say how much and when).
    A copy the loop guard shed (`shed_overload`, decided by when it came) is missing."""
    observed = sum(accounting.get(k, 0) for k in ("observed_ok", "observed_error", "timed_out"))
    due = (
        accounting.get("sampled", 0)
        - accounting.get("deduplicated", 0)
        - accounting.get("shed_capacity", 0)
        - accounting.get("pending", 0)
    )
    present = int(np.count_nonzero(pairs.candidate.present))
    from_pairs = present / (present + pairs.lost) if present + pairs.lost else None
    if due <= 0:
        return from_pairs
    from_counters = min(1.0, observed / due)
    crashed = accounting.get("stale_replicas", 0) > 0
    if crashed and present:
        # A dead replica's copies still "pending" will never be observed: count them missing.
        return min(from_counters, present / (present + pairs.lost + pairs.pending))
    if observed < present and from_pairs is not None:  # the counters lag the pairs
        return min(from_counters, from_pairs)
    return from_counters


def _pairs_summary(ctx: EvalContext, coverage: float | None, used: int) -> PairsSummary:
    ps = ctx.pairs
    present = ps.candidate.present
    t = ps.received_at
    n = int(np.count_nonzero(present))
    split = present & ps.split
    split_pairs = int(np.count_nonzero(split))
    return PairsSummary(
        n=n,
        lost=ps.lost,
        pending=ps.pending,
        used_latency=used,
        with_control=int(np.count_nonzero(present & ps.control.present)),
        temperature0=int(np.count_nonzero(present & (ps.temperature == 0))),
        json_requested=int(np.count_nonzero(present & ps.json_requested)),
        tools_requested=int(np.count_nonzero(present & ps.tools_requested)),
        sessions=len(np.unique(ps.session[present & (ps.session != 0)])),
        later_turns=int(np.count_nonzero(present & (ps.turn >= 1))),
        reference=ctx.reference,
        control=ctx.control.name if ctx.control and ps.has_control else None,
        live=ctx.live.name if ctx.live else None,
        window_start=float(t[0]) if ps.n else None,
        window_end=float(t[-1]) if ps.n else None,
        coverage=coverage,
        planned_look=ctx.planned_look,
        split_sessions=len(np.unique(ps.session[split])),
        split_pairs=split_pairs,
        split_share=split_pairs / n if n else 0.0,
    )


def _shed_by_hash(accounting: dict[str, int]) -> str | None:
    """How many copies were shed by hash past the mirror's capacity, and when (not missing:
    `coverage_of`)."""
    shed = accounting.get("shed_capacity", 0)
    if not shed:
        return None
    share = shed / max(1, accounting.get("sampled", 0))
    line = (
        f"{shed:,} sampled copies ({share:.1%}) were shed by hash while the mirror was past its "
        "capacity (the sampler's hash chose which, sessions whole: a smaller sample, not "
        "missing copies, so coverage leaves them out)"
    )
    first, last = accounting.get(SHED_FIRST_AT), accounting.get(SHED_LAST_AT)
    if first is not None and last is not None:

        def at(t: int) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))

        line += (
            f"; a capacity share was in force {accounting.get(SHED_SECONDS, 0):,} s between "
            f"{at(first)} and {at(last)}"
        )
    return line


def _window_caveat(outside: int, whole_run: float | None) -> list[str]:
    """Why a window's coverage comes from its pairs, not from the copy counters."""
    if not outside:
        return []
    run = f" ({whole_run:.1%} observed over the whole run)" if whole_run is not None else ""
    return [
        f"the copy accounting counts the candidate's whole run{run}, and {outside:,} of its "
        "exchanges lie outside this window: coverage is the window's own, its accepted copies "
        "observed against those lost, which cannot see copies dropped before the ring"
    ]


def _caveats(
    ctx: EvalContext, accounting: dict[str, int], results: list[MetricResult]
) -> list[str]:
    out = []
    if not ctx.has_control:
        out.append(
            "no control candidate: latency is compared with production, which ran at a "
            "different load, and agreement with an unknown noise floor, so neither gates "
            "(the candidate cannot be promoted on latency); register a control (kind = control)"
        )
    split = ctx.pairs.candidate.present & ctx.pairs.split
    if np.any(split):
        sessions = len(np.unique(ctx.pairs.session[split]))
        present = int(np.count_nonzero(ctx.pairs.candidate.present))
        share = int(np.count_nonzero(split)) / max(1, present)
        out.append(
            f"{sessions:,} sessions ({share:.1%} of the pairs) were handled by more than one "
            "gateway replica: their turns could reach the candidate out of order or at once, so "
            "they are left out of TTFT by turn and of the turn-1 and later-turn TTFT metrics; "
            "key the load balancer on the X-Session-ID header (README: a balancer that keeps a "
            "session on one replica)"
        )
    dropped = sum(
        accounting.get(k, 0) for k in ("dropped_overflow", "dropped_oversize", "shed_overload")
    )
    if dropped:
        out.append(
            f"{dropped:,} sampled copies were dropped before reaching the candidate "
            f"({accounting.get('shed_overload', 0):,} of them shed by the mirror's loop guard); "
            "drops happen under load, so the observed pairs under-represent busy periods"
        )
    shed_line = _shed_by_hash(accounting)
    if shed_line:
        out.append(shed_line)
    for key, arm in (
        (TOKENIZE_REQUESTS_KEY, "candidate"),
        (CONTROL_TOKENIZE_REQUESTS_KEY, "control"),
    ):
        if accounting.get(key, 0):
            out.append(
                f"the {arm}'s engine counted every arm's output tokens: it answered "
                f"{accounting[key]:,} /tokenize requests beside its copies, load the other arm "
                'did not carry; [mirror] token_counter = "local:<tokenizer.json>" asks no engine'
            )
    if ctx.units.by_session:
        out.append(
            "sampling by session: every gating interval bets on whole sessions (each session's "
            "mean per-pair difference), so n counts sessions as the unit of independence, and "
            "bootstraps resample whole sessions"
        )
    if ctx.units.open_pairs:
        out.append(
            f"{ctx.units.open_pairs:,} pairs wait for their session to end (idle "
            f"{ctx.settings.session_idle_s:g} s) or their copies' timeout: a look uses only "
            "pairs whose outcome cannot change any more"
        )
    out.append(cost.caveat(ctx))
    out.append(
        f"intervals are always-valid (each bound holds at one-sided level α = "
        f"{ctx.settings.alpha:g} over every look, i.e. {1 - 2 * ctx.settings.alpha:.0%} "
        f"two-sided); {horizon_line(ctx)}; Hodges–Lehmann estimates and McNemar/Wilcoxon "
        "p-values in the details are fixed-sample and decide nothing"
    )
    if any(r.more_pairs and r.more_pairs > 0 for r in results if r.gating):
        out.append("'more pairs' extrapolates the interval's shrink rate: a rough guide only")
    return out


def horizon_line(ctx: EvalContext) -> str:
    """Which horizon the latency, length and cost sequences are tuned to, and whose it is."""
    unit = "sessions" if ctx.units.by_session else "pairs"
    whose = (
        "set for this candidate"
        if "horizon_units" in (ctx.candidate.verdict or {})
        else "the default for an experiment of a few hundred sessions; `canary plan` states one"
    )
    share = ctx.settings.planned_share
    design = (
        f"{share:.0%} of α on a boundary planned to it (valid at any looks up to it), the rest "
        "on a mixture that also holds past it"
        if share > 0
        else "a normal mixture, narrowest there"
    )
    return (
        f"latency, length and cost intervals are tuned to a horizon of "
        f"{ctx.settings.horizon_units:,} {unit} ({whose}): {design}"
    )


def pair_rate(pairs: PairSet, used: int) -> float | None:
    """Usable pairs per second over the window, or None when the window has no length."""
    t = pairs.received_at[: pairs.n]
    if used < 2 or len(t) < 2:
        return None
    span = float(np.nanmax(t) - np.nanmin(t))
    return used / span if span > 0 else None


def _set_eta(results: list[MetricResult], pairs: PairSet, used: int) -> None:
    """Seconds until each metric's `more_pairs` arrive at the observed pair rate."""
    rate = pair_rate(pairs, used)
    for r in results:
        if rate and r.more_pairs:
            r.eta_s = r.more_pairs / rate


def build_report(
    pairs: PairSet,
    *,
    candidate: Endpoint,
    live: Endpoint | None,
    control: Endpoint | None,
    accounting: dict[str, int],
    settings: VerdictSettings,
    planned_look: bool = False,
    as_of: float | None = None,
    trajectories: bool = True,
    capacity: CapacitySummary | None = None,
    gradings: Gradings | None = None,
    control_gradings: Gradings | None = None,
    tool_errors: list[tuple[str, int]] | None = None,
    labels: HumanLabels | None = None,
    accounting_outside: int = 0,
) -> Report:
    """The report for one candidate over the given pairs (pure: no IO, no clock but the stamp).
    `gradings`: its LLM grader's verdicts (a model upgrade), `control_gradings` the control's
    against production (the grader's A/A). `tool_errors`: the candidate's most frequent first
    tool-call problems (value free), shown with tool-call validity.

    The candidate's own `verdict` are applied on top of `settings`. `as_of` is "now"
    for deciding which sessions are over and which copies may still answer (None: all of the
    given pairs are final); `trajectories=False` skips the interval-against-pairs plot data.
    `accounting_outside`: how many of the candidate's exchanges lie outside this window (a
    window cut by `since`/`until`); the counters are the whole run's, so then the coverage is
    the window's own pairs' (`coverage_of` with no counters) and a caveat says so.
    """
    if candidate.verdict:
        settings = settings.with_overrides(candidate.verdict)
    ctx = EvalContext(
        pairs=pairs,
        settings=settings,
        candidate=candidate,
        live=live,
        control=control,
        planned_look=planned_look,
        as_of=as_of,
        trajectories=trajectories,
        capacity=capacity,
        gradings=gradings,
        control_gradings=control_gradings,
        labels=labels,
    )
    results = run_all(ctx)
    if tool_errors:
        toolcalls.name_first_errors(results, tool_errors)
    _, _, ok = latency.both_ok(ctx)
    used = int(np.count_nonzero(ok))
    coverage = coverage_of({} if accounting_outside else accounting, pairs)
    window_caveat = _window_caveat(accounting_outside, coverage_of(accounting, pairs))
    _set_eta(results, pairs, used)
    pairs.release()
    verdict, reasons = judge(
        results, n_pairs=used, coverage=coverage, planned=planned_look, settings=settings
    )
    reasons.insert(0, Reason("verdict", verdict, summary(verdict, results, reasons)))
    metrics = {r.name: r for r in results}
    if "ttft" in metrics:
        metrics["ttft"].slices = latency.ttft_slices(ctx)
        pairs.release()
    load = throughput.arms_load(pairs)
    pairs.release()
    for arm, row in cost.cost_table(ctx, load).items():
        load[arm].update(row)
    pairs_summary = _pairs_summary(ctx, coverage, used)
    pairs.release()
    by_turn = latency.ttft_by_turn(ctx)
    pairs.release()
    names = [e.name for e in (candidate, control) if e is not None]
    methods = tokens.methods_of(names)
    arms = ["production", "candidate"] + (["control"] if pairs.has_control else [])
    counts: dict[str, Detail] = {arm: tokens.arm_counts(pairs, arm, methods) for arm in arms}
    pairs.release()
    return Report(
        schema_version=SCHEMA_VERSION,
        candidate=candidate.name,
        kind=candidate.kind,
        verdict=verdict,
        reasons=reasons,
        pairs=pairs_summary,
        metrics=metrics,
        accounting=dict(accounting),
        ttft_by_turn=by_turn,
        arms_load=load,
        generated_at=time.time(),
        caveats=_caveats(ctx, accounting, results) + window_caveat,
        token_counts=counts,
        token_metrics=tokens.gating_summary(results),
    )


async def evaluate(
    engine: Engine,
    candidate_name: str,
    *,
    since: float | None = None,
    until: float | None = None,
    settings: VerdictSettings,
    planned_look: bool = False,
    progress: ProgressFactory | None = None,
    segmented: bool = True,
    max_pairs: int | None = None,
    spill: Spill | None = None,
) -> Report:
    """Load the candidate's pairs and accounting from storage and build its report.

    The candidate's `verdict` apply on top of `settings` (InvalidSettings names a bad
    one). `since` defaults to the candidate's creation. EndpointNotFound when no endpoint has that
    name.
    `segmented` False builds the pairs from the rows in one pass instead of reading the stored
    segments (the same report; tests compare the two). `max_pairs`: ReportTooLarge for a
    window holding more pairs (the report process's `report_max_pairs`). `spill`: where a
    window's columns go when they would take more memory than it allows (`report_spill_*`).
    """
    from evaluators.pairs import load as store

    cand, live, control = await store.load_endpoints(engine, candidate_name)  # EndpointNotFound
    effective = settings.with_overrides(cand.verdict)  # InvalidSettings on a bad override
    start = since if since is not None else (cand.created_at or None)
    ps = await store.load_pairs(
        engine,
        candidate_name,
        since=start,
        until=until,
        progress=progress,
        control=control.name if control else False,
        similarity_max_pairs=effective.similarity_max_pairs,
        max_chars=effective.similarity_max_chars,
        segmented=segmented,
        max_pairs=max_pairs,
        spill=spill,
    )
    accounting = await store.load_accounting(engine, candidate_name)
    if control is not None:  # the control's engine may have counted every arm's tokens
        counted = (await store.load_accounting(engine, control.name)).get(TOKENIZE_REQUESTS_KEY)
        if counted:
            accounting[CONTROL_TOKENIZE_REQUESTS_KEY] = counted
    outside = 0
    if until is not None:
        outside += await store.count_pairs(engine, candidate_name, since=until)
    if since is not None and cand.created_at is not None and since > cand.created_at:
        outside += await store.count_pairs(
            engine, candidate_name, since=cand.created_at, until=since
        )
    # Units close against the clock: a live look must not use sessions still under way. "Now"
    # is never before the newest pair: a replica's clock may run ahead of this one's.
    now = time.time() if until is None else min(until, time.time())
    newest = float(np.nanmax(ps.received_at[: ps.n])) if ps.n else now
    as_of = max(now, newest)
    capacity = await store.load_capacity(engine, candidate_name)
    tool_errors = await store.load_tool_errors(engine, candidate_name, since=start, until=until)
    gradings = control_gradings = labels = None
    if cand.grader is not None:
        gradings = await store.load_gradings(engine, candidate_name, since=start, until=until)
        labels = await store.load_labels(
            engine, candidate_name, cand.grader.label_rate, since=start, until=until
        )
        if control is not None:
            control_gradings = await store.load_gradings(
                engine, control.name, since=start, until=until
            )
    # The statistics are CPU work: run them off the event loop, so a report requested from a
    # running gateway (admin API, rollout gate) never stalls the proxy for its whole duration.
    return await asyncio.to_thread(
        build_report,
        ps,
        candidate=cand,
        live=live,
        control=control,
        accounting=accounting,
        settings=settings,
        planned_look=planned_look,
        as_of=as_of,
        capacity=capacity,
        gradings=gradings,
        control_gradings=control_gradings,
        tool_errors=tool_errors,
        labels=labels,
        accounting_outside=outside,
    )
