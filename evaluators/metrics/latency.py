"""Latency evaluators: TTFT, TPOT, E2E, inter-event latency, SLO exceedance, tail quantiles,
TTFT by turn.

Per pair the statistic is log(candidate / reference), reference = the control when there is one
(same mirrored load), else production. A pair counts only when both arms answered OK: failures
are judged by `evaluators.metrics.errors`, never silently dropped from there. Decisions use the
always-valid interval of the mean log-ratio; Wilcoxon and the Hodges–Lehmann ratio are reported
beside it. Quantile ratios are bootstrapped at planned looks only (a bootstrap re-run at every
look is not always-valid); at other looks tails are judged through SLO exceedance rates. TPOT
uses only pairs whose two answers were counted by one method (`evaluators.metrics.tokens`): an
SSE event is not a token.

The metrics by turn use only whole sessions: a later turn counts only when every earlier turn of
its session reached the candidate (it answered with a status). A candidate that answers turn 2
without having seen turn 1 has a cold cache exactly where a KV-reuse candidate should shine, so
its later-turn TTFT would look worse than it is (`whole_sessions`; the mirror sheds such turns,
`shed_session_broken`, but a session begun before the report's window, on another host, or
sampled per request still arrives headless). The results say how many sessions were left out
and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from domain import kinds
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    indicator_difference,
    judge_bounded,
    judge_mean,
    mean_stat,
    ungate,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import tokens
from evaluators.pairs.types import ArmColumns, PairSet
from evaluators.stats.paired import bootstrap_quantile_ratio, hodges_lehmann, mcnemar, subsample

F = NDArray[np.float64]
B = NDArray[np.bool_]

# Without a control, production ran at its own live load and the candidate at the mirrored one:
# a latency difference mixes the configuration with the load, so nothing is decided on it.
NO_SAME_LOAD = (
    "no control: production's latency is at its live load, not the candidate's, so this is "
    "not a fair comparison; register a control (kind = control) to gate on it"
)

# Turn buckets of the by-turn table: 1, 2, 3, 4, and 5 or more.
TURN_BUCKETS = 5


def both_ok(ctx: EvalContext) -> tuple[ArmColumns, ArmColumns, B]:
    """(candidate, reference, mask of pairs where both answered OK)."""
    ps = ctx.pairs
    ref = ps.arm(ctx.reference)
    return ps.candidate, ref, ps.candidate.ok & ref.ok


def log_ratio(cand: NDArray[np.float32], ref: NDArray[np.float32], mask: B) -> tuple[F, B]:
    """log(cand/ref) over the pairs in mask where both values are positive and finite."""
    # Tested on the float32 columns (the same answers as on their float64 values); only the
    # pairs used are widened, so the temporaries are per used pair, not per pair twice over.
    use = mask & np.isfinite(cand) & np.isfinite(ref) & (cand > 0) & (ref > 0)
    return np.log(cand[use].astype(np.float64) / ref[use].astype(np.float64)), use


def hl_detail(x: F, ctx: EvalContext, c: F, r: F) -> Detail:
    """Per-arm medians, and at planned looks the Hodges–Lehmann ratio with its fixed-sample
    interval (at the report's one level, 1 - 2α) and the Wilcoxon p: fixed-sample numbers are
    computed only where a fixed-sample reading is valid, and decide nothing."""
    medians: Detail = {
        "median_candidate_s": float(np.median(c)) if len(c) else None,
        "median_reference_s": float(np.median(r)) if len(r) else None,
    }
    if not ctx.planned_look:
        return medians
    hl = hodges_lehmann(x, 2 * ctx.settings.alpha, ctx.settings.hl_max_pairs)
    return medians | {
        "hl_ratio": float(np.exp(hl.estimate)),
        "hl_low": float(np.exp(hl.low)) if np.isfinite(hl.low) else None,
        "hl_high": float(np.exp(hl.high)) if np.isfinite(hl.high) else None,
        "hl_n": hl.n,
        "wilcoxon_p": hl.p_wilcoxon if np.isfinite(hl.p_wilcoxon) else None,
    }


def _latency(
    ctx: EvalContext, spec: MetricSpec, column: str, extra: B | None = None
) -> MetricResult:
    """The paired log-ratio of one per-pair quantity (`column`, as declared in domain)."""
    cand, ref, ok = both_ok(ctx)
    if extra is not None:
        ok = ok & extra
    c_all, r_all = getattr(cand, column), getattr(ref, column)
    x, use = log_ratio(c_all, r_all, ok)
    if len(x) == 0:
        shown = column.removesuffix("_s").upper()
        why = f"no pair where both arms answered with a measurable {shown}"
        return empty_result(spec, ctx.reference, why)
    detail = hl_detail(x, ctx, c_all[use].astype(np.float64), r_all[use].astype(np.float64))
    res = judge_mean(spec, x, ctx, use=use, reference=ctx.reference, detail=detail)
    # A goal that cannot be shown fairly blocks promotion; a guardrail only stops gating.
    return res if ctx.has_control else ungate(res, NO_SAME_LOAD, blocks=spec.role == "goal")


def latency_spec(s: VerdictSettings, name: str, label: str, critical: bool = True) -> MetricSpec:
    """A latency ratio: critical (TTFT, TPOT, E2E) or diagnostic (inter-event latency)."""
    return MetricSpec(
        name=name,
        label=label,
        role="critical" if critical else "diagnostic",
        harm="higher",
        scale="ratio",
        delta=s.latency_delta,
        critical=s.latency_critical if critical else None,
        unit="ratio",
    )


def later_turns_spec(s: VerdictSettings, kind: str) -> MetricSpec:
    """TTFT on turns >= 2: the goal of a `bi-kv` candidate, a diagnostic otherwise."""
    is_goal = kinds.is_goal(kind, "ttft_later_turns")
    return MetricSpec(
        name="ttft_later_turns",
        label="TTFT, turns ≥ 2",
        role="goal" if is_goal else "diagnostic",
        harm="higher",
        scale="ratio",
        delta=None if is_goal else s.latency_delta,
        goal=s.goal_ttft_ratio if is_goal else None,
        unit="ratio",
    )


def slo_spec(s: VerdictSettings, field: str) -> MetricSpec:
    """Exceedance of the TTFT or E2E SLO: a rate-difference guardrail."""
    slo = s.slo_ttft_s if field == "ttft" else s.slo_e2e_s
    return MetricSpec(
        name=f"{field}_slo",
        label=f"{field.upper()} > {slo:g} s",
        role="guardrail",
        harm="higher",
        scale="difference",
        delta=s.slo_exceedance_delta,
        unit="rate",
    )


def ttft(ctx: EvalContext) -> list[MetricResult]:
    """Time to first token."""
    return [_latency(ctx, latency_spec(ctx.settings, "ttft", "TTFT"), "ttft_s")]


def tpot(ctx: EvalContext) -> list[MetricResult]:
    """Time per output token after the first, on pairs whose tokens were counted one way."""
    cand, ref, ok = both_ok(ctx)
    use = tokens.counted(cand, ref, ok)
    res = _latency(ctx, latency_spec(ctx.settings, "tpot", "TPOT"), "tpot_s", use)
    return [tokens.gate_on_counts(res, ok, use)]


def e2e(ctx: EvalContext) -> list[MetricResult]:
    """End-to-end time."""
    return [_latency(ctx, latency_spec(ctx.settings, "e2e", "E2E"), "e2e_s")]


def first_turn_spec(s: VerdictSettings) -> MetricSpec:
    """TTFT on the first turn of a session: critical for kinds in `kinds.GATES_FIRST_TURN`."""
    return MetricSpec(
        name="ttft_first_turn",
        label="TTFT, turn 1",
        role="critical",
        harm="higher",
        scale="ratio",
        delta=s.latency_delta,
        critical=s.latency_critical,
        unit="ratio",
    )


@dataclass(frozen=True, slots=True)
class Whole:
    """Which pairs belong to a session whose earlier turns all reached the candidate."""

    mask: B  # the pair's earlier turns (if any) all reached the candidate
    lost: int  # sessions left out: an earlier turn's copy was sent, never answered
    missing: int  # ... an earlier turn is not among the pairs (shed, dropped, or earlier)
    pairs: int  # later-turn pairs the candidate answered, left out

    def notes(self) -> list[str]:
        if not self.lost and not self.missing:
            return []
        return [
            f"{self.pairs:,} later-turn pairs of {self.lost + self.missing:,} sessions left "
            f"out: an earlier turn never reached the candidate ({self.lost:,} sessions: its copy "
            f"went unanswered; {self.missing:,}: it is not among the pairs, shed or dropped by "
            "the mirror, sampled per request, or before the window), so the candidate answered "
            "them headless, with a cold cache"
        ]


def whole_sessions(ps: PairSet) -> Whole:
    """The pairs whose session's earlier turns all reached the candidate (turn 0 and pairs
    without a session always count), and the sessions left out by reason."""
    n = ps.n
    mask: B = np.ones(len(ps.turn), dtype=bool)
    session, turn = ps.session[:n], ps.turn[:n].astype(np.int64)
    cand = ps.candidate
    later = np.flatnonzero((session != 0) & (turn >= 1))
    if len(later) == 0:
        return Whole(mask, 0, 0, 0)
    heads, prefix = _reached_prefix(session, turn, cand.present[:n] & (cand.status[:n] > 0))
    at = np.minimum(np.searchsorted(heads, session[later]), max(0, len(heads) - 1))
    found = heads[at] == session[later] if len(heads) else np.zeros(len(later), dtype=bool)
    gap = np.where(found, prefix[at] if len(heads) else 0, 0)  # the first turn not reached
    bad = turn[later] > gap
    if not np.any(bad):
        return Whole(mask, 0, 0, 0)
    mask[later[bad]] = False
    # Why each session was left out: its first turn not reached is a pair the candidate never
    # answered (lost), or no pair at all (missing).
    first_gap = dict(zip(session[later[bad]].tolist(), gap[bad].tolist(), strict=True))
    rows = np.flatnonzero(np.isin(session, np.fromiter(first_gap, np.uint64, len(first_gap))))
    have = set(zip(session[rows].tolist(), turn[rows].tolist(), strict=True))
    lost = sum(1 for key in first_gap.items() if key in have)
    answered = int(np.count_nonzero(cand.present[later[bad]]))
    return Whole(mask, lost, len(first_gap) - lost, answered)


def _reached_prefix(
    session: NDArray[np.uint64], turn: NDArray[np.int64], reached: B
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Per session (sorted) with a turn that reached the candidate: how many turns from 0 on
    reached it without a gap (its unique turns reached, sorted, are 0, 1, ... that far)."""
    keyed = np.flatnonzero((session != 0) & reached)
    if len(keyed) == 0:
        return np.array([], dtype=np.uint64), np.array([], dtype=np.int64)
    order = np.lexsort((turn[keyed], session[keyed]))
    s, t = session[keyed][order], turn[keyed][order]
    first = np.r_[True, (s[1:] != s[:-1]) | (t[1:] != t[:-1])]  # unique (session, turn)
    s, t = s[first], t[first]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    rank = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
    return s[starts], np.add.reduceat((t == rank).astype(np.int64), starts)


def _by_turn(ctx: EvalContext, turns: B, spec: MetricSpec) -> MetricResult:
    """A TTFT metric over some turns, split sessions and headless later turns left out and the
    result saying so: a turn another replica handled may have reached the candidate out of order
    or at once; a later turn whose earlier turn never reached it was answered with a cold
    cache."""
    ps = ctx.pairs
    whole = whole_sessions(ps)
    res = _latency(ctx, spec, "ttft_s", extra=turns & ~ps.split & whole.mask)
    left_out = int(np.count_nonzero(turns & ps.split & ps.candidate.present))
    if left_out:
        res.notes.append(f"{left_out:,} {SPLIT_REASON}")
    if np.any(turns & ~whole.mask):
        res.notes.extend(whole.notes())
        res.detail.update(
            headless_sessions_lost=whole.lost,
            headless_sessions_missing=whole.missing,
            headless_pairs=whole.pairs,
        )
    return res


# Why pairs are left out of every analysis by turn (report caveat, metric notes).
SPLIT_REASON = (
    "pairs of split sessions left out: their turns were handled by more than one gateway "
    "replica, so their copies could reach the candidate out of order or at once"
)


def ttft_first_turn(ctx: EvalContext) -> list[MetricResult]:
    """TTFT on turn 1: a KV-reuse candidate can trade turn 1 for later turns, so it is gated."""
    if ctx.candidate.kind not in kinds.GATES_FIRST_TURN:
        return []
    return [_by_turn(ctx, ctx.pairs.turn == 0, first_turn_spec(ctx.settings))]


def ttft_later_turns(ctx: EvalContext) -> list[MetricResult]:
    """TTFT on turns >= 2 of a conversation: the goal of a KV-reuse (`bi-kv`) candidate."""
    return [_by_turn(ctx, ctx.pairs.turn >= 1, later_turns_spec(ctx.settings, ctx.candidate.kind))]


def inter_event(ctx: EvalContext) -> list[MetricResult]:
    """Inter-event latency (gaps between token-carrying SSE events), through each response's
    median and p99 gap, with the tokens each event carried."""
    out = []
    cand, ref, ok = both_ok(ctx)
    per_event = {
        "tokens_per_event_candidate": tokens.tokens_per_event(cand, ok),
        "tokens_per_event_reference": tokens.tokens_per_event(ref, ok),
    }
    labels = (("inter_event_p50", "inter-event p50"), ("inter_event_p99", "inter-event p99"))
    for name, label in labels:
        spec = latency_spec(ctx.settings, name, label, critical=False)
        res = _latency(ctx, spec, f"{name}_s")
        res.detail.update(per_event)
        if any(v is not None and v > 1.0 for v in per_event.values()):
            res.notes.append(
                "events carried several tokens each (tokens_per_event): a gap between events "
                "is not a gap between tokens; TPOT is the per-token figure"
            )
        out.append(res)
    return out


def slo_exceedance(ctx: EvalContext) -> list[MetricResult]:
    """Rate of responses over the TTFT / E2E SLO, candidate minus reference (McNemar)."""
    s = ctx.settings
    cand, ref, ok = both_ok(ctx)
    out = []
    for field, slo in (("ttft", s.slo_ttft_s), ("e2e", s.slo_e2e_s)):
        spec = slo_spec(s, field)
        c, r = getattr(cand, f"{field}_s"), getattr(ref, f"{field}_s")
        use = ok & np.isfinite(c) & np.isfinite(r)
        over_c, over_r = c[use] > slo, r[use] > slo
        mn = mcnemar(over_c, over_r, s.min_discordant)
        detail: Detail = {
            "rate_candidate": float(over_c.mean()) if len(over_c) else None,
            "rate_reference": float(over_r.mean()) if len(over_r) else None,
            "slo_s": slo,
            "discordant_worse": mn.worse,
            "discordant_better": mn.better,
            "mcnemar_p": mn.p if np.isfinite(mn.p) else None,
        }
        d = indicator_difference(over_c, over_r)
        res = judge_bounded(spec, d, ctx, use=use, reference=ctx.reference, detail=detail)
        out.append(res if ctx.has_control else ungate(res, NO_SAME_LOAD, blocks=False))
    return out


def tail_quantiles(ctx: EvalContext) -> list[MetricResult]:
    """p95 / p99 ratios of TTFT and E2E by paired (session) bootstrap, at planned looks only."""
    s = ctx.settings
    cand, ref, ok = both_ok(ctx)
    out = []
    for field, label in (("ttft", "TTFT"), ("e2e", "E2E")):
        for q in (0.95, 0.99):
            spec = MetricSpec(
                name=f"{field}_p{round(q * 100)}",
                label=f"{label} p{round(q * 100)}",
                role="diagnostic",
                harm="higher",
                scale="ratio",
                unit="ratio",
            )
            c, r = getattr(cand, f"{field}_s"), getattr(ref, f"{field}_s")
            use = ok & np.isfinite(c) & np.isfinite(r)
            n = int(np.count_nonzero(use))
            need = int(np.ceil(4 * q / (1 - q)))
            if not ctx.planned_look:
                out.append(empty_result(spec, ctx.reference, "computed at planned looks only"))
                continue
            if n <= need:
                res = empty_result(spec, ctx.reference, f"insufficient data: {n} ≤ {need} pairs")
                res.status, res.n = "insufficient", n
                out.append(res)
                continue
            idx = np.flatnonzero(use)
            idx = idx[subsample(len(idx), s.bootstrap_max_units)]
            g = ctx.session_groups(idx)
            est, lo, hi = bootstrap_quantile_ratio(
                c[idx].astype(np.float64),
                r[idx].astype(np.float64),
                q,
                groups=g,
                draws=s.bootstrap_draws,
                alpha=s.alpha,
            )
            res = empty_result(spec, ctx.reference, "")
            res.status, res.n = "info", n
            res.estimate, res.ci_low, res.ci_high = est, lo, hi
            res.detail = {"bootstrap_draws": s.bootstrap_draws, "resampled": len(idx)}
            out.append(res)
    return out


def _table_row(ctx: EvalContext, x: F, use: B, k: int) -> dict[str, float | int | str | None]:
    """A table row on the verdict's estimand: exp(mean over units of the unit's mean log-ratio),
    with an always-valid interval at α / k (Bonferroni over the table's k rows, so that at every
    look the whole table errs with probability <= α), and its always-valid two-sided p."""
    s = ctx.settings
    v, _, n = ctx.units.means(x, use)
    row: dict[str, float | int | str | None] = {"n": n, "units": len(v)}
    if len(v) < 2:
        return row
    stat = mean_stat(v, None, s)
    lo, hi = stat.bounds(s.alpha / k)
    p = min(1.0, 2 * float(min(stat.p(0.0, "below")[0], stat.p(0.0, "above")[0])))
    row.update(
        ratio=float(np.exp(stat.mean[0])),
        ci_low=float(np.exp(lo[0])),
        ci_high=float(np.exp(hi[0])),
        p=p,
    )
    return row


def ttft_by_turn(ctx: EvalContext) -> list[dict[str, float | int | str | None]]:
    """Rows of the TTFT-by-turn table: per turn bucket, n, medians per arm, ratio and interval.

    The ratio is the verdict's estimand and its interval always-valid (Bonferroni over the
    buckets), so the table can be read at every look. Split sessions, and later turns whose
    earlier turns did not all reach the candidate (`whole_sessions`), are left out.
    """
    ps = ctx.pairs
    cand, ref, ok = both_ok(ctx)
    every, base = log_ratio(cand.ttft_s, ref.ttft_s, ok & ~ps.split & whole_sessions(ps).mask)
    turn = np.minimum(ps.turn, TURN_BUCKETS - 1)  # bucket b holds turn index b - 1 (the last: ≥)
    rows: list[dict[str, float | int | str | None]] = []
    for bucket in range(1, TURN_BUCKETS + 1):
        x, use = _within(every, base, turn == bucket - 1)
        label = f"{bucket}+" if bucket == TURN_BUCKETS else str(bucket)
        row: dict[str, float | int | str | None] = {"turn": label}
        row.update(_table_row(ctx, x, use, TURN_BUCKETS))
        if len(x):
            row.update(
                median_candidate_s=float(np.median(cand.ttft_s[use])),
                median_reference_s=float(np.median(ref.ttft_s[use])),
                median_production_s=float(np.nanmedian(ps.production.ttft_s[use])),
                cached_fraction_candidate=_cached_fraction(cand, use),
                cached_fraction_reference=_cached_fraction(ref, use),
            )
        rows.append(row)
    return rows


def _within(every: F, base: B, mask: B) -> tuple[F, B]:
    """`log_ratio` over `mask` from the one over every pair: `every` holds the values of the
    pairs in `base`, in order (the same values, computed once for all of a table's rows)."""
    return every[mask[base]], base & mask


def _cached_fraction(arm: ArmColumns, use: B) -> float | None:
    prompt, cached = arm.prompt_tokens[use], arm.cached_tokens[use]
    known = np.isfinite(prompt) & np.isfinite(cached) & (prompt > 0)
    if not np.any(known):
        return None
    return float(np.sum(cached[known]) / np.sum(prompt[known]))


def ttft_slices(ctx: EvalContext) -> list[dict[str, float | int | str | None]]:
    """TTFT ratio per diagnostic slice (turn, prompt length, model, streaming); never gating.

    Each row is the verdict's estimand with an always-valid interval at α / k and `q` its
    always-valid p-value times k (Bonferroni over the k slices), so no look of the table
    shows a slice "significant" by chance with probability above α.
    """
    ps = ctx.pairs
    cand, ref, ok = both_ok(ctx)
    slices: list[tuple[str, str, B]] = [
        ("turn", "1", (ps.turn == 0) & ~ps.split),
        ("turn", "≥ 2", (ps.turn >= 1) & ~ps.split & whole_sessions(ps).mask),
        ("stream", "yes", ps.stream),
        ("stream", "no", ~ps.stream),
    ]
    prompt = ps.production.prompt_tokens
    known = np.isfinite(prompt)
    if np.count_nonzero(known) >= 40:
        edges = np.quantile(prompt[known], [0.25, 0.5, 0.75])
        bins = np.digitize(prompt, edges)
        for b, name in enumerate(("Q1", "Q2", "Q3", "Q4")):
            slices.append(("prompt tokens", name, known & (bins == b)))
    if len(ps.models) > 1:
        slices.extend(("model", m or "?", ps.model == i) for i, m in enumerate(ps.models))
    k = len(slices)
    every, base = log_ratio(cand.ttft_s, ref.ttft_s, ok)
    rows: list[dict[str, float | int | str | None]] = []
    for dim, value, mask in slices:
        x, use = _within(every, base, mask)
        if len(x) < 10:
            continue
        row: dict[str, float | int | str | None] = {"slice": dim, "value": value}
        row.update(_table_row(ctx, x, use, k))
        p = row.get("p")
        row["q"] = min(1.0, k * p) if isinstance(p, float) else None
        if "ratio" in row:
            rows.append(row)
    return rows
