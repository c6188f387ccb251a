"""Quality evaluators: exact match, first divergence, similarity, JSON, tool calls, finish, length.

Production's output is the reference for quality. LLM outputs differ run to run even at
temperature 0 (batching), so every agreement metric is judged against the noise floor, the
production-vs-control disagreement, when a control runs: per exchange,
1{candidate differs from production} - 1{control differs from production}. Without a control
the floor is unknown: the disagreement is shown against 0 but does not gate (assuming a floor of
0 would reject every candidate of a nondeterministic engine), and the verdict says so.
JSON validity compares each arm's own validity (candidate minus control, else minus
production); output length is the ratio candidate / control (else / production).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from evaluators.judge.metric import (
    Detail,
    EvalContext,
    Floats,
    MetricResult,
    MetricSpec,
    empty_result,
    judge_bounded,
    judge_mean,
    ungate,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import tokens
from evaluators.stats.paired import hodges_lehmann, mcnemar

F = NDArray[np.float64]
F32 = NDArray[np.float32]
B = NDArray[np.bool_]

NO_CONTROL = "no control: the noise floor is assumed to be 0"
NO_FLOOR = (
    "no control: the engine's own run-to-run disagreement (the noise floor) is unknown, so "
    "agreement does not gate; register a control (kind = control) to gate on it"
)
# The agreement metrics (plotted against the noise floor in the HTML report).
AGREEMENT = ("exact_match", "json_validity", "tool_calls", "finish_reason")


def agreement_spec(s: VerdictSettings, name: str, label: str) -> MetricSpec:
    """A disagreement-rate difference against the noise floor: critical."""
    return MetricSpec(
        name=name,
        label=label,
        role="critical",
        harm="higher",
        scale="difference",
        delta=s.agreement_delta,
        critical=s.agreement_critical,
        unit="rate",
    )


def _against_floor(
    ctx: EvalContext,
    spec: MetricSpec,
    bad_c: Floats,
    bad_k: Floats,
    applicable: B,
    extra: Detail | None = None,
) -> MetricResult:
    """Judge 1{candidate bad} - 1{control bad} (or - 0 without control) over `applicable`."""
    if ctx.has_control:
        return _paired_rate(ctx, spec, bad_c, bad_k, applicable, extra)
    res = _paired_rate(ctx, spec, bad_c, np.zeros_like(bad_c), applicable, extra)
    if res.n:
        res.notes.append(NO_CONTROL)
    return ungate(res, NO_FLOOR, blocks=False)


def _paired_rate(
    ctx: EvalContext,
    spec: MetricSpec,
    bad_c: Floats,
    bad_r: Floats,
    applicable: B,
    extra: Detail | None = None,
) -> MetricResult:
    """Judge 1{candidate bad} - 1{reference bad} over the applicable pairs where both known."""
    reference = "control" if ctx.has_control else "production"
    use = applicable & np.isfinite(bad_c) & np.isfinite(bad_r)
    if not np.any(use):
        return empty_result(spec, reference, "not applicable: no such pairs")
    c, r = bad_c[use], bad_r[use]
    mn = mcnemar(c > 0, r > 0, ctx.settings.min_discordant)
    detail: Detail = {
        "rate_candidate": float(c.mean(dtype=np.float64)),
        "rate_reference": float(r.mean(dtype=np.float64)),
        "discordant_worse": mn.worse,
        "discordant_better": mn.better,
        "mcnemar_p": mn.p if np.isfinite(mn.p) else None,
    }
    detail.update(extra or {})
    return judge_bounded(spec, c - r, ctx, use=use, reference=reference, detail=detail)


def _tri(values: NDArray[np.int8], bad_when: int) -> F32:
    """A tri-state column (-1 unknown) as 1.0 bad / 0.0 good / NaN unknown (float32: exact,
    half the memory of a million-pair temporary in float64)."""
    out: F32 = (values == bad_when).astype(np.float32)
    out[values < 0] = np.nan
    return out


def exact_match(ctx: EvalContext) -> list[MetricResult]:
    """At temperature 0: outputs differing from production, against the noise floor."""
    ps = ctx.pairs
    spec = agreement_spec(ctx.settings, "exact_match", "differs at T=0")
    temp0 = ps.temperature == 0
    div_c = ps.vs_candidate.divergence
    extra: Detail = {
        "median_divergence_position": _median(div_c[temp0]),
    }
    return [
        _against_floor(
            ctx, spec, _tri(ps.vs_candidate.match, 0), _tri(ps.vs_control.match, 0), temp0, extra
        )
    ]


def first_divergence(ctx: EvalContext) -> list[MetricResult]:
    """Where candidate outputs first differ from production (fraction of production's text)."""
    ps = ctx.pairs
    spec = MetricSpec(
        name="first_divergence",
        label="first divergence",
        role="diagnostic",
        harm="lower",
        scale="difference",
        unit="fraction",
    )
    pos = ps.vs_candidate.divergence.astype(np.float64)
    pos = pos[np.isfinite(pos)]
    if len(pos) == 0:
        return [empty_result(spec, "production", "no divergent temperature-0 pairs")]
    res = empty_result(spec, "production", "")
    res.status, res.n = "info", len(pos)
    res.estimate = float(np.median(pos))
    res.ci_low, res.ci_high = _median_ci(np.sort(pos), ctx.settings.alpha)
    floor = ps.vs_control.divergence.astype(np.float64)
    floor = floor[np.isfinite(floor)]
    res.detail = {"median_control": float(np.median(floor)) if len(floor) else None}
    res.notes.append("0 = differs from the first character; 1 = differs only at the end")
    return [res]


def similarity(ctx: EvalContext) -> list[MetricResult]:
    """Unigram+bigram F1 with production (any temperature), against the control's."""
    s = ctx.settings
    ps = ctx.pairs
    has_floor = ctx.has_control
    spec = MetricSpec(
        name="similarity",
        label="text similarity",
        role="critical" if has_floor else "diagnostic",
        harm="lower",
        scale="difference",
        delta=s.similarity_delta,
        critical=s.similarity_critical if has_floor else None,
        unit="F1",
    )
    sim_c = ps.vs_candidate.similarity.astype(np.float64)
    sim_k = ps.vs_control.similarity.astype(np.float64) if has_floor else np.ones_like(sim_c)
    use = np.isfinite(sim_c) & np.isfinite(sim_k)
    reference = "control" if has_floor else "production"
    if not np.any(use):
        return [empty_result(spec, reference, "no pair with both texts stored")]
    d = sim_c[use] - sim_k[use]
    detail: Detail = {
        "mean_candidate": float(sim_c[use].mean()),
        "mean_control": float(sim_k[use].mean()) if has_floor else None,
        "sample_fraction": ps.similarity_fraction,
    }
    if ctx.planned_look:  # fixed-sample numbers only where a fixed-sample reading is valid
        hl = hodges_lehmann(d, 2 * s.alpha, s.hl_max_pairs)
        detail.update(
            hl_difference=hl.estimate,
            hl_low=hl.low if np.isfinite(hl.low) else None,
            hl_high=hl.high if np.isfinite(hl.high) else None,
            wilcoxon_p=hl.p_wilcoxon if np.isfinite(hl.p_wilcoxon) else None,
        )
    res = judge_bounded(spec, d, ctx, use=use, reference=reference, detail=detail)
    if not has_floor:
        res.notes.append(NO_CONTROL + " (1.0 = identical): diagnostic only")
    if ps.similarity_fraction < 1:
        res.notes.append(f"computed on a {ps.similarity_fraction:.1%} sample of exchanges")
    return [res]


def json_validity(ctx: EvalContext) -> list[MetricResult]:
    """Invalid JSON where the request asked for JSON: candidate minus control (or production)."""
    ps = ctx.pairs
    spec = agreement_spec(ctx.settings, "json_validity", "invalid JSON")
    ref = ps.control if ctx.has_control else ps.production
    bad_c, bad_r = _tri(ps.candidate.json_valid, 0), _tri(ref.json_valid, 0)
    return [_paired_rate(ctx, spec, bad_c, bad_r, ps.json_requested)]


def tool_calls(ctx: EvalContext) -> list[MetricResult]:
    """Tool calls (names, parsed arguments) differing from production's, against the floor."""
    ps = ctx.pairs
    spec = agreement_spec(ctx.settings, "tool_calls", "tool calls differ")
    bad_c = _tri(ps.vs_candidate.tool_equal, 0)
    bad_k = _tri(ps.vs_control.tool_equal, 0)
    return [_against_floor(ctx, spec, bad_c, bad_k, ps.vs_candidate.tool_equal >= 0)]


def finish_reason(ctx: EvalContext) -> list[MetricResult]:
    """Finish reason differing from production's, against the noise floor."""
    ps = ctx.pairs
    spec = agreement_spec(ctx.settings, "finish_reason", "finish reason differs")
    p = ps.production
    both_c = p.ok & ps.candidate.ok
    bad_c = np.where(both_c, (ps.candidate.finish != p.finish).astype(np.float32), np.nan)
    both_k = p.ok & ps.control.ok
    bad_k = np.where(both_k, (ps.control.finish != p.finish).astype(np.float32), np.nan)
    return [_against_floor(ctx, spec, bad_c, bad_k, both_c)]


def length_spec(s: VerdictSettings) -> MetricSpec:
    """Output-length ratio: two-sided, critical."""
    return MetricSpec(
        name="output_length",
        label="output length",
        role="critical",
        harm="both",
        scale="ratio",
        delta=s.length_delta,
        critical=s.length_critical,
        unit="ratio",
    )


def output_length(ctx: EvalContext) -> list[MetricResult]:
    """Output tokens, candidate / control (or / production), on pairs whose two answers were
    counted by one tokenizer: longer and shorter are both harm."""
    s = ctx.settings
    ps = ctx.pairs
    spec = length_spec(s)
    ref = ps.arm(ctx.reference)
    ok = ps.candidate.ok & ref.ok
    counted = tokens.counted(ps.candidate, ref, ok)
    c, r = ps.candidate.output_tokens.astype(np.float64), ref.output_tokens.astype(np.float64)
    use = counted & (c > 0) & (r > 0)
    if not np.any(use):
        why = "no pair whose two answers were counted by one tokenizer"
        return [tokens.gate_on_counts(empty_result(spec, ctx.reference, why), ok, use)]
    x = np.log(c[use] / r[use])
    detail: Detail = {
        "mean_tokens_candidate": float(c[use].mean()),
        "mean_tokens_reference": float(r[use].mean()),
    }
    if ctx.planned_look:  # fixed-sample numbers only where a fixed-sample reading is valid
        hl = hodges_lehmann(x, 2 * s.alpha, s.hl_max_pairs)
        detail["hl_ratio"] = float(np.exp(hl.estimate))
        detail["wilcoxon_p"] = hl.p_wilcoxon if np.isfinite(hl.p_wilcoxon) else None
    res = judge_mean(spec, x, ctx, use=use, reference=ctx.reference, detail=detail)
    return [tokens.gate_on_counts(res, ok, counted)]


def _median(x: NDArray[np.float32]) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None


def _median_ci(xs: F, alpha: float) -> tuple[float | None, float | None]:
    """Distribution-free interval for the median from binomial order statistics (1-2α)."""
    n = len(xs)
    if n < 10:
        return None, None
    lo = int(stats.binom.ppf(alpha, n, 0.5))
    hi = int(stats.binom.isf(alpha, n, 0.5))
    return float(xs[max(lo - 1, 0)]), float(xs[min(hi, n - 1)])
