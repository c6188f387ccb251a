"""Token-level divergence from the engines' own logprobs: `logprob_divergence`.

On a sampled share of pairs the candidate and the control each scored production's answer on
the same conversation (teacher forcing, gateway/mirror/scoring/jobs.py): per arm the share of
production's tokens that were its own top-1 choice (`score_top1`), the mean log-likelihood of
production's tokens (`score_logprob`) and, on the candidate, a top-k KL(control || candidate)
per token (`score_kl`). The gate is the paired top-1 disagreement rate, candidate minus control
(a difference of shares in [-1, 1], judged as a mean): the share of production's tokens the
candidate would not have picked, beyond what the control's own noise gives. The difference in
mean log-likelihood and the KL estimate are reported with it. Critical for `quantized`
candidates (domain.kinds.SCORE_CRITICAL), a guardrail for the others; it needs a control
scored on the same pairs.

Why the gate is not the log-likelihood difference itself: reduced precision moves each
token's logprob both ways (bfloat16 against float32 on real vLLM: +0.003 ± 0.018 nats/token
over pairs), so its mean stays near 0 while greedy choices already flip; the flips, and the
KL, are one-sided.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from domain.kinds import CONTROL, SCORE_CRITICAL
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    judge_mean,
    ungate,
)

UNSUPPORTED = "scoring unsupported: the candidate refused prompt logprobs (an older engine?)"
NO_CONTROL = "no control scored the same pairs: register a control (kind = control)"
NAME = "logprob_divergence"


def spec_for(ctx: EvalContext) -> MetricSpec:
    s = ctx.settings
    critical = ctx.candidate.kind in SCORE_CRITICAL
    return MetricSpec(
        name=NAME,
        label="top-1 disagreement",
        role="critical" if critical else "guardrail",
        harm="higher",
        scale="difference",
        delta=s.score_delta,
        critical=s.score_critical,
        unit="rate",
    )


def _mean(x: NDArray[np.float64]) -> float | None:
    return float(x.mean()) if len(x) else None


def logprob_divergence(ctx: EvalContext) -> list[MetricResult]:
    """Production's tokens not the candidate's top-1 choice, minus the control's share."""
    ps = ctx.pairs
    spec = spec_for(ctx)
    if ctx.candidate.kind == CONTROL:
        return [empty_result(spec, "control", "the control is this metric's reference")]
    cand, ctrl = ps.candidate, ps.control
    tokens_c = cand.score_tokens.astype(np.float64)
    scored_c = np.isfinite(tokens_c) & (tokens_c > 0)
    if not np.any(scored_c):
        if np.any(tokens_c == 0):
            res = empty_result(spec, "control", "no pair scored")
            return [ungate(res, UNSUPPORTED, blocks=False)]
        return [empty_result(spec, "control", "not scored (score_rate 0 or no scored pair yet)")]
    if not ctx.has_control:
        res = empty_result(spec, "control", "no control")
        return [ungate(res, NO_CONTROL, blocks=False)]
    top_c = cand.score_top1.astype(np.float64)
    top_k = ctrl.score_top1.astype(np.float64)
    use = scored_c & np.isfinite(top_c) & np.isfinite(top_k)
    if not np.any(use):
        return [empty_result(spec, "control", "no pair scored on both arms")]
    d = top_k[use] - top_c[use]  # (1 - top1 candidate) - (1 - top1 control)
    lp = cand.score_logprob.astype(np.float64)[use] - ctrl.score_logprob.astype(np.float64)[use]
    kl = cand.score_kl.astype(np.float64)[use]
    kl = kl[np.isfinite(kl)]
    detail: Detail = {
        # Shares of production's tokens not the arm's top-1 (the HTML report's bars).
        "rate_candidate": float(1 - top_c[use].mean()),
        "rate_reference": float(1 - top_k[use].mean()),
        "top1_candidate": float(top_c[use].mean()),
        "top1_control": float(top_k[use].mean()),
        "loglik_difference": _mean(lp[np.isfinite(lp)]),
        "kl_per_token": _mean(kl),
        "tokens_scored": int(tokens_c[use].sum()),
        "pairs_scored": int(np.count_nonzero(scored_c)),
    }
    # A share difference per pair, mostly within a few pp: the normal-mixture sequence on the
    # unit means (tuned to the candidate's horizon, as every mean is), not the betting one for
    # rates, whose width follows the range [-1, 1] (on real bfloat16 it left 2.7 pp undecided
    # against 0.5 pp after 310 pairs whose sd was 3.8 pp). The mixture alone: scored pairs are
    # a share of the horizon's sessions, so a boundary that holds only up to the horizon's
    # count would be planned to the wrong one.
    res = judge_mean(spec, d, ctx, use=use, reference="control", detail=detail, planned=False)
    res.notes.append(
        "teacher forcing: the share of production's tokens that were not the arm's top-1 "
        "choice, candidate minus control, on the pairs both scored"
    )
    return [res]
