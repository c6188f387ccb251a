"""The ramp's building blocks on hand-made data: session summaries, the two-sample sequences,
the step's rules and its stated duration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from domain.errors import UsageError
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import session_units
from evaluators.rollout.step import gating_tests, judge_step, step_duration
from evaluators.rollout.twosample import (
    Comparison,
    Decision,
    MeanDiff,
    ShareDiff,
    _pair,
    comparison,
    mixture_boundary,
)
from evaluators.stats.sequential import MeanStat
from tests.evaluators.rollout_world import generate

NAN = math.nan


def test_session_summaries_from_requests() -> None:
    """Each session's failure share leaves out abandoned requests, its log TTFT is split into
    turn 1 and later turns, SLO shares count answered requests, and sessions come in the order
    of their last request."""
    units = session_units(
        {
            "session": np.array([7, 3, 7, 7, 3, 7]),
            "arm": np.array([1, 0, 1, 1, 0, 1]),
            "turn": np.array([1, 1, 2, 3, 2, 4]),
            "ok": np.array([True, True, True, False, True, True]),
            "ttft_s": np.array([1.0, 3.0, 0.5, NAN, 2.0, 0.25]),
            "e2e_s": np.array([4.0, 40.0, 2.0, 0.1, 20.0, 1.0]),
            "disconnected": np.array([False, False, False, False, False, True]),
        },
        slo_ttft_s=2.5,
        slo_e2e_s=30.0,
    )
    assert units.session.tolist() == [3, 7]  # session 3 ends at request 5, 7 at request 6
    assert units.candidate.tolist() == [False, True]
    v = units.values
    assert v["failure"][1] == pytest.approx(1 / 3)  # 3 counted requests, one failed
    assert v["failure"][0] == 0.0
    assert v["ttft_first"].tolist() == pytest.approx([math.log(3.0), 0.0])
    assert v["ttft_later"].tolist() == pytest.approx([math.log(2.0), math.log(0.5)])
    assert v["e2e"][1] == pytest.approx((math.log(4.0) + math.log(2.0)) / 2)
    assert v["ttft_slo"].tolist() == [0.5, 0.0]
    assert v["e2e_slo"].tolist() == [0.5, 0.0]
    assert units.arm("failure", candidate=True).tolist() == pytest.approx([1 / 3])


def test_a_session_served_by_two_arms_is_refused() -> None:
    """During a ramp a session has one arm: requests saying otherwise raise UsageError, as do
    arrays of different lengths."""
    ones = np.ones(2)
    cols = {
        "session": np.array([1, 1]),
        "arm": np.array([0, 1]),
        "turn": np.array([1, 2]),
        "ok": np.ones(2, bool),
        "ttft_s": ones,
        "e2e_s": ones,
        "disconnected": np.zeros(2, bool),
    }
    with pytest.raises(UsageError, match="one arm"):
        session_units(cols, slo_ttft_s=1.0, slo_e2e_s=1.0)
    with pytest.raises(UsageError, match="one entry"):
        session_units({**cols, "disconnected": np.zeros(3, bool)}, slo_ttft_s=1.0, slo_e2e_s=1.0)
    with pytest.raises(UsageError, match="no column e2e_s"):
        session_units(
            {k: v for k, v in cols.items() if k != "e2e_s"}, slo_ttft_s=1.0, slo_e2e_s=1.0
        )


def test_a_further_duration_is_summarized_without_naming_it() -> None:
    """A duration the evidence gains (a float column `<name>_s`) becomes the summary `<name>`:
    each session's mean log over its answered requests, as TTFT and E2E are."""
    cols = {
        "session": np.array([1, 1, 2]),
        "arm": np.array([0, 0, 1]),
        "turn": np.array([1, 2, 1]),
        "ok": np.array([True, True, False]),
        "ttft_s": np.array([0.5, 0.25, NAN]),
        "e2e_s": np.array([1.0, 2.0, 3.0]),
        "disconnected": np.zeros(3, bool),
        "headers_s": np.array([0.1, 0.4, 0.2]),
    }
    units = session_units(cols, slo_ttft_s=1.0, slo_e2e_s=10.0)
    assert units.values["headers"][0] == pytest.approx((math.log(0.1) + math.log(0.4)) / 2)
    assert math.isnan(units.values["headers"][1])  # its one request failed: nothing answered


def test_the_mixture_boundary_is_meanstats() -> None:
    """The two-sample boundary is MeanStat's normal mixture (planned share 0): the same
    half-width at every look and horizon, so the two cannot drift apart."""
    x = np.random.default_rng(0).normal(0.3, 1.2, 500)
    looks = np.array([10, 50, 200, 500])
    for horizon in (50.0, 300.0, 5000.0):
        ms = MeanStat(x, looks, horizon=horizon, sigma_floor=0.01)
        mine = mixture_boundary(ms.t, horizon, 0.05) * np.sqrt(ms.var) / ms.t
        np.testing.assert_allclose(mine, ms.halfwidth(0.05), rtol=1e-12)


def test_mean_difference_information_is_set_by_the_smaller_arm() -> None:
    """The estimate is the difference of the arms' means, and with equal variances the
    information is the harmonic-mean-like 2 n_c n_p / (n_c + n_p): about twice the smaller arm."""
    rng = np.random.default_rng(1)
    cand = np.zeros(2000, dtype=bool)
    cand[::20] = True  # a 5 % step: 100 candidate sessions
    x = rng.normal(0.0, 1.0, 2000) + np.where(cand, 0.2, 0.0)
    st = MeanDiff(x, cand, horizon=200.0, sigma_floor=0.01)
    assert st.estimate[0] == pytest.approx(x[cand].mean() - x[~cand].mean())
    assert (st.n_c[0], st.n_p[0]) == (100, 1900)
    assert 2 * 100 * 1900 / 2000 * 0.8 < st.t[0] < 2 * 100 * 1900 / 2000 * 1.2


def test_pairs_follow_arm_labels_in_time() -> None:
    """Each session of the smaller arm is paired with the next unused session of the larger arm
    closing after it, and a pair completes when its later session closes."""
    cand = np.array([1, 0, 1, 1, 0, 0, 0, 1, 0], dtype=bool)
    x = np.arange(9, dtype=np.float64)
    d, close = _pair(x, cand, np.ones(9, dtype=bool), candidate_smaller=True)
    # candidates 0, 2, 3, 7 pair with production 1, 4, 5, 8
    assert d.tolist() == [0 - 1, 2 - 4, 3 - 5, 7 - 8]
    assert close.tolist() == [1, 4, 5, 8]
    st = ShareDiff(x / 10, cand, np.array([3, 6, 9]), candidate_smaller=True)
    assert st.pairs.tolist() == [1, 3, 4]


def test_insufficient_data_gives_no_number() -> None:
    """Below the minimum sessions in either arm a comparison says "insufficient" and shows no
    estimate or interval, however many sessions the other arm has."""
    cand = np.zeros(400, dtype=bool)
    cand[:20] = True
    x = np.random.default_rng(2).normal(0.0, 1.0, 400)
    got = comparison(
        "ttft_first",
        MeanDiff(x, cand, horizon=100.0, sigma_floor=0.01),
        margin=0.05,
        alpha_harm=0.01,
        alpha_ok=0.05,
        min_units=30,
    )
    assert (got.decision, got.estimate, got.lower, got.upper) == ("insufficient", None, None, None)
    assert (got.n_candidate, got.n_production) == (20, 380)


def _test(name: str, decision: Decision) -> Comparison:
    return Comparison(name, decision, 0.05, 100, 300, 0.0, -0.1, 0.1)


def test_step_rules() -> None:
    """Rollback on any harm (naming it), advance only when every test is ok and the minimum
    step time has passed, wait otherwise (naming what is not yet ok)."""
    oks = [_test("ttft_first", "ok"), _test("failure", "ok")]
    assert judge_step(oks, elapsed_s=600, min_step_s=300).action == "advance"
    early = judge_step(oks, elapsed_s=100, min_step_s=300)
    assert (early.action, early.because) == ("wait", ())
    mixed = [_test("ttft_first", "ok"), _test("failure", "undecided")]
    waiting = judge_step(mixed, elapsed_s=600, min_step_s=300)
    assert (waiting.action, [t.name for t in waiting.because]) == ("wait", ["failure"])
    harm = [_test("ttft_first", "insufficient"), _test("e2e", "harm"), _test("failure", "ok")]
    rolled = judge_step(harm, elapsed_s=0, min_step_s=300)
    assert (rolled.action, [t.name for t in rolled.because]) == ("rollback", ["e2e"])


def test_a_live_step_reads_its_decisions_off_its_intervals() -> None:
    """On one generated step, every gating test's decision agrees with its interval: harm iff
    the lower bound is past the margin, ok iff the upper bound is inside it."""
    req = generate(np.random.default_rng(5), runs=1, sessions=3000, weight=0.25, ttft_factor=1.4)
    settings = VerdictSettings()
    units = session_units(
        req.columns(),
        slo_ttft_s=settings.slo_ttft_s,
        slo_e2e_s=settings.slo_e2e_s,
    )
    tests = gating_tests(units, settings, weight=0.25, horizon_sessions=20_000)
    harmful = {t.name for t in tests if t.decision == "harm"}
    assert {"ttft_first", "ttft_later"} <= harmful <= {"ttft_first", "ttft_later", "e2e"}
    for t in tests:
        assert t.lower is not None and t.upper is not None and t.estimate is not None
        assert t.lower <= t.estimate <= t.upper
        assert (t.decision == "harm") == (t.lower > t.margin)
        assert (t.decision == "ok") == (t.upper < t.margin)
    judged = judge_step(tests, elapsed_s=60, min_step_s=300)
    assert judged.action == "rollback"


def test_step_duration_follows_the_weight() -> None:
    """A 5 % step needs several times the sessions of a 25 % one at the same noise (its smaller
    arm sets the width); seconds follow the session rate; a weight of 1 is refused."""
    five = step_duration(0.05, 2.0, 0.8, math.log(1.05), alpha=0.05)
    quarter = step_duration(0.25, 2.0, 0.8, math.log(1.05), alpha=0.05)
    assert five.sessions is not None and quarter.sessions is not None
    assert 3.0 < five.sessions / quarter.sessions < 5.0  # 0.375 / 0.095
    assert five.seconds == pytest.approx(five.sessions / 2.0)
    assert step_duration(0.05, 2.0, 0.8, 1e-5, alpha=0.05).sessions is None
    share = step_duration(0.25, 1.0, 1e-4, 0.01, alpha=0.05, kind="share")
    assert share.sessions is not None and share.sessions >= math.log(20) / 0.008 / 0.25
    with pytest.raises(UsageError):
        step_duration(1.0, 2.0, 0.8, 0.05, alpha=0.05)
