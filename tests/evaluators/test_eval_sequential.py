"""The confidence sequences keep their promise under continuous peeking; a fixed test does not."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from evaluators.stats.sequential import (
    BoundedStat,
    MeanStat,
    benjamini_hochberg,
    holm,
    pairs_needed,
)

ALPHA = 0.05
RUNS, N = 2000, 1000
LOOKS = np.arange(30, N + 1, 10)


def _mean_stat(x: np.ndarray, looks: np.ndarray = LOOKS) -> MeanStat:
    return MeanStat(x, looks, horizon=300, sigma_floor=0.01)


@pytest.mark.parametrize("dist", ["normal", "t3", "skewed"])
def test_mean_cs_time_uniform_error_under_peeking(dist: str) -> None:
    """Looking every 10 pairs from 30 to 1,000, the normal-mixture bound on each side is
    crossed under the null in at most α of 2,000 runs (normal, heavy-tailed t3, skewed)."""
    rng = np.random.default_rng(1)
    if dist == "normal":
        x = rng.normal(0.0, 0.14, (RUNS, N))
    elif dist == "t3":
        x = 0.1 * rng.standard_t(3, (RUNS, N))
    else:  # strongly right-skewed: a lognormal, centred on its mean
        x = rng.lognormal(0.0, 0.5, (RUNS, N))
        x = x - np.exp(0.125)
    st = _mean_stat(x)
    for side in ("below", "above"):
        crossed = np.mean(np.any(st.p(0.0, side) <= ALPHA, axis=1))
        print(f"{dist} {side}: {crossed:.3f}")
        assert crossed <= ALPHA


def test_peeking_with_a_fixed_test_inflates_errors() -> None:
    """Re-running a plain one-sided z-test at every look gives several times α false
    positives on the same data where the confidence sequence stays below α."""
    rng = np.random.default_rng(2)
    x = rng.normal(0.0, 0.14, (RUNS, N))
    t = LOOKS.astype(float)
    csum = np.cumsum(x, axis=1)[:, LOOKS - 1]
    z = csum / (0.14 * np.sqrt(t))
    naive = np.mean(np.any(z < -stats.norm.isf(ALPHA), axis=1))
    always_valid = np.mean(np.any(_mean_stat(x).p(0.0, "below") <= ALPHA, axis=1))
    print(f"naive {naive:.3f} vs always-valid {always_valid:.3f}")
    assert naive > 4 * ALPHA and always_valid <= ALPHA


@pytest.mark.parametrize(("p_cand", "p_ref"), [(0.001, 0.001), (0.05, 0.05), (0.3, 0.3)])
def test_betting_cs_time_uniform_error(p_cand: float, p_ref: float) -> None:
    """For paired binary differences (rare to common discordance) the betting bounds are
    crossed under the null in at most α of 2,000 runs, looking after every pair."""
    rng = np.random.default_rng(3)
    d = (rng.random((RUNS, N)) < p_cand).astype(float) - (rng.random((RUNS, N)) < p_ref)
    st = BoundedStat(d, np.arange(1, N + 1))
    for side in ("below", "above"):
        crossed = np.mean(np.any(st.p(0.0, side) <= ALPHA, axis=1))
        assert crossed <= ALPHA, (side, crossed)


def test_betting_cs_needs_about_4000_clean_pairs_for_a_tenth_of_a_point() -> None:
    """With no discordant pair at all the upper bound falls like ~4/n (the rule of three is
    3/n at a single fixed n): 0.1 pp is reached between 3,000 and 4,500 pairs."""
    st = BoundedStat(np.zeros((1, 6000)), np.arange(1, 6001))
    first = int(np.argmax(st.p(0.001, "below")[0] <= ALPHA)) + 1
    assert 3000 < first < 4500


def test_bounds_agree_with_p_values() -> None:
    """Each reported bound is where the always-valid p-value crosses α (both families)."""
    rng = np.random.default_rng(4)
    x = rng.normal(0.05, 0.2, 500)
    ms = _mean_stat(x, np.array([250, 500]))
    lo, hi = ms.bounds(ALPHA)
    assert (
        ms.p(float(hi[-1]) + 1e-6, "below")[-1] <= ALPHA < ms.p(float(hi[-1]) - 1e-3, "below")[-1]
    )
    assert (
        ms.p(float(lo[-1]) - 1e-6, "above")[-1] <= ALPHA < ms.p(float(lo[-1]) + 1e-3, "above")[-1]
    )
    d = (rng.random(800) < 0.1).astype(float) - (rng.random(800) < 0.05)
    bs = BoundedStat(d, np.array([400, 800]))
    blo, bhi = bs.bounds(ALPHA)
    assert blo[-1] < d.mean() < bhi[-1]
    assert bs.p(float(bhi[-1]) + 1e-4, "below")[-1] <= ALPHA * 1.001
    assert bs.p(float(bhi[-1]) - 1e-3, "below")[-1] > ALPHA
    assert bhi[0] - blo[0] > bhi[1] - blo[1]  # narrower with more pairs


def test_session_robust_variance_restores_coverage() -> None:
    """With correlated turns (8 per session, strong session effect), the i.i.d. variance makes
    the sequence miss the truth far more than α; the session-robust variance does not."""
    rng = np.random.default_rng(5)
    runs, n, turns = 400, 800, 8
    groups = np.arange(n) // turns
    missed_iid = missed_cluster = 0
    for _ in range(runs):
        x = np.repeat(rng.normal(0, 0.2, n // turns), turns) + rng.normal(0, 0.05, n)
        looks = np.arange(80, n + 1, 80)
        iid = _mean_stat(x, looks)
        robust = MeanStat(x, looks, horizon=300, sigma_floor=0.01, groups=groups)
        missed_iid += bool(np.any(iid.p(0.0, "below") <= ALPHA))
        missed_cluster += bool(np.any(robust.p(0.0, "below") <= ALPHA))
    print(f"iid {missed_iid / runs:.3f}, session-robust {missed_cluster / runs:.3f}")
    assert missed_iid / runs > 2 * ALPHA
    assert missed_cluster / runs <= ALPHA


def test_holm_step_down() -> None:
    """Holm rejects in order of p while p_(j) <= α/(K-j+1), per column (run)."""
    p = np.array([[0.01, 0.01], [0.02, 0.03], [0.04, 0.5]])
    out = holm(p, 0.05)
    np.testing.assert_array_equal(out[:, 0], [True, True, True])  # .0167, .025, .05
    np.testing.assert_array_equal(out[:, 1], [True, False, False])


def test_weighted_holm_step_down() -> None:
    """Weighted Holm: in the order of p / w, reject while p <= α w / (weights left); weight 0
    is never rejected; equal weights are Holm's."""
    p = np.array([[0.015, 0.02, 0.015], [0.01, 0.01, 0.001], [0.03, 0.5, 0.5]])
    w = np.array([3.0, 1.0, 0.0])
    out = holm(p, 0.05, w)
    # column 0: order .015/3 (.005), .01/1 -> thresholds .05*3/4 = .0375 then .05*1/1 = .05
    np.testing.assert_array_equal(out[:, 0], [True, True, False])
    # column 1: .02/3 (.0067) <= .0375, then .01 <= .05
    np.testing.assert_array_equal(out[:, 1], [True, True, False])
    # column 2: .001/1 (.001) first: .001 <= .05/4; then .015 <= .05*3/3
    np.testing.assert_array_equal(out[:, 2], [True, True, False])
    unweighted = np.array([[0.01, 0.01], [0.02, 0.03], [0.04, 0.5]])
    np.testing.assert_array_equal(holm(unweighted, 0.05, np.ones(3)), holm(unweighted, 0.05))
    one_heavy = np.array([[0.03], [0.001]])  # alone at α·3/4 = .0375: rejected; Holm's .025 not
    np.testing.assert_array_equal(holm(one_heavy, 0.05, np.array([3.0, 1.0]))[:, 0], [True, True])
    np.testing.assert_array_equal(holm(np.array([[0.03], [0.5]]), 0.05)[:, 0], [False, False])


def test_benjamini_hochberg_q_values() -> None:
    """BH q-values: p·K/rank made monotone, NaN left alone."""
    q = benjamini_hochberg(np.array([0.01, 0.04, 0.03, np.nan, 0.5]))
    np.testing.assert_allclose(q[[0, 1, 2, 4]], [0.04, 0.0533333, 0.0533333, 0.5], rtol=1e-5)
    assert np.isnan(q[3])


def test_pairs_needed_extrapolates_the_shrink_rate() -> None:
    """Widths shrinking like 1/sqrt(n) from 0.04 at 100 pairs reach 0.01 at 1,600 pairs."""
    assert pairs_needed(200, 100, 0.04 / np.sqrt(2), 0.04, 0.01) == 1400
    assert pairs_needed(200, 100, 0.01, 0.02, 0.05) == 0
    assert pairs_needed(200, 100, 0.01, 0.02, -0.01) is None
