"""Classical paired estimates reported next to the always-valid decisions.

Wilcoxon signed-rank with the Hodges–Lehmann estimate and its distribution-free interval,
McNemar's exact test on discordant pairs, and the paired (optionally whole-session) bootstrap of
a quantile ratio. These are fixed-sample quantities: the report shows them as estimates, and only
the confidence sequences of `evaluators.stats.sequential` decide.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import stats

F = NDArray[np.float64]


class HL(NamedTuple):
    estimate: float
    low: float
    high: float
    p_wilcoxon: float
    n: int  # pairs used (a systematic subsample when there were more than the cap)


def subsample(n: int, cap: int) -> NDArray[np.int64]:
    """Indices of a systematic subsample of at most `cap` of n rows, spread over time."""
    if n <= cap:
        return np.arange(n, dtype=np.int64)
    return np.linspace(0, n - 1, cap).round().astype(np.int64)


def wilcoxon_p(x: F) -> float:
    """Two-sided Wilcoxon signed-rank p-value (normal approximation with tie and zero handling).

    Zeros are dropped (Wilcox's convention); NaN when fewer than 10 nonzero differences remain.
    """
    x = x[x != 0]
    n = len(x)
    if n < 10:
        return float("nan")
    ranks = stats.rankdata(np.abs(x))
    w_plus = float(np.sum(ranks[x > 0]))
    mean = n * (n + 1) / 4.0
    _, counts = np.unique(np.abs(x), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(counts**3 - counts)) / 48.0
    if var <= 0:
        return float("nan")
    z = (abs(w_plus - mean) - 0.5) / np.sqrt(var)
    return float(2.0 * stats.norm.sf(max(z, 0.0)))


def _walsh_quantile(xs: F, k: float) -> float:
    """The k-th smallest (1-based, fractional k interpolates) of the n(n+1)/2 Walsh averages."""
    target = int(np.clip(np.ceil(k), 1, len(xs) * (len(xs) + 1) // 2))

    def count_le(theta: float) -> int:
        ordered = int(np.sum(np.searchsorted(xs, 2.0 * theta - xs, side="right")))
        diagonal = int(np.searchsorted(xs, theta, side="right"))
        return (ordered + diagonal) // 2

    lo, hi = float(xs[0]), float(xs[-1])
    # ~16 bisections: 2e-5 of the data's range is below any reported digit.
    tol = 2e-5 * (hi - lo) + 1e-12
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if count_le(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def hodges_lehmann(x: F, alpha: float = 0.05, cap: int = 10_000) -> HL:
    """HL location of x (median of Walsh averages) with its 1-2α Wilcoxon interval."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return HL(float("nan"), float("nan"), float("nan"), float("nan"), 0)
    x = x[subsample(len(x), cap)]
    n = len(x)
    xs = np.sort(x)
    m = n * (n + 1) / 2.0
    est = _walsh_quantile(xs, (m + 1) / 2.0)
    if m % 2 == 0:  # even count: the median is the mean of the two middle averages
        est = 0.5 * (_walsh_quantile(xs, m / 2.0) + est)
    if n < 10:
        return HL(est, float("nan"), float("nan"), float("nan"), n)
    z = stats.norm.isf(alpha / 2.0)
    # k-th smallest and k-th largest Walsh averages; rounding k down keeps coverage >= 1-α.
    k = max(1, int(np.floor(m / 2.0 - z * np.sqrt(n * (n + 1) * (2 * n + 1) / 24.0))))
    low = _walsh_quantile(xs, k)
    high = _walsh_quantile(xs, m - k + 1.0)
    return HL(est, low, high, wilcoxon_p(x), n)


class McNemar(NamedTuple):
    worse: int  # candidate failed / disagreed where the reference did not
    better: int  # the reverse
    n: int
    p: float  # exact two-sided; NaN below the discordance minimum


def mcnemar(cand_bad: NDArray[np.bool_], ref_bad: NDArray[np.bool_], min_disc: int) -> McNemar:
    """McNemar's exact test (binomial on the discordant pairs)."""
    worse = int(np.count_nonzero(cand_bad & ~ref_bad))
    better = int(np.count_nonzero(~cand_bad & ref_bad))
    disc = worse + better
    p = float("nan")
    if disc >= max(min_disc, 1):
        p = float(stats.binomtest(worse, disc, 0.5).pvalue)
    return McNemar(worse, better, len(cand_bad), p)


def _weighted_quantile(sorted_x: F, sorted_w: F, q: float) -> float:
    cw = np.cumsum(sorted_w)
    if cw[-1] <= 0:
        return float("nan")
    return float(sorted_x[min(int(np.searchsorted(cw, q * cw[-1])), len(sorted_x) - 1)])


def bootstrap_quantile_ratio(
    cand: F,
    ref: F,
    q: float,
    *,
    groups: NDArray[np.int64] | None,
    draws: int,
    alpha: float,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio of the q-quantiles cand/ref with a percentile interval at 1-2α.

    Pairs are resampled jointly (the pairing is kept); with `groups` (sessions), whole groups
    are resampled, as a session's turns are correlated.
    """
    est = float(np.quantile(cand, q) / np.quantile(ref, q))
    rng = np.random.default_rng(seed)
    if groups is None:
        groups = np.arange(len(cand), dtype=np.int64)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    oc, orr = np.argsort(cand), np.argsort(ref)
    xc, xr = cand[oc], ref[orr]
    gc, gr = groups[oc], groups[orr]
    ratios = np.empty(draws)
    for b in range(draws):
        w = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups)).astype(np.float64)
        ratios[b] = _weighted_quantile(xc, w[gc], q) / _weighted_quantile(xr, w[gr], q)
    low, high = np.nanquantile(ratios, [alpha, 1.0 - alpha])
    return est, float(low), float(high)
