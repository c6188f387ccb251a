"""Fixed-sample paired estimates against brute force and scipy: HL, Wilcoxon, McNemar,
and the (session) bootstrap of quantile ratios."""

from __future__ import annotations

import numpy as np
from scipy import stats

from evaluators.stats.paired import (
    bootstrap_quantile_ratio,
    hodges_lehmann,
    mcnemar,
    subsample,
    wilcoxon_p,
)


def test_hodges_lehmann_matches_brute_force() -> None:
    """HL estimate and its interval are the median and the Wilcoxon order statistics of the
    explicitly enumerated Walsh averages."""
    rng = np.random.default_rng(1)
    x = rng.normal(0.1, 1.0, 60)
    walsh = np.sort([(x[i] + x[j]) / 2 for i in range(60) for j in range(i, 60)])
    m = len(walsh)
    c = int(np.floor(m / 2 - stats.norm.isf(0.025) * np.sqrt(60 * 61 * 121 / 24)))
    hl = hodges_lehmann(x, 0.05)
    # located by bisection to 2e-5 of the data's range (here ~6)
    assert np.isclose(hl.estimate, np.median(walsh), atol=2e-4)
    assert np.isclose(hl.low, walsh[c - 1], atol=2e-4)
    assert np.isclose(hl.high, walsh[m - c], atol=2e-4)
    assert hl.n == 60


def test_hodges_lehmann_subsamples_large_inputs() -> None:
    """Above the cap HL uses a systematic subsample and says how many pairs it used."""
    x = np.random.default_rng(2).normal(0.2, 1.0, 100_000)
    hl = hodges_lehmann(x, 0.05, cap=5000)
    assert hl.n == 5000 and hl.low < 0.2 < hl.high


def test_wilcoxon_matches_scipy() -> None:
    """The signed-rank p-value equals scipy's normal approximation with continuity correction."""
    x = np.random.default_rng(3).normal(0.15, 1.0, 200)
    ref = stats.wilcoxon(x, method="approx", correction=True).pvalue
    assert np.isclose(wilcoxon_p(x), ref, rtol=1e-6)
    assert np.isnan(wilcoxon_p(np.zeros(50)))


def test_mcnemar_is_exact_binomial_on_discordant_pairs() -> None:
    """McNemar counts discordant pairs each way and tests them with the exact binomial; below
    the discordance minimum the p-value is withheld."""
    cand = np.array([True] * 30 + [False] * 70)
    ref = np.array([False] * 25 + [True] * 5 + [True] * 10 + [False] * 60)
    res = mcnemar(cand, ref, min_disc=30)
    assert (res.worse, res.better, res.n) == (25, 10, 100)
    assert np.isclose(res.p, stats.binomtest(25, 35, 0.5).pvalue)
    assert np.isnan(mcnemar(cand, ref, min_disc=50).p)


def test_session_bootstrap_is_wider_under_correlated_sessions() -> None:
    """Resampling whole sessions widens the quantile-ratio interval when each arm's latency
    varies by session, and the estimate is the plain ratio of quantiles."""
    rng = np.random.default_rng(4)
    sessions = np.repeat(np.arange(100), 10)
    base = rng.lognormal(0, 0.5, 1000)
    cand = base * np.repeat(rng.lognormal(0, 0.3, 100), 10)  # each arm's speed varies by session
    ref = base * np.repeat(rng.lognormal(0, 0.3, 100), 10)
    est, lo, hi = bootstrap_quantile_ratio(cand, ref, 0.95, groups=sessions, draws=300, alpha=0.05)
    _, lo1, hi1 = bootstrap_quantile_ratio(cand, ref, 0.95, groups=None, draws=300, alpha=0.05)
    assert np.isclose(est, np.quantile(cand, 0.95) / np.quantile(ref, 0.95))
    assert lo < est < hi
    assert hi - lo > hi1 - lo1


def test_subsample_spans_the_whole_window() -> None:
    """A systematic subsample keeps the first and last rows and is sorted."""
    idx = subsample(1_000_000, 1000)
    assert len(idx) == 1000 and idx[0] == 0 and idx[-1] == 999_999
    assert np.all(np.diff(idx) > 0)
    assert len(subsample(10, 1000)) == 10
