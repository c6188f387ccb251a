"""Always-valid confidence sequences and p-values: safe to look at after every pair.

Two families, both vectorized over leading axes (simulation runs) and evaluated at chosen
"looks" (sample sizes), so the same code serves one report and 200 simulated runs:

* `MeanStat` — the mean of an unbounded paired statistic (latency log-ratios). One-sided
  normal-mixture boundary of Howard et al. (2021), closed form
  ``|S_t| <= sqrt(2 (V_t + ρ) log(1 + sqrt((V_t + ρ)/ρ) / (2α)))`` with V_t = σ̂² t and
  ρ = σ̂⁴/τ² (the mSPRT with a N(0, τ²) prior on the mean), using the running variance σ̂²
  (Waudby-Smith et al. 2021, asymptotic CS). Optionally σ̂² is cluster-robust (whole sessions).
* `BoundedStat` — the mean of a statistic in [-1, 1] (paired rate differences, similarity
  differences). Predictable-plug-in betting martingales (Waudby-Smith & Ramdas 2023, aGRAPA
  bets): exact at every sample size, no variance assumption, and as tight as ~3/n when the two
  arms never disagree (rule of three), which is what a 0.1 pp error margin needs.

Every p-value is "always valid": P(p_t <= a for some t) <= a under its null. Sides: "below"
is evidence that the mean is < m, "above" that it is > m.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

F = NDArray[np.float64]
Side = Literal["below", "above"]

# Cap on a bet as a fraction of the largest safe bet: keeps one adverse pair from costing more
# than log(1/(1 - 0.8)) ≈ 1.6 nats of evidence.
_BET_CAP = 0.8
# Prior variance pseudo-observation for the bet sizes (in [-1, 1] units): early bets stay small.
_PRIOR_VAR = 0.25


def _looks(n: int, looks: NDArray[np.int64] | None) -> NDArray[np.int64]:
    if looks is None:
        return np.array([n], dtype=np.int64)
    return np.asarray(looks, dtype=np.int64)


class MeanStat:
    """Normal-mixture confidence sequence for the mean of x (last axis = time)."""

    __slots__ = ("mean", "ratio", "t", "var")

    def __init__(
        self,
        x: F,
        looks: NDArray[np.int64] | None = None,
        *,
        tau: float,
        sigma_floor: float,
        groups: NDArray[np.int64] | None = None,
    ) -> None:
        x = np.asarray(x, dtype=np.float64)
        n = x.shape[-1]
        lk = _looks(n, looks)
        self.t = lk.astype(np.float64)
        if n == 0:
            shape = (*x.shape[:-1], len(lk))
            self.mean = np.full(shape, np.nan)
            self.var = np.full(shape, np.nan)
        else:
            idx = lk - 1
            s1 = np.cumsum(x, axis=-1)[..., idx]
            s2 = np.cumsum(x * x, axis=-1)[..., idx]
            self.mean = s1 / self.t
            var = (s2 - self.t * self.mean**2) / np.maximum(self.t - 1.0, 1.0)
            if groups is not None:
                var = np.maximum(var, _cluster_var(x, groups, lk, self.mean))
            self.var = np.maximum(var, sigma_floor**2)
            self.mean = np.where(self.t >= 2, self.mean, np.nan)
        self.ratio = self.var / tau**2  # ρ / V per pair: σ̂²/τ²

    def _spread(self) -> tuple[F, F]:
        # (V + ρ) and r = sqrt(ρ / (V + ρ)) for the mixture; see the module docstring.
        vr = self.var * (self.t + self.ratio)
        r = np.sqrt(self.ratio / (self.t + self.ratio))
        return vr, r

    def p(self, m: float, side: Side) -> F:
        """Always-valid p-value for the null "mean >= m" (side below) or "mean <= m" (above)."""
        vr, r = self._spread()
        s = self.t * ((m - self.mean) if side == "below" else (self.mean - m))
        half_z2 = np.where(s > 0, s * s / (2.0 * vr), 0.0)
        with np.errstate(divide="ignore"):
            small = np.log(np.expm1(np.minimum(half_z2, 30.0)))
        log_em1 = np.where(half_z2 > 30.0, half_z2, small)
        logp = -np.log(2.0) - np.log(r) - log_em1
        out = np.exp(np.minimum(logp, 0.0))
        return np.where((s > 0) & np.isfinite(self.mean), out, 1.0)

    def halfwidth(self, alpha: float) -> F:
        vr, r = self._spread()
        return np.sqrt(2.0 * vr * np.log1p(1.0 / (2.0 * alpha * r))) / self.t

    def bounds(self, alpha: float) -> tuple[F, F]:
        """(lower, upper): each a one-sided always-valid bound at level alpha."""
        h = self.halfwidth(alpha)
        return self.mean - h, self.mean + h


def _cluster_var(x: F, groups: NDArray[np.int64], looks: NDArray[np.int64], mean: F) -> F:
    """Per-pair variance implied by the cluster-robust variance of the mean, at each look.

    Pairs of one session are correlated; Σ_g (Σ_{i∈g} (x_i - x̄))² / t is the sandwich
    estimate of t·Var(x̄), i.e. the variance an independent pair would need to explain it.
    """
    out = np.empty(len(looks))
    for j, t in enumerate(looks):
        t = int(t)
        dev = x[:t] - mean[j]
        sums = np.bincount(groups[:t], weights=dev)
        out[j] = float(np.sum(sums * sums)) / max(t - 1, 1)
    return out


class BoundedStat:
    """Betting confidence sequence for the mean of d in [-1, 1] (last axis = time)."""

    __slots__ = ("_d", "_looks", "_mu_prev", "_var_prev", "mean", "t")

    def __init__(self, d: F, looks: NDArray[np.int64] | None = None) -> None:
        d = np.clip(np.asarray(d, dtype=np.float64), -1.0, 1.0)
        n = d.shape[-1]
        self._d = d
        self._looks = _looks(n, looks)
        self.t = self._looks.astype(np.float64)
        i = np.arange(1, n + 1, dtype=np.float64)
        csum = np.cumsum(d, axis=-1)
        prev = np.zeros_like(d)
        prev[..., 1:] = csum[..., :-1]
        self._mu_prev = prev / i  # mean of the pairs before this one (prior mean 0)
        sq = (d - self._mu_prev) ** 2
        sq_prev = np.zeros_like(d)
        sq_prev[..., 1:] = np.cumsum(sq, axis=-1)[..., :-1]
        self._var_prev = (_PRIOR_VAR + sq_prev) / i
        if n == 0:
            self.mean = np.full((*d.shape[:-1], len(self._looks)), np.nan)
        else:
            self.mean = csum[..., self._looks - 1] / self.t

    def _log_factors(self, m: float, side: Side, t: int | None = None) -> F:
        """log(1 + λ_i (m - d_i)) (side below) or log(1 + λ_i (d_i - m)) for the first t pairs."""
        sl = slice(None, t)
        mu, var, d = self._mu_prev[..., sl], self._var_prev[..., sl], self._d[..., sl]
        if side == "below":
            gap, z = m - mu, m - d
            cap = _BET_CAP / (1.0 - m) if m < 1.0 else np.inf
        else:
            gap, z = mu - m, d - m
            cap = _BET_CAP / (1.0 + m) if m > -1.0 else np.inf
        lam = np.clip(gap / (var + gap * gap), 0.0, cap)
        return np.log1p(lam * z)

    def log_wealth(self, m: float, side: Side) -> F:
        """log of the betting wealth against the null "mean >= m" (below) / "<= m" (above)."""
        if self._d.shape[-1] == 0:
            return np.zeros((*self._d.shape[:-1], len(self._looks)))
        return np.cumsum(self._log_factors(m, side), axis=-1)[..., self._looks - 1]

    def p(self, m: float, side: Side) -> F:
        """Always-valid p-value: 1 / wealth (Ville's inequality), capped at 1."""
        return np.exp(-np.maximum(self.log_wealth(m, side), 0.0))

    def bounds(self, alpha: float) -> tuple[F, F]:
        """(lower, upper) at each look for a 1-D statistic: the CS inverted by root finding."""
        if self._d.ndim != 1:
            raise ValueError("bounds() is for one run; use p() for many")
        target = np.log(1.0 / alpha)
        lows, highs = [], []
        for j in range(len(self._looks)):
            mean = float(self.mean[j])
            lows.append(_root(self, j, mean, -1.0, "above", target))
            highs.append(_root(self, j, mean, 1.0, "below", target))
        return np.array(lows), np.array(highs)


def _root(
    stat: BoundedStat, look: int, start: float, end: float, side: Side, target: float
) -> float:
    """The m between start and end where the wealth against m reaches exp(target)."""
    if not np.isfinite(start):
        return end

    t = int(stat.t[look])

    def f(m: float) -> float:
        return float(np.sum(stat._log_factors(m, side, t))) - target

    edge = end - 1e-9 if end > start else end + 1e-9
    if f(edge) < 0:
        return end
    if f(start) >= 0:
        return start
    return float(optimize.brentq(f, start, edge, xtol=1e-7))


def holm(p: F, alpha: float) -> NDArray[np.bool_]:
    """Holm's step-down rejections; hypotheses on axis 0 (other axes are runs or looks)."""
    k = p.shape[0]
    order = np.argsort(p, axis=0)
    sorted_p = np.take_along_axis(p, order, axis=0)
    thresholds = (alpha / (k - np.arange(k))).reshape((k,) + (1,) * (p.ndim - 1))
    passed = np.cumprod(sorted_p <= thresholds, axis=0).astype(bool)
    out = np.zeros_like(passed)
    np.put_along_axis(out, order, passed, axis=0)
    return out


def benjamini_hochberg(p: F) -> F:
    """BH-adjusted q-values of a 1-D array of p-values (NaN stays NaN)."""
    q = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size == 0:
        return q
    pv = p[ok]
    order = np.argsort(pv)
    ranked = pv[order] * len(pv) / np.arange(1, len(pv) + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    q[ok[order]] = np.minimum(ranked, 1.0)
    return q


def pairs_needed(n: int, n_half: int, width: float, width_half: float, needed: float) -> int | None:
    """About how many more pairs until a bound's half-width shrinks to `needed`.

    The shrink rate is measured between the half-way look and now (w ∝ n^-β, β clamped to
    [0.25, 1]; 1/2 when it cannot be measured), then extrapolated. None when not reachable.
    """
    if not (needed > 0 and width > 0 and np.isfinite(width)):
        return None
    if width <= needed:
        return 0
    beta = 0.5
    if n_half >= 2 and n > n_half and np.isfinite(width_half) and width_half > width:
        beta = float(np.clip(np.log(width_half / width) / np.log(n / n_half), 0.25, 1.0))
    total = n * (width / needed) ** (1.0 / beta)
    return int(np.ceil(total - n)) if np.isfinite(total) and total < 1e12 else None
