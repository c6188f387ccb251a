"""`logprob_divergence` on hand-built scored pairs: the paired top-1 disagreement against the
control, its role by kind, and why it does not gate (no control, scoring unsupported)."""

from __future__ import annotations

import math

from domain.endpoint import Endpoint
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import judge
from evaluators.metrics.divergence import NO_CONTROL, UNSUPPORTED, logprob_divergence
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import ArmObs, Pair

S = VerdictSettings()
QUANT = Endpoint(name="q", url="http://q", kind="quantized")
OTHER = Endpoint(name="o", url="http://o", kind="engine-upgrade")


def _arm(top1: float | None, logprob: float | None = -0.5, tokens: int | None = 30) -> ArmObs:
    return ArmObs(
        status=200,
        ttft_s=0.2,
        output_tokens=30,
        score_tokens=tokens,
        score_top1=top1,
        score_logprob=logprob,
        score_kl=None if top1 is None else 0.004,
    )


def _ctx(pairs: list[Pair], candidate: Endpoint = QUANT) -> EvalContext:
    return EvalContext(
        pairs=pairset_from_pairs(pairs), settings=S, candidate=candidate, planned_look=True
    )


def _pairs(n: int, cand_top1: float, ctrl_top1: float | None = 1.0) -> list[Pair]:
    out = []
    for i in range(n):
        wobble = 0.01 * math.sin(i)
        ctrl = None if ctrl_top1 is None else _arm(ctrl_top1)
        out.append(
            Pair(
                exchange_id=f"e{i}",
                received_at=float(i),
                production=ArmObs(status=200, ttft_s=0.2),
                candidate=_arm(max(0.0, min(1.0, cand_top1 + wobble))),
                control=ctrl,
            )
        )
    return out


def test_flips_beyond_the_critical_margin_reject_a_quantized_candidate() -> None:
    """A candidate whose top-1 disagrees on 10 % more of production's tokens than the control
    is critical (quantized) and the verdict rejects."""
    (res,) = logprob_divergence(_ctx(_pairs(300, 0.9)))
    assert res.role == "critical" and res.reference == "control"
    assert res.estimate is not None and abs(res.estimate - 0.1) < 0.01
    assert res.ci_low is not None and res.ci_low > S.score_critical
    assert (
        res.detail["rate_candidate"] is not None
        and abs(float(res.detail["kl_per_token"] or 0) - 0.004) < 1e-6
    )
    verdict, _ = judge([res], n_pairs=300, coverage=1.0, planned=True, settings=S)
    assert verdict == "reject" and res.status == "critical"


def test_identical_arms_are_inside_and_other_kinds_get_a_guardrail() -> None:
    """Candidate and control agreeing as often: inside the margin; for a kind other than
    quantized the metric is a guardrail."""
    (res,) = logprob_divergence(_ctx(_pairs(2000, 0.98, ctrl_top1=0.98), OTHER))
    assert res.role == "guardrail"
    assert res.ci_high is not None and res.ci_high < S.score_delta


def test_ungated_without_control_or_when_unsupported() -> None:
    """No control: ungated with the reason; a candidate that refused prompt logprobs
    (score_tokens 0): `scoring unsupported`; nothing scored: not applicable."""
    (res,) = logprob_divergence(_ctx(_pairs(50, 0.9, ctrl_top1=None)))
    assert res.status == "ungated" and res.ungated == NO_CONTROL
    refused = [
        Pair(
            exchange_id=f"e{i}",
            received_at=float(i),
            production=ArmObs(status=200),
            candidate=_arm(None, None, tokens=0),
            control=_arm(1.0),
        )
        for i in range(10)
    ]
    (res,) = logprob_divergence(_ctx(refused))
    assert res.status == "ungated" and res.ungated == UNSUPPORTED
    unscored = [Pair(exchange_id="e", received_at=0.0, production=ArmObs(), candidate=ArmObs())]
    (res,) = logprob_divergence(_ctx(unscored))
    assert res.status == "n/a"
