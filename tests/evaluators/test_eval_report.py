"""Reports built from synthetic pairs through the whole pipeline (PairSet, every evaluator,
the verdict): planted effects decided right, the JSON schema, caveats, overrides, rendering."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from domain.endpoint import Endpoint
from domain.errors import UsageError
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.report.build import build_report
from evaluators.report.model import Report, report_from_json, report_to_json
from evaluators.report.render import render

S = VerdictSettings()
LIVE = Endpoint(name="live", url="http://l", role="live", price_per_hour_usd=4.0)
CONTROL = Endpoint(name="ctrl", url="http://k", kind="control")
ACCOUNTING = {"sampled": 5000, "deduplicated": 10, "observed_ok": 4950, "observed_error": 20}


def report(
    scenario: synthetic.Scenario,
    n: int,
    *,
    kind: str = "bi-kv",
    seed: int = 1,
    planned: bool = False,
    overrides: dict[str, float] | None = None,
    accounting: dict[str, int] | None = None,
) -> Report:
    cand = Endpoint(
        name="cand",
        url="http://c",
        kind=kind,
        price_per_hour_usd=2.0,
        verdict=overrides or {},
    )
    pairs = pairset_from_pairs(synthetic.pairs(scenario, n, seed=seed))
    return build_report(
        pairs,
        candidate=cand,
        live=LIVE,
        control=CONTROL if scenario.control is not None else None,
        accounting=ACCOUNTING if accounting is None else accounting,
        settings=S,
        planned_look=planned,
    )


def status(r: Report, metric: str) -> str:
    return r.metrics[metric].status


@pytest.mark.parametrize(
    ("label", "arm", "n", "metric"),
    [
        ("2x slower TTFT", synthetic.Arm(ttft_ratio=2.0), 300, "ttft"),
        ("30% divergent at T=0", synthetic.Arm(divergence=0.3), 400, "exact_match"),
        ("+10 pp errors", synthetic.Arm(error_rate=0.1), 600, "errors"),
        ("2x slower decode", synthetic.Arm(tpot_ratio=2.0), 300, "tpot"),
    ],
)
def test_planted_harm_is_rejected(label: str, arm: synthetic.Arm, n: int, metric: str) -> None:
    """Decisive harm rejects at an ordinary look, naming the critical metric."""
    r = report(synthetic.Scenario(candidate=arm), n)
    assert r.verdict == "reject", label
    assert status(r, metric) == "critical"
    assert r.reasons[0].reason.startswith("reject: harm shown on")


def test_planted_improvement_is_promoted() -> None:
    """A bi-kv candidate 20 % faster on later turns, clean otherwise, is promoted once the
    0.1 pp failure margin can be shown (about 4,000 clean pairs)."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.8))
    r = report(scenario, 4500, accounting={})
    assert r.verdict == "promote", r.reasons[0].reason
    assert status(r, "ttft_later_turns") == "improved"
    early = report(scenario, 1500)
    assert early.verdict == "hold" and status(early, "errors") == "undecided"
    assert early.metrics["errors"].more_pairs is not None
    assert "failures undecided (≈" in early.reasons[0].reason


def test_quantized_goal_is_cost() -> None:
    """A quantized candidate at half the live price with equal speed shows the cost goal."""
    loose = {"error_delta": 0.02, "error_critical": 0.05}
    r = report(synthetic.Scenario(), 600, kind="quantized", overrides=loose)
    cost = r.metrics["cost"]
    assert cost.role == "goal" and cost.status == "improved"
    assert cost.estimate is not None and math.isclose(cost.estimate, 0.5, rel_tol=0.05)


def test_guardrail_harm_waits_for_the_planned_size() -> None:
    """Answers 15 % longer are beyond the 1.10 length margin but within the critical 1.50 (a
    mean sequence): hold before the planned size (the horizon), reject at a planned look, and
    reject by itself once the units reach the horizon."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(length_ratio=1.15))
    early = {"horizon_units": 5000}
    r = report(scenario, 1500, overrides=early)
    assert status(r, "output_length") == "beyond" and r.verdict == "hold"
    assert "would reject from 5,000 units" in r.metrics["output_length"].reason
    assert report(scenario, 1500, planned=True, overrides=early).verdict == "reject"
    assert report(scenario, 1500).verdict == "reject"  # past the default horizon of 300


def test_without_control_the_report_says_so() -> None:
    """Without a control: production is the reference and the caveats say what that costs."""
    r = report(synthetic.Scenario(control=None), 300)
    assert r.pairs.reference == "production" and r.pairs.control is None
    assert any("no control candidate" in c and "different load" in c for c in r.caveats)
    assert any("noise floor is assumed to be 0" in n for n in r.metrics["exact_match"].notes)


def test_candidate_overrides_apply() -> None:
    """A candidate's verdict change its margins (here margins loose enough for 150
    sessions let a clean 600-pair candidate promote)."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.8))
    loose = {"error_delta": 0.03, "error_critical": 0.05, "slo_exceedance_delta": 0.05}
    loose |= {"agreement_delta": 0.05, "agreement_critical": 0.1, "similarity_delta": 0.05}
    r = report(scenario, 600, overrides=loose)
    assert r.metrics["errors"].margin == 0.03 and r.verdict == "promote"


def test_json_schema_round_trip() -> None:
    """The JSON form has the documented top level, encodes NaN as null and decodes back."""
    r = report(synthetic.Scenario(json_fraction=0.2), 300, planned=True)
    data = report_to_json(r)
    doc = json.loads(data)
    assert list(doc)[:5] == ["schema_version", "candidate", "kind", "verdict", "reasons"]
    assert set(doc) >= {"pairs", "metrics", "accounting", "ttft_by_turn", "arms_load", "caveats"}
    assert doc["metrics"]["ttft"]["n"] == doc["pairs"]["used_latency"]
    assert {"estimate", "ci_low", "ci_high", "n", "status", "margin"} <= set(doc["metrics"]["ttft"])
    assert report_from_json(data) == msgspec.json.decode(data, type=Report)
    assert report_from_json(data).verdict == r.verdict


def test_sessions_and_turns_are_reported() -> None:
    """Session sampling: session-robust latency and whole-session bootstraps are stated;
    TTFT by turn shows the later-turn speed-up and the engine's cached-token share."""
    scenario = synthetic.Scenario(candidate=synthetic.Arm(later_turn_ttft_ratio=0.7))
    r = report(scenario, 800, planned=True)
    assert any("sampling by session" in c for c in r.caveats)
    turns = {row["turn"]: row for row in r.ttft_by_turn}
    assert turns["1"]["ratio"] is not None and 0.95 < float(turns["1"]["ratio"]) < 1.05
    assert float(turns["2"]["ratio"]) < 0.75  # type: ignore[arg-type]
    assert r.metrics["ttft_p95"].status == "info" and r.metrics["ttft"].slices


def test_every_format_renders() -> None:
    """Text, markdown, JSON and HTML all render the same report; the page plots four fixed
    charts plus one interval-against-pairs chart per gating metric with a trajectory."""
    r = report(synthetic.Scenario(json_fraction=0.1, tools_fraction=0.1), 300)
    text = render(r, "text")
    assert text.splitlines()[0] == "canary report: cand (bi-kv): HOLD"
    assert render(r, "markdown").startswith("# canary report: cand")
    assert json.loads(render(r, "json"))["candidate"] == "cand"
    page = render(r, "html")
    drawn = sum(1 for m in r.metrics.values() if m.gating and len(m.trajectory) >= 2)
    assert drawn >= 5 and "interval against pairs" in page
    assert page.startswith("<!doctype html>") and page.count("<svg") == 4 + drawn
    with pytest.raises(UsageError, match="unknown format"):
        render(r, "pdf")  # type: ignore[arg-type]


def test_empty_window_holds() -> None:
    """No pairs at all: hold, insufficient pairs, nothing claimed, and every gating metric says
    it is not gating for want of data."""
    r = report(synthetic.Scenario(), 0, accounting={})
    assert r.verdict == "hold" and r.pairs.n == 0
    assert r.reasons[1].status == "insufficient"
    assert all(m.status in ("n/a", "info", "ungated") for m in r.metrics.values())
    assert all(m.ungated for m in r.metrics.values() if m.status == "ungated")


def test_copies_shed_by_hash_are_not_missing_and_the_report_says_when() -> None:
    """Copies shed by hash under the mirror's capacity share (`shed_capacity`) are a smaller
    sample, not missing copies: coverage is observed over the copies due without them, the gate
    passes, and a caveat states how many were shed and between which instants; copies the loop
    guard shed by timing (`shed_overload`) still count as missing."""
    base = {"sampled": 5000, "observed_ok": 4400, "observed_error": 40}
    shed = {
        **base,
        "shed_capacity": 560,
        "shed_capacity_first_at": 1_800_000_000,
        "shed_capacity_last_at": 1_800_000_042,
        "shed_capacity_seconds": 40,
    }
    r = report(synthetic.Scenario(), 400, accounting=shed)
    assert r.pairs.coverage == 1.0
    coverage = next(x for x in r.reasons if x.metric == "coverage")
    assert coverage.status == "ok"
    line = next(c for c in r.caveats if "shed by hash" in c)
    assert "560 sampled copies (11.2%)" in line
    assert "40 s between 2027-01-15 08:00:00 UTC and 2027-01-15 08:00:42 UTC" in line
    assert "shed_capacity_first_at" not in render(r, "text")  # instants are not copies
    guard = report(synthetic.Scenario(), 400, accounting={**base, "shed_overload": 560})
    assert guard.pairs.coverage == pytest.approx(4440 / 5000)
    assert not any("shed by hash" in c for c in guard.caveats)
    assert any("560 of them shed by the mirror's loop guard" in c for c in guard.caveats)
