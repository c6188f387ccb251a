"""Failure evaluators: failure asymmetry, timeouts, and pairs lost.

Failures are not missing at random, so they are a metric of their own and a critical one: per
pair, 1{candidate failed} - 1{reference failed} (reference = control when present), judged by an
always-valid interval of the rate difference and reported with McNemar's exact test. A pair
where the gateway itself cancelled either request (shutdown) says nothing about the endpoints
and is left out. Pairs lost (no candidate observation at all) are counted, with their rate.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from domain.outcomes import ERROR_KINDS
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    indicator_difference,
    judge_bounded,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.types import NOT_ENDPOINT_CODES, TIMEOUT
from evaluators.stats.paired import mcnemar


def _observed(ctx: EvalContext) -> NDArray[np.bool_]:
    ps = ctx.pairs
    ref = ps.arm(ctx.reference)
    use: NDArray[np.bool_] = (
        ps.candidate.present
        & ref.present
        & ~np.isin(ps.candidate.error, NOT_ENDPOINT_CODES)
        & ~np.isin(ref.error, NOT_ENDPOINT_CODES)
    )
    return use


def failure_spec(s: VerdictSettings) -> MetricSpec:
    """Failure-rate difference: critical."""
    return MetricSpec(
        name="errors",
        label="failures",
        role="critical",
        harm="higher",
        scale="difference",
        delta=s.error_delta,
        critical=s.error_critical,
        unit="rate",
    )


def failures(ctx: EvalContext) -> list[MetricResult]:
    """Failure rate, candidate minus reference."""
    s = ctx.settings
    spec = failure_spec(s)
    ps = ctx.pairs
    ref = ps.arm(ctx.reference)
    use = _observed(ctx)
    bad_c, bad_r = ~ps.candidate.ok[use], ~ref.ok[use]
    mn = mcnemar(bad_c, bad_r, s.min_discordant)
    kinds = np.bincount(ps.candidate.error[use], minlength=len(ERROR_KINDS))
    detail: Detail = {
        "rate_candidate": float(bad_c.mean()) if len(bad_c) else None,
        "rate_reference": float(bad_r.mean()) if len(bad_r) else None,
        "rate_production": _rate(~ps.production.ok[ps.production.present]),
        "discordant_worse": mn.worse,
        "discordant_better": mn.better,
        "mcnemar_p": mn.p if np.isfinite(mn.p) else None,
    }
    for code, count in enumerate(kinds):
        if code and count:
            detail[f"candidate_{ERROR_KINDS[code]}"] = int(count)
    d = indicator_difference(bad_c, bad_r)
    res = judge_bounded(spec, d, ctx, use=use, reference=ctx.reference, detail=detail)
    if np.isnan(mn.p) and len(d):
        res.notes.append(
            f"McNemar p withheld: {mn.worse + mn.better} discordant pairs < {s.min_discordant}"
        )
    return [res]


def timeouts(ctx: EvalContext) -> list[MetricResult]:
    """Timeout rate, candidate minus reference (diagnostic: timeouts are failures too)."""
    s = ctx.settings
    spec = MetricSpec(
        name="timeouts",
        label="timeouts",
        role="diagnostic",
        harm="higher",
        scale="difference",
        delta=s.error_delta,
        unit="rate",
    )
    ps = ctx.pairs
    ref = ps.arm(ctx.reference)
    use = _observed(ctx)
    to_c, to_r = ps.candidate.error[use] == TIMEOUT, ref.error[use] == TIMEOUT
    mn = mcnemar(to_c, to_r, s.min_discordant)
    detail: Detail = {
        "rate_candidate": _rate(to_c),
        "rate_reference": _rate(to_r),
        "mcnemar_p": mn.p if np.isfinite(mn.p) else None,
    }
    d = indicator_difference(to_c, to_r)
    return [judge_bounded(spec, d, ctx, use=use, reference=ctx.reference, detail=detail)]


def lost(ctx: EvalContext) -> list[MetricResult]:
    """Exchanges with no candidate observation at all (dropped, or never answered)."""
    ps = ctx.pairs
    spec = MetricSpec(
        name="lost",
        label="pairs lost",
        role="diagnostic",
        harm="higher",
        scale="difference",
        unit="rate",
    )
    total = int(np.count_nonzero(ps.candidate.present)) + ps.lost
    if total == 0:
        return [empty_result(spec, "production", "no exchanges in the window")]
    rate = ps.lost / total
    lo, hi = _wilson(ps.lost, total, ctx.settings.alpha)
    res = empty_result(spec, "production", "")
    res.status, res.n, res.estimate, res.ci_low, res.ci_high = "info", total, rate, lo, hi
    res.detail = {"lost": ps.lost, "pending": ps.pending}
    if ps.lost:
        res.notes.append(
            "counts exchanges without this candidate's observation; with several candidates at "
            "different sample rates it includes exchanges never sampled for this one"
        )
    return [res]


def _rate(bad: NDArray[np.bool_]) -> float | None:
    return float(np.mean(bad)) if len(bad) else None


def _wilson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Wilson score interval at 1-2α (descriptive; nothing is decided on it)."""
    z = float(stats.norm.isf(alpha))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
