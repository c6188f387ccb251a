"""No false certainty: what the report does without a control, with nothing to measure, and how
it says how long an undecided metric still needs."""

from __future__ import annotations

from domain.endpoint import Endpoint
from evaluators.pairs import synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.report.build import build_report
from evaluators.report.render import render
from tests.evaluators.test_eval_report import CONTROL, LIVE, S, report

LOOSE = {
    "error_delta": 0.03,
    "error_critical": 0.05,
    "slo_exceedance_delta": 0.05,
    "agreement_delta": 0.05,
    "agreement_critical": 0.1,
    "similarity_delta": 0.05,
}


def test_without_control_latency_and_agreement_do_not_gate_and_the_verdict_says_so() -> None:
    """Without a control latency does not gate (production ran at another load), agreement does
    not gate (unknown noise floor), a KV-reuse candidate's latency goal cannot be shown so it
    is not promoted, and the verdict names the reason."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.8), control=None)
    r = report(scenario, 600, overrides=LOOSE)
    assert r.verdict == "hold"
    for name in ("ttft", "tpot", "e2e", "ttft_later_turns", "ttft_first_turn", "ttft_slo"):
        m = r.metrics[name]
        assert m.status == "ungated" and "no control" in m.ungated
        assert m.ungated_blocks == (m.role == "goal")
    for name in ("exact_match", "finish_reason"):
        m = r.metrics[name]
        assert m.status == "ungated" and not m.ungated_blocks and "noise floor" in m.ungated
    assert "cannot promote without a fair reference for TTFT, turns ≥ 2" in r.reasons[0].reason


def test_a_kind_without_goal_is_promoted_without_control_and_says_what_was_not_gated() -> None:
    """A candidate without a goal and without a control can be promoted on what can be judged
    (failures, length, JSON), and the verdict line names the latency and agreement metrics that
    did not gate."""
    r = report(synthetic.Scenario(control=None), 600, kind="", overrides=LOOSE)
    assert r.verdict == "promote", r.reasons[0]
    assert "not gating" in r.reasons[0].reason and "TTFT" in r.reasons[0].reason


def test_a_nondeterministic_engine_without_control_is_not_rejected_for_it() -> None:
    """Answers differing from production's in 15 % of temperature-0 pairs, with no control to
    say what the engine's own nondeterminism is, reject nothing."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(divergence=0.15), control=None)
    r = report(scenario, 800, planned=True)
    assert r.verdict != "reject"
    assert r.metrics["exact_match"].status == "ungated"


def test_a_metric_with_nothing_to_measure_is_listed_as_not_gating() -> None:
    """When no pair has a TPOT (every answer a single token, as on a fast engine where tokens
    share a read), TPOT is not silently dropped: it is "ungated" with the reason in the verdict's
    reasons, and the rest of the verdict goes on."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.8))
    pairs = synthetic.pairs(scenario, 600, seed=1)
    for p in pairs:
        for arm in (p.production, p.candidate, p.control):
            if arm is not None:
                arm.tpot_s = None
    cand = Endpoint(name="cand", url="http://c", kind="bi-kv", verdict=LOOSE)
    r = build_report(
        pairset_from_pairs(pairs),
        candidate=cand,
        live=LIVE,
        control=CONTROL,
        accounting={},
        settings=S,
    )
    tpot = r.metrics["tpot"]
    assert tpot.status == "ungated" and tpot.ungated
    assert any(x.metric == "tpot" and "not gating" in x.reason for x in r.reasons)
    assert "measurable TPOT" in tpot.ungated


def test_an_undecided_metric_says_how_many_more_pairs_and_when() -> None:
    """An undecided guardrail carries the pairs still needed and an ETA at the observed pair
    rate, in the JSON and in the text report's "To decide" table."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.8))
    r = report(scenario, 600)
    undecided = [m for m in r.metrics.values() if m.gating and m.status == "undecided"]
    assert undecided
    for m in undecided:
        if m.more_pairs:
            assert m.eta_s is not None and m.eta_s > 0
    text = render(r, "text")
    assert "TO DECIDE" in text and "more pairs" in text
    decided = [m for m in r.metrics.values() if m.status in ("inside", "improved")]
    assert all(m.more_pairs is None and m.eta_s is None for m in decided)
