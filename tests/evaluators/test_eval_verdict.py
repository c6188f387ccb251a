"""The decision rules: critical harm rejects at any look, guardrail harm only at a planned look
(Holm), promotion needs every guardrail inside (intersection–union), the goal and the gates."""

from __future__ import annotations

import numpy as np

from evaluators.judge.metric import Evidence, MetricResult, Role
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import HOLD, PROMOTE, REJECT, STATUSES, decide_arrays, judge, summary

S = VerdictSettings()
LOW, HIGH = 1e-6, 1.0  # a p-value that decides, one that does not


def ev(
    n: float = 1000,
    inside: float = HIGH,
    beyond: float = HIGH,
    critical: float = HIGH,
    goal: float = HIGH,
) -> Evidence:
    return Evidence(
        np.array(n), np.array(inside), np.array(beyond), np.array(critical), np.array(goal)
    )


def decide(
    metrics: list[tuple[Role, Evidence]], planned: bool = False, n: float = 1000
) -> tuple[str, list[str]]:
    verdict, status = decide_arrays(
        [r for r, _ in metrics],
        [e for _, e in metrics],
        n_pairs=n,
        coverage_ok=True,
        planned=planned,
        settings=S,
    )
    names = {HOLD: "hold", PROMOTE: "promote", REJECT: "reject"}
    return names[int(verdict)], [STATUSES[int(s)] for s in status]


def test_critical_harm_rejects_at_any_look() -> None:
    """A critical metric wholly beyond δc rejects even when every other metric is fine."""
    verdict, status = decide([("critical", ev(critical=LOW)), ("guardrail", ev(inside=LOW))])
    assert verdict == "reject" and status == ["critical", "inside"]


def test_critical_alpha_is_split_across_gating_metrics() -> None:
    """Evidence at 0.6 α is not enough beyond δc when there are two gating metrics (α/2
    each); at 0.4 α it is."""
    verdict, _ = decide([("critical", ev(critical=0.03)), ("guardrail", ev(inside=LOW))])
    assert verdict == "hold"
    verdict, _ = decide([("critical", ev(critical=0.02)), ("guardrail", ev(inside=LOW))])
    assert verdict == "reject"


def test_guardrail_harm_rejects_only_at_a_planned_look() -> None:
    """A guardrail beyond δ holds (status beyond) until the planned look, which rejects."""
    metrics: list[tuple[Role, Evidence]] = [("guardrail", ev(beyond=LOW))]
    assert decide(metrics) == ("hold", ["beyond"])
    assert decide(metrics, planned=True) == ("reject", ["beyond"])


def test_holm_across_guardrails() -> None:
    """At the planned look, Holm at α over the guardrails: p = 0.02 and 0.04 both reject
    (0.02 <= 0.05/2, then 0.04 <= 0.05), p = 0.03 and 0.04 reject neither."""
    both = [("guardrail", ev(beyond=0.02)), ("guardrail", ev(beyond=0.04))]
    assert decide(both, planned=True) == ("reject", ["beyond", "beyond"])  # type: ignore[arg-type]
    neither = [("guardrail", ev(beyond=0.03)), ("guardrail", ev(beyond=0.04))]
    assert decide(neither, planned=True)[0] == "hold"  # type: ignore[arg-type]


def test_promote_needs_every_guardrail_and_the_goal() -> None:
    """Intersection–union: all guardrails inside and the goal shown promote; any one missing
    holds; a guardrail without data does not block."""
    good: list[tuple[Role, Evidence]] = [
        ("critical", ev(inside=LOW)),
        ("guardrail", ev(inside=LOW)),
        ("guardrail", ev(n=0)),
        ("goal", ev(goal=LOW)),
        ("diagnostic", ev()),
    ]
    assert decide(good) == ("promote", ["inside", "inside", "n/a", "improved", "info"])
    no_goal = [*good[:3], ("goal", ev(goal=0.2))]
    assert decide(no_goal)[0] == "hold"
    one_open = [("critical", ev(inside=0.2)), *good[1:]]
    assert decide(one_open) == ("hold", ["undecided", "inside", "n/a", "improved", "info"])


def test_gates_block_promotion() -> None:
    """Below the minimum pairs, or with too few sampled copies observed, nothing promotes; a
    metric below its own minimum is insufficient and blocks too."""
    fine: list[tuple[Role, Evidence]] = [("critical", ev(inside=LOW))]
    assert decide(fine, n=S.min_pairs - 1)[0] == "hold"
    verdict, _ = decide_arrays(
        ["critical"], [ev(inside=LOW)], n_pairs=1000, coverage_ok=False, planned=False, settings=S
    )
    assert int(verdict) == HOLD
    assert decide([("critical", ev(n=10, inside=LOW))]) == ("hold", ["insufficient"])


def test_decide_arrays_broadcasts_over_runs_and_looks() -> None:
    """Evidence arrays of shape (runs, looks) give verdicts of that shape, each run judged on
    its own."""
    inside = np.array([[HIGH, LOW], [LOW, LOW]])
    critical = np.array([[HIGH, HIGH], [HIGH, LOW]])
    e = Evidence(np.full((2, 2), 500.0), inside, np.ones((2, 2)), critical, np.ones((2, 2)))
    verdict, status = decide_arrays(
        ["critical"], [e], n_pairs=500.0, coverage_ok=True, planned=False, settings=S
    )
    np.testing.assert_array_equal(verdict, [[HOLD, PROMOTE], [PROMOTE, REJECT]])
    assert status.shape == (1, 2, 2)


def _result(name: str, role: Role, **kw: object) -> MetricResult:
    base: dict[str, object] = {
        "name": name,
        "label": name,
        "role": role,
        "harm": "higher",
        "scale": "ratio",
        "unit": "ratio",
        "n": 800,
        "estimate": 1.01,
        "ci_low": 0.97,
        "ci_high": 1.06,
        "margin": 1.05,
        "critical_margin": 1.25,
        "status": "undecided",
        "p_inside": 0.3,
        "p_beyond": 1.0,
        "p_critical": 1.0,
        "p_goal": 1.0,
        "more_pairs": 1200,
    }
    base.update(kw)
    return MetricResult(**base)  # type: ignore[arg-type]


def test_judge_explains_each_metric_in_one_line() -> None:
    """judge() sets statuses and one-line reasons; hold names the undecided metric and about
    how many more pairs it needs; gates come first."""
    ttft = _result("ttft", "critical")
    fine = _result("tpot", "critical", p_inside=1e-5, ci_high=1.02, more_pairs=None)
    info = _result("inter_event_p50", "diagnostic", p_inside=None)
    verdict, reasons = judge(
        [ttft, fine, info], n_pairs=800, coverage=0.95, planned=False, settings=S
    )
    assert verdict == "hold"
    assert [r.metric for r in reasons] == ["pairs", "coverage", "ttft", "tpot"]
    assert ttft.reason == "1.010 [0.970, 1.060] n=800: undecided vs 1.05; ≈1,200 more pairs"
    assert fine.reason.endswith("within the margin 1.05") and info.status == "info"
    line = summary(verdict, [ttft, fine, info], reasons)
    assert line == "hold: ttft undecided (≈1,200 more pairs)"
    _, low_cover = judge([fine], n_pairs=800, coverage=0.5, planned=False, settings=S)
    assert low_cover[1].status == "insufficient"
