"""Preference from an LLM grader, checked against an independent world (preference_world.py):
error rates and power of the net-preference test over 200 seeded runs per case, the position
bias and flip rate it reports, the length-controlled estimate, and the report path."""

from __future__ import annotations

import numpy as np
import pytest

from domain.endpoint import CandidateSpec, GraderSpec
from evaluators.judge.metric import EvalContext, MetricResult, evidence
from evaluators.judge.preference_plan import preference_plan
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import PROMOTE, REJECT, decide_arrays
from evaluators.metrics import preference
from evaluators.pairs.gradings import Gradings
from evaluators.pairs.types import PairSet
from evaluators.stats.sequential import BoundedStat
from tests.evaluators.preference_world import Grader, draw, stack

RUNS = 200
SETTINGS = VerdictSettings()
LOOK_EVERY = 100


def _planned_sessions() -> int:
    """The graded sessions `canary plan` states for a 5 pp margin at the default sd."""
    (plan,) = preference_plan((SETTINGS.preference_delta,), alpha=SETTINGS.alpha)
    assert plan.sessions is not None
    return plan.sessions


def _decisions(grader: Grader, sessions: int, seed: int) -> np.ndarray:
    """Each run's first non-hold verdict on the preference test alone, looked at every
    LOOK_EVERY sessions with the planned look at `sessions`."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(RUNS):
        v, _ = preference.unit_scores(draw(grader, sessions, rng), by_session=True)
        values.append(v)
    v = stack(values)
    looks = np.unique(np.append(np.arange(LOOK_EVERY, v.shape[1] + 1, LOOK_EVERY), v.shape[1]))
    spec = preference.preference_spec(SETTINGS)
    ev = evidence(spec, BoundedStat(v, looks))
    verdict, _ = decide_arrays(
        [spec.role],
        [ev],
        n_pairs=looks.astype(np.float64),
        coverage_ok=True,
        planned=looks == looks[-1],
        settings=SETTINGS,
    )
    decided = verdict != 0
    first = np.argmax(decided, axis=1)
    return np.where(decided.any(axis=1), verdict[np.arange(RUNS), first], 0)


def test_plan_states_about_seven_thousand_sessions_at_five_points() -> None:
    """At a 5 pp margin and a per-session sd of 0.9 (unclipped: issue 52) the plan states 6,000
    to 9,000 graded sessions, and a wider margin buys a decision about quadratically sooner."""
    plans = preference_plan((0.05, 0.10, 0.15), alpha=0.05, price_per_mtok=1.0)
    sessions = [p.sessions for p in plans]
    assert all(s is not None for s in sessions)
    assert 6_000 <= sessions[0] <= 9_000  # type: ignore[operator]
    assert 3.0 <= sessions[0] / sessions[1] <= 5.0  # type: ignore[operator]
    assert plans[0].cost_usd == pytest.approx(plans[0].tokens / 1e6)  # type: ignore[operator]


def test_false_rejects_at_net_zero_with_position_bias() -> None:
    """A grader indifferent between the arms but picking the first-shown answer a quarter of the
    time (b = 0.25) rejects the candidate in at most 5 % of 200 runs, looked at every 100
    sessions up to the planned ones."""
    grader = Grader.planting(0.0, b=0.25)
    assert grader.net == 0.0
    out = _decisions(grader, _planned_sessions(), seed=1)
    assert np.mean(out == REJECT) <= 0.05
    # ... and it is promoted (shown within the margin) in most runs by the plan's horizon.
    assert np.mean(out == PROMOTE) >= 0.8


def test_rejects_fifteen_points_worse_within_the_plan() -> None:
    """A candidate the grader likes 15 pp less net is rejected in at least 90 % of 200 runs
    within the graded sessions the plan states for a 5 pp margin."""
    grader = Grader.planting(-0.15, b=0.25)
    assert grader.net == pytest.approx(-0.15)
    out = _decisions(grader, _planned_sessions(), seed=2)
    assert np.mean(out == REJECT) >= 0.90
    assert np.mean(out == PROMOTE) == 0.0


@pytest.mark.parametrize("swap_rate", [0.0, 0.25, 1.0])
def test_net_preference_is_the_same_quantity_whatever_the_swap_rate(swap_rate: float) -> None:
    """The mean pair score estimates the planted order-averaged net preference whether no pair,
    a quarter or every pair is graded in both orders (200 runs of 500 sessions: the mean of
    the estimates within 1 pp, a strong position bias b = 0.4 included)."""
    grader = Grader.planting(-0.1, b=0.4, swap_rate=swap_rate)
    rng = np.random.default_rng(3)
    est = []
    for _ in range(RUNS):
        ps = preference.pair_scores(draw(grader, 500, rng))
        est.append(float(np.mean(ps.score)))
    assert abs(np.mean(est) - grader.net) <= 0.01


def test_position_bias_within_three_points_after_a_thousand_decisive_verdicts() -> None:
    """Once 1,000 decisive verdicts are in, the reported position bias is within ±3 pp of the
    planted one in at least 90 % of 200 runs, and its always-valid interval covers it in at
    least 95 %."""
    grader = Grader.planting(0.05, b=0.25)
    rng = np.random.default_rng(4)
    close, covered = 0, 0
    for _ in range(RUNS):
        g = draw(grader, 900, rng)
        decisive = np.flatnonzero(g.score != 0)
        cut = int(g.pair[decisive[999]]) + 1  # every verdict of the pairs up to the 1,000th
        keep = g.pair < cut
        g = _subset(g, keep)
        found = preference.position_bias(g, 0.05, by_session=True)
        assert found is not None
        est, lo, hi, n = found
        assert n >= 1_000
        close += abs(est - grader.position_bias) <= 0.03
        covered += lo <= grader.position_bias <= hi
    assert close >= 0.9 * RUNS
    assert covered >= 0.95 * RUNS


def test_flip_rate_of_a_grader_that_always_picks_the_first_answer() -> None:
    """A grader that always picks the first-shown answer flips every pair graded both ways;
    one that ignores position never flips a decisive pair it is sure about (p = 1)."""
    rng = np.random.default_rng(5)
    both, differ, decisive_both, flipped = preference.flips(draw(Grader(b=1.0), 400, rng))
    assert both > 50 and differ == both and flipped == decisive_both == both
    both, differ, decisive_both, flipped = preference.flips(
        draw(Grader(b=0.0, t=0.0, p=1.0), 400, rng)
    )
    assert both > 50 and differ == 0 and flipped == 0


def test_length_controlled_estimate_removes_a_verbosity_bias() -> None:
    """A grader indifferent at equal length but preferring the longer answer (+15 pp of p per
    doubling) shows a net preference of about +14 pp for a candidate that answers 1.5x longer;
    the length-controlled estimate (the intercept on the log length ratio) is near 0 and its
    slope near the planted 24 pp per doubling."""
    grader = Grader(b=0.0, t=0.2, p=0.5, length_pull=0.15, length_sd=0.6, length_ratio=1.5)
    g = draw(grader, 3_000, np.random.default_rng(6))
    ps = preference.pair_scores(g)
    per_pair = np.zeros(g.pairs)
    per_pair[g.pair] = np.log2((g.candidate_chars + 1.0) / (g.reference_chars + 1.0))
    naive = float(np.mean(ps.score))
    fit = preference.length_controlled(per_pair, ps.score)
    assert fit is not None
    intercept, se, slope = fit
    assert naive > 0.1
    assert abs(intercept) <= 3 * se
    assert abs(slope - 2 * 0.8 * 0.15) <= 0.06


def test_report_path_gates_on_preference_and_informs_on_agreement() -> None:
    """Through the evaluator: a candidate with a grader gets a gating net-preference result
    (with win/tie/loss shares, flip rate, tokens and cost), a position-bias diagnostic, and
    exact match marked as information instead of gating."""
    cand = CandidateSpec(
        name="upgrade",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:10", model="judge", price_per_mtok=2.0),
    ).to_endpoint()
    g = draw(Grader.planting(0.0, b=0.25), 600, np.random.default_rng(7))
    ctx = EvalContext(pairs=PairSet.empty(0), settings=SETTINGS, candidate=cand, gradings=g)
    results = preference.preference(ctx)
    by = {r.name: r for r in results}
    res = by[preference.NAME]
    assert res.gating and res.status == "undecided" and res.units is not None
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low <= 0.0 <= res.ci_high
    d = res.detail
    assert d["gradings_graded"] == g.n and d["gradings_unparseable"] == 0
    shares = (d["win_share"], d["tie_share"], d["loss_share"])
    assert sum(shares) == pytest.approx(1.0)  # type: ignore[arg-type]
    assert d["grader_cost_usd"] == pytest.approx(g.n * 1_000 / 1e6 * 2.0)
    assert isinstance(d["flip_rate"], float) and d["pairs_both_orders"]
    assert len(res.slices) == len(preference.LENGTH_BUCKETS) - 1
    assert len(res.trajectory) >= 2
    assert by["grader_position_bias"].status == "info"
    exact = MetricResult(
        name="exact_match", label="x", role="guardrail", harm="higher", scale="difference"
    )
    preference.informational([exact], ctx)
    assert exact.status == "ungated" and not exact.ungated_blocks


def test_unparseable_gradings_stop_preference_from_gating() -> None:
    """Past grading_failure_max of the attempts unparseable, preference does not gate and
    blocks promotion: missing verdicts are never counted as ties."""
    cand = CandidateSpec(
        name="upgrade",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:10", model="judge"),
    ).to_endpoint()
    g = draw(Grader.planting(0.0), 300, np.random.default_rng(8))
    bad = np.random.default_rng(9).random(g.n) < 0.2
    outcome = np.where(bad, 1, 0).astype(np.int8)  # GRADING_OUTCOMES[1] == "unparseable"
    g = Gradings(**{**_fields(g), "outcome": outcome, "score": np.where(bad, np.nan, g.score)})
    ctx = EvalContext(pairs=PairSet.empty(0), settings=SETTINGS, candidate=cand, gradings=g)
    res = preference.preference(ctx)[0]
    assert res.status == "ungated" and res.ungated_blocks
    assert "unparseable" in res.ungated
    assert res.detail["gradings_unparseable"] == int(bad.sum())


def _fields(g: Gradings) -> dict[str, np.ndarray]:
    # The per-verdict columns (the pair accounting is the window's, not a column).
    values = {f: getattr(g, f) for f in Gradings.__dataclass_fields__}
    return {f: v for f, v in values.items() if isinstance(v, np.ndarray)}


def _subset(g: Gradings, keep: np.ndarray) -> Gradings:
    return Gradings(**{f: v[keep] for f, v in _fields(g).items()})


def test_a_graded_candidate_without_gradings_cannot_be_promoted() -> None:
    """A candidate with a grader but no graded pair (its grader down) has preference ungated and
    blocking: with agreement information only, nothing else would gate its quality."""
    cand = CandidateSpec(
        name="upgrade",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:10", model="judge"),
    ).to_endpoint()
    for g in (None, Gradings.empty()):
        ctx = EvalContext(pairs=PairSet.empty(0), settings=SETTINGS, candidate=cand, gradings=g)
        (res,) = preference.preference(ctx)
        assert res.status == "ungated" and res.ungated_blocks and "no graded pair" in res.ungated
    plain = CandidateSpec(name="plain", url="http://127.0.0.1:9").to_endpoint()
    ctx = EvalContext(pairs=PairSet.empty(0), settings=SETTINGS, candidate=plain)
    assert preference.preference(ctx) == []
