"""Preference from an LLM grader: how a model upgrade is judged (STATISTICS.md, "Pairwise
preference from an LLM grader"; docs/grading.md).

A verdict scores the candidate +1 (preferred), 0 (tie) or -1 (production preferred); a pair's
score is the mean of its verdicts over the orders it was graded in (a pair graded both ways
scores -1, -1/2, 0, 1/2 or 1). With the order decided by hash, every pair estimates the same
quantity whatever the swap rate: the order-averaged net preference, in [-1, 1]. It gates (role
critical) on the betting confidence sequence of `evaluators.stats.sequential.BoundedStat`, by
session units, at the margin `preference_delta` (the candidate may lose at most that much net)
and the critical margin `preference_critical` (rejected at any look past it).

Reported beside it, deciding nothing: win / tie / loss shares; the grader's position bias (among
decisive verdicts, the share won by the answer shown first, minus one half, with its interval)
and the flip rate of pairs graded both ways; length bias (net preference by bucket of the
answer length ratio, and a length-controlled estimate: the intercept of the pair score
regressed on the log length ratio, as length-controlled AlpacaEval does); the grader's A/A
(the control graded against production); the accounting and cost of the gradings.

For a candidate with a grader, the agreement metrics (exact match, first divergence,
similarity, logprob divergence) and output length are information only: a model upgrade
answers differently on purpose, and two models' tokens are not comparable (`informational`).
Unparseable or failed gradings are missing, never ties; past `grading_failure_max` of the
attempts, preference stops gating and blocks promotion.

Late gradings never change a closed unit (`on_time`): a verdict counts only if it was stored
within `grading_deadline_s` of its pair's arrival, and a session's unit closes that long after
its idle gap ends, so every verdict it can ever hold is in when a look first uses it. A verdict
stored later is late: counted (`gradings_late`), never used, and missing as a failed one is.
Pure: no IO.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    judge_bounded_units,
    ungate,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.gradings import Gradings
from evaluators.stats.sequential import BoundedStat
from evaluators.stats.units import Units, build_units

__all__ = [
    "INFORMATIONAL",
    "LENGTH_BUCKETS",
    "NAME",
    "PairScores",
    "informational",
    "length_controlled",
    "on_time",
    "pair_scores",
    "position_bias",
    "preference",
    "preference_spec",
    "unit_scores",
]

NAME: Final = "preference"
# What a graded candidate's quality does not gate on (reported as information).
INFORMATIONAL: Final = frozenset(
    {
        "exact_match",
        "first_divergence",
        "similarity",
        "logprob_divergence",
        "output_length",
        "tool_calls",
        "finish_reason",
    }
)
# Buckets of log2(candidate chars / reference chars): much shorter, shorter, about equal
# (within ±11 %), longer, much longer.
LENGTH_BUCKETS: Final = (-math.inf, -0.5, -0.15, 0.15, 0.5, math.inf)
_BUCKET_LABELS: Final = ("< 0.71x", "0.71-0.90x", "0.90-1.11x", "1.11-1.41x", "> 1.41x")

F64 = NDArray[np.float64]
B = NDArray[np.bool_]


def preference_spec(s: VerdictSettings) -> MetricSpec:
    """The gating test: net preference at least -delta, rejected past -critical at any look."""
    return MetricSpec(
        name=NAME,
        label="net preference (LLM grader, order-averaged)",
        role="critical",
        harm="lower",
        scale="difference",
        delta=s.preference_delta,
        critical=s.preference_critical,
        unit="rate",
    )


class PairScores:
    """Per graded pair (in arrival order): its arrival, session, score and verdict count, from
    the verdicts in `use` (default: every graded verdict)."""

    __slots__ = ("count", "received_at", "score", "session")

    def __init__(self, g: Gradings, use: B | None = None) -> None:
        k = g.pairs
        ok = g.graded if use is None else use
        self.count = np.bincount(g.pair[ok], minlength=k).astype(np.int64)
        sums = np.bincount(g.pair[ok], weights=g.score[ok], minlength=k)
        with np.errstate(invalid="ignore", divide="ignore"):
            score = sums / self.count
        self.score: F64 = np.where(self.count > 0, score, np.nan)
        self.received_at: F64 = np.full(k, np.nan)
        self.received_at[g.pair] = g.received_at
        self.session: NDArray[np.uint64] = np.zeros(k, dtype=np.uint64)
        self.session[g.pair] = g.session

    @property
    def graded(self) -> B:
        return self.count > 0


def pair_scores(g: Gradings, use: B | None = None) -> PairScores:
    """Each pair's score: the mean of its verdicts' scores in `use` (default: every graded
    verdict; NaN when none)."""
    return PairScores(g, use)


def on_time(g: Gradings, *, as_of: float, deadline_s: float | None) -> tuple[B, int]:
    """(the verdicts a look at `as_of` uses, the verdicts late by then).

    A verdict is used once stored (at or before `as_of`) and only if stored within
    `deadline_s` of its pair's arrival; one stored later is late: counted, never used, so no
    unit a look used ever changes. A verdict whose storing time is unknown (NaN, or gradings
    read without it) is taken as stored when its pair arrived. `deadline_s` None: no deadline
    (every stored verdict is used)."""
    graded = g.graded
    if g.graded_at is None:
        return graded, 0
    at = np.where(np.isnan(g.graded_at), g.received_at, g.graded_at)
    stored = graded & (at <= as_of)
    if deadline_s is None:
        return stored, 0
    late = stored & (at > g.received_at + deadline_s)
    return stored & ~late, int(np.count_nonzero(late))


def _units(
    ps: PairScores,
    *,
    by_session: bool,
    as_of: float,
    idle_s: float,
    deadline_s: float = 0.0,
) -> Units:
    """The units of the graded pairs at `as_of`: session bursts split where a session idles
    longer than `idle_s`, each closed `deadline_s` after its last pair plus `idle_s` (a lone
    pair: after its arrival plus `deadline_s`). With the verdicts of `on_time` at the same
    deadline, a closed unit holds every verdict it will ever hold."""
    ok = ps.graded
    return build_units(
        ps.received_at[ok],
        ps.session[ok],
        by_session=by_session,
        as_of=as_of - deadline_s if math.isfinite(as_of) else as_of,
        idle_s=idle_s,
        settled=np.ones(int(np.count_nonzero(ok)), dtype=bool),
    )


def unit_scores(
    g: Gradings,
    *,
    by_session: bool,
    as_of: float = math.inf,
    idle_s: float = 30.0,
    deadline_s: float | None = None,
) -> tuple[F64, NDArray[np.int64]]:
    """(mean pair score per closed unit in closing order, pairs per unit): what the net
    preference's sequence bets on at a look at `as_of`. Units are session bursts when
    `by_session`, else pairs; with `deadline_s` (the report's `grading_deadline_s`) late
    verdicts are left out and units close that much later (`on_time`)."""
    use, _ = on_time(g, as_of=as_of, deadline_s=deadline_s)
    ps = pair_scores(g, use)
    ok = ps.graded
    units = _units(
        ps, by_session=by_session, as_of=as_of, idle_s=idle_s, deadline_s=deadline_s or 0.0
    )
    v, sizes, _ = units.means(ps.score[ok], np.ones(int(np.count_nonzero(ok)), dtype=bool))
    return v, sizes


def position_bias(
    g: Gradings, alpha: float, *, by_session: bool, idle_s: float = 30.0
) -> tuple[float, float, float, int] | None:
    """(bias, low, high, decisive verdicts): among decisive verdicts the share won by the answer
    shown first, minus one half, with its always-valid interval (each pair's decisive verdicts
    averaged, then by unit as the net preference is); None without a decisive verdict."""
    decisive = g.graded & (g.score != 0)
    n = int(np.count_nonzero(decisive))
    if n == 0:
        return None
    first_won = (g.score[decisive] > 0) == g.candidate_first[decisive]
    d = np.where(first_won, 1.0, -1.0)
    pair = g.pair[decisive]
    k = g.pairs
    cnt = np.bincount(pair, minlength=k)
    sums = np.bincount(pair, weights=d, minlength=k)
    has = cnt > 0
    received = np.full(k, np.nan)
    received[g.pair] = g.received_at
    session = np.zeros(k, dtype=np.uint64)
    session[g.pair] = g.session
    units = build_units(
        received[has],
        session[has],
        by_session=by_session,
        as_of=math.inf,
        idle_s=idle_s,
        settled=np.ones(int(np.count_nonzero(has)), dtype=bool),
    )
    v, _, _ = units.means(sums[has] / cnt[has], np.ones(int(np.count_nonzero(has)), dtype=bool))
    est = float(np.mean(first_won)) - 0.5
    if len(v) < 2:
        return est, -0.5, 0.5, n
    lo, hi = BoundedStat(v).bounds(alpha)
    # d = 2 * 1{first won} - 1: the share's interval is half the mean's, shifted.
    return est, float(lo[-1]) / 2.0, float(hi[-1]) / 2.0, n


def flips(g: Gradings) -> tuple[int, int, int, int]:
    """(pairs graded in both orders, of which the two verdicts differ, pairs decisive in both
    orders, of which the winner flipped with the order)."""
    k = g.pairs
    ok = g.graded
    cnt = np.bincount(g.pair[ok], minlength=k)
    both = cnt >= 2
    lo = np.full(k, np.inf)
    hi = np.full(k, -np.inf)
    np.minimum.at(lo, g.pair[ok], g.score[ok])
    np.maximum.at(hi, g.pair[ok], g.score[ok])
    differ = both & (lo != hi)
    decisive_both = both & (lo != 0) & (hi != 0)
    flipped = decisive_both & (lo == -1) & (hi == 1)
    return (
        int(np.count_nonzero(both)),
        int(np.count_nonzero(differ)),
        int(np.count_nonzero(decisive_both)),
        int(np.count_nonzero(flipped)),
    )


def _log_ratio(g: Gradings, ps: PairScores) -> F64:
    """log2(candidate chars / reference chars) per pair (+1 each: an empty answer is finite)."""
    k = g.pairs
    cand = np.zeros(k)
    ref = np.zeros(k)
    cand[g.pair] = g.candidate_chars
    ref[g.pair] = g.reference_chars
    return np.log2((cand + 1.0) / (ref + 1.0))


def length_controlled(x: F64, y: F64) -> tuple[float, float, float] | None:
    """(intercept, its heteroskedasticity-robust standard error, slope) of y regressed on x by
    least squares: the net preference at equal length and how it moves per doubling of the
    length ratio. None with fewer than 3 points or no spread in x."""
    if len(x) < 3 or float(np.ptp(x)) == 0.0:
        return None
    design = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    bread = np.linalg.inv(design.T @ design)
    meat = (design * (resid**2)[:, None]).T @ design
    cov = bread @ meat @ bread * len(x) / max(len(x) - 2, 1)
    return float(coef[0]), float(math.sqrt(max(cov[0, 0], 0.0))), float(coef[1])


def _length_slices(lr: F64, score: F64) -> list[Detail]:
    bucket = np.digitize(lr, LENGTH_BUCKETS[1:-1])
    out: list[Detail] = []
    for i, label in enumerate(_BUCKET_LABELS):
        m = bucket == i
        n = int(np.count_nonzero(m))
        out.append(
            {
                "slice": f"length ratio {label}",
                "n": n,
                "estimate": float(np.mean(score[m])) if n else None,
            }
        )
    return out


def _accounting(g: Gradings, price_per_mtok: float) -> Detail:
    tokens = int(g.tokens.sum())
    graded = g.graded
    wins = int(np.count_nonzero(graded & (g.score > 0)))
    ties = int(np.count_nonzero(graded & (g.score == 0)))
    losses = int(np.count_nonzero(graded & (g.score < 0)))
    n_graded = max(wins + ties + losses, 1)
    attempted = g.count("graded") + g.count("unparseable") + g.count("failed")
    return {
        "gradings_graded": g.count("graded"),
        "gradings_unparseable": g.count("unparseable"),
        "gradings_failed": g.count("failed"),
        "gradings_over_cap": g.count("over_cap"),
        "grading_failure_share": (
            (g.count("unparseable") + g.count("failed")) / attempted if attempted else None
        ),
        "win_share": wins / n_graded,
        "tie_share": ties / n_graded,
        "loss_share": losses / n_graded,
        "grader_tokens": tokens,
        "grader_cost_usd": tokens / 1e6 * price_per_mtok,
        "tokens_per_grading": tokens / attempted if attempted else None,
        # Every complete pair: graded, or why not (evaluators.pairs.gradings.pair_accounting).
        **g.accounting,
    }


def _by_session(ctx: EvalContext, g: Gradings) -> bool:
    return bool(ctx.candidate.sampling == "session" or np.any(g.session))


def preference(ctx: EvalContext) -> list[MetricResult]:
    """The net preference (gating for a candidate with a grader), its grader's position bias
    and A/A (diagnostic); nothing for a candidate without a grader and without gradings."""
    g = ctx.gradings
    grader = ctx.candidate.grader
    if grader is None and (g is None or g.n == 0):
        return []
    s = ctx.settings
    spec = preference_spec(s)
    price = grader.price_per_mtok if grader is not None else 0.0
    if g is None or g.n == 0:
        # Quality of a graded candidate gates on preference alone: without a verdict it must
        # not be promoted (a grader that is down never lets an upgrade through).
        res = empty_result(spec, "production", "")
        if g is not None:
            res.detail = dict(g.accounting)  # what became of the complete pairs all the same
        return [ungate(res, "no graded pair yet", blocks=True)]
    by_session = _by_session(ctx, g)
    as_of = math.inf if ctx.as_of is None or ctx.planned_look else ctx.as_of
    use, late = on_time(g, as_of=as_of, deadline_s=s.grading_deadline_s)
    ps = pair_scores(g, use)
    ok = ps.graded
    detail = _accounting(g, price)
    attempted = g.count("graded") + g.count("unparseable") + g.count("failed")
    detail.update(
        gradings_late=late,
        grading_late_share=late / attempted if attempted else None,
        grading_deadline_s=s.grading_deadline_s,
    )
    both, differ, decisive_both, flipped = flips(g)
    detail.update(
        pairs_graded=int(np.count_nonzero(ok)),
        pairs_both_orders=both,
        flip_rate=differ / both if both else None,
        decisive_flip_rate=flipped / decisive_both if decisive_both else None,
    )
    lr = _log_ratio(g, ps)[ok]
    lc = length_controlled(lr, ps.score[ok])
    if lc is not None:
        detail.update(
            length_controlled=lc[0], length_controlled_se=lc[1], length_slope_per_doubling=lc[2]
        )
    units = _units(
        ps,
        by_session=by_session,
        as_of=as_of,
        idle_s=s.session_idle_s,
        deadline_s=s.grading_deadline_s,
    )
    v, sizes, _ = units.means(ps.score[ok], np.ones(int(np.count_nonzero(ok)), dtype=bool))
    if len(v) == 0:
        res = empty_result(spec, "production", "")
        res.detail = detail
        return [ungate(res, "no closed unit of graded pairs yet", blocks=True)]
    res = judge_bounded_units(
        spec,
        v,
        sizes,
        alpha=s.alpha,
        reference="production",
        detail=detail,
        trajectories=ctx.trajectories,
    )
    res.slices = _length_slices(lr, ps.score[ok])
    share = detail["grading_failure_share"]
    if isinstance(share, float) and share + late / attempted > s.grading_failure_max:
        missing = share + late / attempted
        ungate(
            res,
            f"{missing:.1%} of the grader's attempts were unparseable, failed or late (more "
            f"than grading_failure_max {s.grading_failure_max:.0%}; late: stored past "
            f"grading_deadline_s {s.grading_deadline_s:g} s): missing verdicts are not ties",
            blocks=True,
        )
    out = [res, _bias_result(g, s, by_session)]
    if ctx.control_gradings is not None and ctx.control_gradings.n:
        out.append(_aa_result(ctx.control_gradings, s, by_session))
    return out


def _bias_result(g: Gradings, s: VerdictSettings, by_session: bool) -> MetricResult:
    spec = MetricSpec(
        name="grader_position_bias",
        label="grader position bias (first shown wins − ½)",
        role="diagnostic",
        harm="both",
        scale="difference",
        unit="rate",
    )
    found = position_bias(g, s.alpha, by_session=by_session, idle_s=s.session_idle_s)
    if found is None:
        return empty_result(spec, "production", "no decisive verdict yet")
    est, lo, hi, n = found
    res = empty_result(spec, "production", "")
    res.status, res.n, res.estimate, res.ci_low, res.ci_high = "info", n, est, lo, hi
    return res


def _aa_result(g: Gradings, s: VerdictSettings, by_session: bool) -> MetricResult:
    """The control graded against production: what the grader says when nothing changed."""
    spec = MetricSpec(
        name="grader_aa",
        label="grader A/A (control vs production net preference)",
        role="diagnostic",
        harm="both",
        scale="difference",
        unit="rate",
    )
    v, _ = unit_scores(g, by_session=by_session, idle_s=s.session_idle_s)
    res = empty_result(spec, "production", "")
    if len(v) < 2:
        res.reason = "fewer than two graded units of the control"
        return res
    lo, hi = BoundedStat(v).bounds(s.alpha)
    res.status, res.n = "info", int(np.count_nonzero(pair_scores(g).graded))
    res.estimate, res.ci_low, res.ci_high = float(np.mean(v)), float(lo[-1]), float(hi[-1])
    return res


def informational(results: list[MetricResult], ctx: EvalContext) -> None:
    """For a candidate with a grader, the agreement metrics and output length stop gating
    (reported as information; preference gates quality instead)."""
    if ctx.candidate.grader is None:
        return
    for r in results:
        if r.name in INFORMATIONAL and r.gating and r.status != "ungated":
            ungate(
                r,
                "a model upgrade answers differently on purpose: with a grader, quality gates "
                "on preference and this is information",
                blocks=False,
            )
