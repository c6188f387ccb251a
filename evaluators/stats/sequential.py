"""Always-valid confidence sequences and p-values: safe to look at after every pair.

Two families, both vectorized over leading axes (simulation runs) and evaluated at chosen
"looks" (sample sizes), so the same code serves one report and 200 simulated runs:

* `MeanStat` — the mean of an unbounded paired statistic (latency log-ratios). A normal
  mixture (Howard et al. 2021) over the standardized sum, in units of the running variance σ̂²
  (Waudby-Smith et al. 2021, asymptotic CS), tuned to the horizon N the experiment is planned
  to reach (ρ ∝ N σ̂², the `N_tune` of Eppo, GrowthBook's estimated sample size): about 1.56x
  the fixed-sample width at N, whatever the noise. Optionally σ̂² is cluster-robust.
  With `planned` > 0 that share of α goes to a boundary planned to the horizon instead: a
  constant boundary on the standardized sum, S_t ≥ z(planned·α/2) √N for t ≤ N — the
  continuous-look limit of O'Brien–Fleming alpha spending (Lan & DeMets 1983: α(t) =
  2 - 2Φ(z(α/2)/√t) is exactly its crossing probability by t, by the reflection principle), so
  it holds at any looks, however many, up to N. The mixture keeps the rest of α and alone
  holds past N. At planned = 0.9: 1.22x the fixed-sample width at N, 1.72x at N/2, 2.1x at 2N.
* `BoundedStat` — the mean of a statistic in [-1, 1] (paired rate differences, similarity
  differences). Predictable-plug-in betting martingales (Waudby-Smith & Ramdas 2023, aGRAPA
  bets): exact at every sample size, no variance assumption, and as tight as ~3/n when the two
  arms never disagree (rule of three), which is what a 0.1 pp error margin needs.

Every p-value is "always valid": P(p_t <= a for some t) <= a under its null. Sides: "below"
is evidence that the mean is < m, "above" that it is > m.
"""

from __future__ import annotations

import copy
import math
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, special

F = NDArray[np.float64]
Side = Literal["below", "above"]

# Cap on a bet as a fraction of the largest safe bet: keeps one adverse pair from costing more
# than log(1/(1 - 0.8)) ≈ 1.6 nats of evidence.
_BET_CAP = 0.8
# Prior variance pseudo-observation for the bet sizes (in [-1, 1] units): early bets stay small.
_PRIOR_VAR = 0.25
# Spread of the normal mixture over the bet, in units of the bet tuned to the horizon's scale
# 1/sqrt(N): 0.9 keeps the half-width within 1.6x the fixed-sample one from N/2 to 2N.
MIXTURE_SPREAD = 0.9
# Largest z at which the skewness correction of a bound is evaluated.
_SKEW_Z_CAP = 3.0


def _looks(n: int, looks: NDArray[np.int64] | None) -> NDArray[np.int64]:
    if looks is None:
        return np.array([n], dtype=np.int64)
    return np.asarray(looks, dtype=np.int64)


class MeanStat:
    """Normal-mixture confidence sequence for the mean of x (last axis = time), tuned to a horizon.

    The sum is measured in units of the plug-in standard deviation σ̂ (Waudby-Smith et al. 2021,
    asymptotic CS; optionally cluster-robust): S = Σ (x_i - m) / σ̂, one unit of "time" per
    observation. The mixture over the bet λ is N(μ, s²) with μ = sqrt(2 log(1/α) / N) — the bet
    whose linear boundary is tightest at the horizon N — and s = 0.9 / sqrt(N), so
    ``M_t = (1 + t s²)^(-1/2) exp((s² S² + 2 μ S - μ² t) / (2 (1 + t s²)))`` (closed form), a
    nonnegative supermartingale under the null for any N fixed before the data: the p-values
    1/M_t and the bounds hold at every look, for every horizon. Tuning only moves where the
    sequence is narrowest: at t = N its half-width is 1.56x the fixed-sample z-interval's at
    α = 0.05 (1.60x at N/2, 1.63x at 2N, 1.78x at N/4 and 4N); a mixture with its scale fixed
    in absolute units (the old τ = 0.03 in log units) is 3.4x as wide at σ = 1.1 and N = 200.
    """

    __slots__ = ("_mu", "_s2", "_skew", "alpha", "horizon", "mean", "planned", "t", "var")

    def __init__(
        self,
        x: F,
        looks: NDArray[np.int64] | None = None,
        *,
        horizon: float,
        sigma_floor: float,
        alpha: float = 0.05,
        groups: NDArray[np.int64] | None = None,
        planned: float = 0.0,
    ) -> None:
        x = np.asarray(x, dtype=np.float64)
        n = x.shape[-1]
        lk = _looks(n, looks)
        self.t = lk.astype(np.float64)
        if n == 0:
            shape = (*x.shape[:-1], len(lk))
            self.mean = np.full(shape, np.nan)
            self.var = np.full(shape, np.nan)
            self._skew = np.zeros(shape)
        else:
            idx = lk - 1
            s1 = np.cumsum(x, axis=-1)[..., idx]
            s2 = np.cumsum(x * x, axis=-1)[..., idx]
            s3 = np.cumsum(x * x * x, axis=-1)[..., idx]
            self.mean = s1 / self.t
            m2 = np.maximum(s2 / self.t - self.mean**2, 0.0)
            m3 = s3 / self.t - 3.0 * self.mean * s2 / self.t + 2.0 * self.mean**3
            # Sample skewness, on the floored variance (no 0/0 when the values are all equal).
            self._skew = m3 / np.sqrt(np.maximum(m2, sigma_floor**2)) ** 3
            var = (s2 - self.t * self.mean**2) / np.maximum(self.t - 1.0, 1.0)
            if groups is not None:
                var = np.maximum(var, _cluster_var(x, groups, lk, self.mean))
            self.var = np.maximum(var, sigma_floor**2)
            self.mean = np.where(self.t >= 2, self.mean, np.nan)
        self._tune(horizon, alpha, planned)

    def _tune(self, horizon: float, alpha: float, planned: float) -> None:
        if not 0.0 <= planned < 1.0:
            raise ValueError("planned (the share of alpha on the planned boundary) is in [0, 1)")
        self.alpha = alpha
        self.planned = planned
        self.horizon = float(max(horizon, 1.0))
        # The mixture is tuned to the level it is run at: all of alpha, or what the planned
        # boundary leaves.
        self._mu = math.sqrt(2.0 * math.log(1.0 / ((1.0 - planned) * alpha)) / self.horizon)
        self._s2 = MIXTURE_SPREAD**2 / self.horizon

    def tuned(self, horizon: float, *, alpha: float, planned: float = 0.0) -> MeanStat:
        """The same data's sequence tuned to another horizon, level and planned share: the
        running moments are shared (not copied), only the boundaries change."""
        out = copy.copy(self)
        out._tune(horizon, alpha, planned)
        return out

    def _shift(self, side: Side, alpha: float) -> F:
        """The skewness correction of one bound: the upper one (side below) for right skew.

        A plug-in σ̂ under-covers on the side of a long tail while the tail is unseen (the
        mean and σ̂ are both low then). Hall's Edgeworth term γ (2 z² + 1) σ / (6 t), taken
        twice because γ̂ itself is low early, moves that bound out; it vanishes as 1/t and is
        ~0 for symmetric noise (measured in tests/evaluators/test_eval_sequential.py).
        """
        g = np.maximum(self._skew if side == "below" else -self._skew, 0.0)
        sd = np.sqrt(self.var)
        h = self._halfwidth(alpha)
        # Past z = 3 (a sequence tuned far beyond t) the expansion means nothing: cap it, and
        # never move a bound by more than its own half-width.
        z = np.minimum(h * np.sqrt(self.t) / sd, _SKEW_Z_CAP)
        return np.minimum(g * (2.0 * z * z + 1.0) * sd / (3.0 * self.t), h)

    def _log_m(self, s: F) -> F:
        """log M_t at the standardized sum s (one look per element)."""
        a = 1.0 + self.t * self._s2
        return -0.5 * np.log(a) + (self._s2 * s * s + 2.0 * self._mu * s - self._mu**2 * self.t) / (
            2.0 * a
        )

    def p(self, m: float, side: Side) -> F:
        """Always-valid p-value for the null "mean >= m" (side below) or "mean <= m" (above)."""
        shift = self._shift(side, self.alpha)
        d = (m - self.mean - shift) if side == "below" else (self.mean - shift - m)
        s = self.t * d / np.sqrt(self.var)
        pos = np.where(s > 0, s, 0.0)
        with np.errstate(invalid="ignore"):
            out = np.exp(-np.maximum(self._log_m(pos), 0.0))
        if self.planned > 0:
            # Weighted Bonferroni over the two boundaries: p ≤ a iff the planned one crossed at
            # level planned·a or the mixture at (1 - planned)·a.
            within = self.t <= self.horizon
            p_planned = np.where(within, 2.0 * special.ndtr(-pos / math.sqrt(self.horizon)), 1.0)
            out = np.minimum(np.minimum(p_planned / self.planned, out / (1.0 - self.planned)), 1.0)
        return np.where((s > 0) & np.isfinite(self.mean), out, 1.0)

    def halfwidth(self, alpha: float) -> F:
        """Distance from the mean to a one-sided bound at level alpha, before skewness."""
        return self._halfwidth(alpha)

    def _halfwidth(self, alpha: float) -> F:
        a = 1.0 + self.t * self._s2
        level = (1.0 - self.planned) * alpha
        c = self._mu**2 * self.t + 2.0 * a * (math.log(1.0 / level) + 0.5 * np.log(a))
        s = c / (self._mu + np.sqrt(self._mu**2 + self._s2 * c))
        if self.planned > 0:
            # The planned boundary: S_t ≥ z(planned·α/2) √N, for t ≤ N only.
            b = float(special.ndtri(1.0 - self.planned * alpha / 2.0)) * math.sqrt(self.horizon)
            s = np.where(self.t <= self.horizon, np.minimum(s, b), s)
        return s * np.sqrt(self.var) / self.t

    def bounds(self, alpha: float, xtol: float = 0.0) -> tuple[F, F]:
        """(lower, upper): each a one-sided always-valid bound at level alpha (closed form:
        `xtol` is for the interface shared with BoundedStat)."""
        h = self._halfwidth(alpha)
        return self.mean - h - self._shift("above", alpha), self.mean + h + self._shift(
            "below", alpha
        )


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


# Root-finding tolerance of the bounds that gate (on the [-1, 1] scale of a bounded statistic).
ROOT_XTOL = 1e-7
# ... and of the plotted interval-against-pairs trajectory: a hundredth of a percentage point,
# far below a pixel, at about half the evaluations of the wealth.
PLOT_XTOL = 1e-4


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

    def p_latched(self, m: float, side: Side) -> F:
        """1 / the highest wealth reached by each look, capped at 1: as valid as `p` (Ville's
        inequality bounds the supremum), and never rising as units arrive, so evidence once
        shown stays shown (a reject does not flip back to hold at a later look)."""
        if self._d.shape[-1] == 0:
            return np.ones((*self._d.shape[:-1], len(self._looks)))
        peak = np.maximum.accumulate(np.cumsum(self._log_factors(m, side), axis=-1), axis=-1)
        return np.exp(-np.maximum(peak[..., self._looks - 1], 0.0))

    def bounds(self, alpha: float, xtol: float = ROOT_XTOL) -> tuple[F, F]:
        """(lower, upper) at each look for a 1-D statistic: the CS inverted by root finding
        to within `xtol` (on the statistic's [-1, 1] scale)."""
        if self._d.ndim != 1:
            raise ValueError("bounds() is for one run; use p() for many")
        target = np.log(1.0 / alpha)
        lows, highs = [], []
        for j in range(len(self._looks)):
            mean = float(self.mean[j])
            lows.append(_root(self, j, mean, -1.0, "above", target, xtol))
            highs.append(_root(self, j, mean, 1.0, "below", target, xtol))
        return np.array(lows), np.array(highs)


def _root(
    stat: BoundedStat, look: int, start: float, end: float, side: Side, target: float, xtol: float
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
    return float(optimize.brentq(f, start, edge, xtol=xtol))


def holm(p: F, alpha: float, weights: F | None = None) -> NDArray[np.bool_]:
    """Holm's step-down rejections; hypotheses on axis 0 (other axes are runs or looks).

    `weights` (one per hypothesis, >= 0; None: all 1) make it Holm's weighted step-down: in
    the order of p / w, each is rejected while p <= α w / (the weights not yet rejected), so a
    hypothesis of weight w is first tested at α w / Σw; one of weight 0 is never rejected. The
    family-wise error stays <= α for any fixed weights (Holm 1979)."""
    k = p.shape[0]
    w = np.ones(k) if weights is None else np.asarray(weights, dtype=np.float64)
    wb = np.broadcast_to(w.reshape((k,) + (1,) * (p.ndim - 1)), p.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        key = np.where(wb > 0, p / np.where(wb > 0, wb, 1.0), np.inf)
    order = np.argsort(key, axis=0, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=0)
    sorted_w = np.take_along_axis(wb, order, axis=0)
    remaining = np.flip(np.cumsum(np.flip(sorted_w, axis=0), axis=0), axis=0)
    thresholds = alpha * sorted_w / np.maximum(remaining, 1e-300)
    passed = np.cumprod((sorted_p <= thresholds) & (sorted_w > 0), axis=0).astype(bool)
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
