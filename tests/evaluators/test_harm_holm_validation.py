"""Harm shown early with every gating metric of a model upgrade in the decision (seven: the
net preference or tool validity, and six more), on the worlds of `harm_world`, 200 runs a
case, a look after every session:

* a reject comes where the harmed metric's evidence first reaches its share of α, weighted
  Holm's first threshold for it (`primary_weight` shares against one for each of the six
  others: α·3/9), and no later: the critical margin and Holm share one α (verdict.py);
* −15 pp preference and +3 pp invalid tool calls are rejected at a median of at most 1.5x the
  sessions at which the metric's own interval first lies beyond the margin;
* seven metrics all exactly at their margins, every look counted, with equal weights and with
  one primary metric among six others: the verdict rejects in at most α of the runs (one α
  for the whole decision, the critical margins included).
"""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.judge.metric import Evidence, MetricSpec
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import REJECT, decide_arrays, weights_of
from evaluators.metrics import preference, toolcalls
from tests.evaluators import harm_world as hw
from tests.evaluators import tool_world as tw

pytestmark = pytest.mark.slow

RUNS = 200
S = VerdictSettings()
OTHERS = 6  # ttft, tpot, e2e, ttft_slo, e2e_slo, errors: a model upgrade with a control
# ... and an agent candidate's report: ttft_first_turn, ttft, tpot, e2e, the two SLOs, errors,
# exact match, similarity, tool calls, finish reason, output length beside tool validity.
AGENT_OTHERS = 12


def _speed(
    spec: MetricSpec, v: np.ndarray, others: int = OTHERS
) -> tuple[float, float, float, float]:
    """(median sessions to the interval beyond δ, to the reject with `others` more metrics, to
    the latched evidence at its share of α, share never rejected)."""
    ev, p_now = hw.bounded_evidence(spec, v)
    shown = hw.first_true(p_now <= S.alpha, ev.n)
    w = S.primary_weight
    at_holm = hw.first_true(ev.p_beyond <= S.alpha * w / (w + others), ev.n)
    rejected = hw.first_reject(spec, ev, True, S, others=others)
    return (
        float(np.median(shown)),
        float(np.median(rejected)),
        float(np.median(at_holm)),
        float(np.isinf(rejected).mean()),
    )


def test_fifteen_points_less_preferred_with_six_more_metrics() -> None:
    """−15 pp preference beside six more gating metrics: every run rejects, each where its
    evidence reaches its share of α, at a median of at most 1.5x the sessions of the
    interval's first showing beyond the −5 pp margin."""
    v = hw.preference_units(-0.15, 2500, RUNS, 1000)
    shown, rejected, at_holm, never = _speed(preference.preference_spec(S), v)
    print(f"preference: shown {shown}, rejected {rejected} ({rejected / shown:.2f}x)")
    assert never == 0.0 and rejected == at_holm and rejected <= 1.5 * shown


@pytest.mark.parametrize("others", [OTHERS, AGENT_OTHERS])
def test_three_points_more_invalid_tool_calls_with_more_metrics(others: int) -> None:
    """+3 pp invalid tool calls beside six (a model upgrade) or twelve (an agent candidate)
    more gating metrics: every run but at most one in a hundred rejects, each where its
    evidence reaches its share of α (Holm's price and nothing more), at a median of at most
    1.5x the sessions of the interval's first showing beyond the 1 pp margin."""
    v = hw.tool_units(tw.World(production=0.01, candidate=0.04), 1500, RUNS, 2000)
    shown, rejected, at_holm, never = _speed(toolcalls.spec(S), v, others)
    print(f"tool validity, {others} more: shown {shown}, rejected {rejected} ", end="")
    print(f"({rejected / shown:.2f}x)")
    assert never <= 0.01 and rejected == at_holm and rejected <= 1.5 * shown


@pytest.mark.parametrize("primary", [7, 1], ids=["equal-weights", "one-primary"])
def test_seven_metrics_at_their_margins_reject_at_most_alpha_every_look(primary: int) -> None:
    """Seven independent betting sequences, each exactly at its margin (net preference −5 pp
    against a 5 pp margin; its critical margin at 25 pp), judged together at every look, all
    seven of one weight or one of `primary_weight` shares among six of one: the verdict
    rejects in at most α of the runs."""
    spec = preference.preference_spec(S)
    evs: list[Evidence] = []
    for k in range(OTHERS + 1):
        v = hw.preference_units(-S.preference_delta, 1500, RUNS, 50_000 + 1_000 * k)
        evs.append(hw.bounded_evidence(spec, v)[0])
    n = np.min([e.n.shape[-1] for e in evs])
    evs = [Evidence(*(np.asarray(a)[..., :n] for a in e)) for e in evs]
    names = ["preference" if k < primary else f"other_{k}" for k in range(OTHERS + 1)]
    verdict, _ = decide_arrays(
        [spec.role] * len(evs),
        evs,
        n_pairs=evs[0].n,
        coverage_ok=True,
        planned=False,
        settings=S,
        early=np.ones(len(evs), dtype=bool),
        weights=weights_of(names, S),
    )
    rate = float((verdict == REJECT).any(axis=-1).mean())
    print(f"seven at their margins ({primary} primary): rejected in {rate:.1%}")
    assert rate <= S.alpha
