"""Harm is rejected as soon as the evidence shows it (issue 52, item 1), on worlds written apart
from the verdict (`harm_world`), 200 runs a case, looking after every unit:

* the betting sequences (net preference, tool-call validity) reject at a median of at most
  1.5x the units at which their always-valid interval first lies beyond the margin;
* a latency candidate exactly at its margin, with heavy tails and session effects, is rejected
  in at most 5 % of runs, every look counted (the mean sequences' harm counts from the
  horizon, the planned size, on);
* a reject, once shown, stays: the report's verdict does not flip back at later looks.
"""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.judge.metric import MetricSpec
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import preference, toolcalls
from tests.evaluators import harm_world as hw
from tests.evaluators import tool_world as tw

# 200 runs a case: the slow tier (docs/getting-started.md, "Test tiers").
pytestmark = pytest.mark.slow

RUNS = 200
S = VerdictSettings()
TTFT = MetricSpec(
    name="ttft",
    label="TTFT",
    role="critical",
    harm="higher",
    scale="ratio",
    delta=S.latency_delta,
    critical=S.latency_critical,
)


def speed(spec: MetricSpec, v: np.ndarray) -> tuple[float, float, float]:
    """(median units to the interval first beyond δ, median units to the reject, share never
    rejected) over the runs in v."""
    ev, p_now = hw.bounded_evidence(spec, v)
    shown = hw.first_true(p_now <= S.alpha, ev.n)
    rejected = hw.first_reject(spec, ev, True, S)
    return float(np.median(shown)), float(np.median(rejected)), float(np.isinf(rejected).mean())


def test_fifteen_points_less_preferred_is_rejected_soon_after_its_interval_shows_it() -> None:
    """A grader that likes the candidate 15 pp less (margin 5 pp): rejected by every run, at a
    median of at most 1.5x the sessions at which the interval first lies below the margin."""
    v = hw.preference_units(-0.15, 2500, RUNS, 1000)
    shown, rejected, never = speed(preference.preference_spec(S), v)
    assert never == 0.0 and rejected <= 1.5 * shown, (shown, rejected, never)


def test_three_points_more_invalid_tool_calls_are_rejected_soon_after_they_show() -> None:
    """Production invalid in 1 % of answers, the candidate in 4 % (margin 1 pp): rejected by
    every run at a median of at most 1.5x the sessions of the interval's first showing."""
    v = hw.tool_units(tw.World(production=0.01, candidate=0.04), 1500, RUNS, 2000)
    shown, rejected, never = speed(toolcalls.spec(S), v)
    assert never == 0.0 and rejected <= 1.5 * shown, (shown, rejected, never)


def test_a_latency_candidate_at_its_margin_is_rejected_at_most_five_percent_every_look() -> None:
    """TTFT exactly 1.05x (the margin), log-t(3) tails per arm and session effects: rejected in
    at most 5 % of 200 runs by the product's rule, counting every look to 4x the horizon."""
    v = hw.latency_units(S.latency_delta, 4 * S.horizon_units, RUNS, 3000)
    ev = hw.mean_evidence(TTFT, v, S)
    rejected = hw.first_reject(TTFT, ev, ev.n >= S.horizon_units, S)
    assert np.isfinite(rejected).mean() <= 0.05


def test_a_latency_candidate_well_past_its_margin_is_rejected_at_its_planned_size() -> None:
    """TTFT 1.30x with the same tails (a session's mean log-ratio has an sd of about 0.9):
    rejected in at least 90 % of runs by the first look at the horizon, with nobody asking
    for a planned look."""
    v = hw.latency_units(1.30, S.horizon_units, RUNS, 4000)
    ev = hw.mean_evidence(TTFT, v, S)
    rejected = hw.first_reject(TTFT, ev, ev.n >= S.horizon_units, S)
    assert np.isfinite(rejected).mean() >= 0.90


def test_waiting_for_a_planned_look_fails_the_speed_row() -> None:
    """Mutation: the old rule (harm beyond δ rejects only at a planned look, none asked for)
    never rejects the -15 pp candidate, so the speed rows above would catch it."""
    v = hw.preference_units(-0.15, 1000, 20, 1000)
    spec = preference.preference_spec(S)
    ev, _ = hw.bounded_evidence(spec, v)
    assert np.isinf(hw.first_reject(spec, ev, False, S)).all()


def test_a_reject_shown_stays_shown_at_later_looks() -> None:
    """Through the report's path (`tool_validity` then `judge`): a candidate invalid 10 % more
    in its first 300 sessions and equal afterwards is rejected, and every later look still
    rejects although the current look's evidence alone would no longer."""
    bad, good = tw.World(candidate=0.11), tw.World(candidate=0.01)
    ps = hw.tool_switch(bad, good, 300, 3000, 7)
    ends = tw.session_ends(ps)
    verdicts = []
    for k in ends[49::150]:
        r = tw.judge_at(ps, int(k), S, planned=False)
        verdicts.append(r.status)
    first = verdicts.index("critical") if "critical" in verdicts else verdicts.index("beyond")
    assert all(v in ("critical", "beyond") for v in verdicts[first:]), verdicts
    v = hw.tool_units_of(ps)
    _, p_now = hw.bounded_evidence(toolcalls.spec(S), v)
    assert p_now[-1] > S.alpha  # at the last look the evidence alone would hold
