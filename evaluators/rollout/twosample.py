"""Anytime-valid two-sample tests of the candidate's sessions against production's.

During a ramp the arms are randomized by session hash, so they compare unpaired, with sessions
as units (`arms.SessionUnits`). Harm is always "higher": a larger log latency, a larger
failure or SLO-exceedance share. Both families are vectorized over leading axes (simulated
runs) and read at "looks" (the first L sessions in closing order), so the same code serves a
live step and 200 simulated ones.

* `MeanDiff` — x̄_c − x̄_p for unbounded summaries (mean log TTFT: the log ratio of geometric
  means; mean log E2E). The normal mixture of `evaluators.stats.sequential.MeanStat` run in
  information time: with σ_d² = s_c² + s_p² (the variance of one candidate session minus one
  production session) and Var(x̄_c − x̄_p) = s_c²/n_c + s_p²/n_p, the difference behaves as
  the mean of n_eff = σ_d² / Var(x̄_c − x̄_p) independent differences of variance σ_d², and
  n_eff grows by predictable steps as sessions close (Johari et al. 2017, two-sample mSPRT;
  Howard et al. 2021). n_eff ≈ 2 n_c n_p / (n_c + n_p): at a 5 % weight it is set by the
  candidate's arm, about twice its sessions. Tuned to the step's horizon in those units.
* `ShareDiff` — the difference of two shares in [0, 1] (session failure and SLO shares). A
  betting confidence sequence (`BoundedStat`) on a pairing fixed by arm labels alone: each
  session of the smaller arm is paired with the next unused session of the larger arm that
  closes after it. Why not a mixture SPRT on proportions: a session's share is not one
  Bernoulli draw (clustered failures make it anything in [0, 1]), and the betting sequence is
  exact at every n for any bounded values, with no variance assumption (~log(1/α)/δ clean
  sessions show a margin δ: the floor of any valid method). The pairing looks only at the arm
  sequence, which the hash draws independently of outcomes, so each difference has mean
  p_c − p_p given the past: the wealth stays a martingale. Pairing next-in-time keeps pairs
  aligned when traffic drifts. It uses min(n_c, n_p) units: at 5 % the unused 18/19 of
  production would shrink the variance of the difference by at most half (width ~1.4x).

Every bound is one-sided: the lower at the harm level (rollback reads it), the upper at the pass
level (advance reads it). Below `min_units` sessions in either arm the decision is
"insufficient" and no number is given. Pure numpy/scipy; never does IO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from domain.errors import UsageError
from evaluators.stats.sequential import MIXTURE_SPREAD, BoundedStat

F = NDArray[np.float64]
I64 = NDArray[np.int64]
Codes = NDArray[np.int8]
Decision = Literal["insufficient", "undecided", "ok", "harm"]
# How a comparison's numbers read: a difference of mean logs (exp: the ratio candidate /
# production, shown as x0.95) or of shares (shown in percentage points).
Scale = Literal["log_ratio", "share"]

# Decision codes of the vectorized form, indexing DECISIONS.
INSUFFICIENT, UNDECIDED, OK, HARM = 0, 1, 2, 3
DECISIONS: tuple[Decision, ...] = ("insufficient", "undecided", "ok", "harm")


def mixture_boundary(t: F, horizon: float | F, alpha: float) -> F:
    """The normal mixture's one-sided boundary on the standardized sum at time t (units of
    variance), tuned to `horizon` (a number, or one per run): the closed form of `MeanStat`
    with planned = 0 (a ramp step has no planned end; the mixture alone holds at any n).
    Half-width = boundary · σ / t."""
    h = np.maximum(np.asarray(horizon, dtype=np.float64), 1.0)
    mu = np.sqrt(2.0 * math.log(1.0 / alpha) / h)
    s2 = MIXTURE_SPREAD**2 / h
    a = 1.0 + t * s2
    c = mu**2 * t + 2.0 * a * (math.log(1.0 / alpha) + 0.5 * np.log(a))
    out: F = c / (mu + np.sqrt(mu**2 + s2 * c))
    return out


def effective_units(sessions: float, weight: float, kind: Literal["mean", "share"]) -> float:
    """The information of `sessions` split at `weight` (equal noise per arm): n_eff for a
    `MeanDiff`, pairs for a `ShareDiff`."""
    if kind == "mean":
        return 2.0 * weight * (1.0 - weight) * sessions
    return min(weight, 1.0 - weight) * sessions


def _looks(n: int, looks: I64 | None) -> I64:
    return np.array([n], dtype=np.int64) if looks is None else np.asarray(looks, dtype=np.int64)


def _arm_counts(valid: NDArray[np.bool_], candidate: NDArray[np.bool_], lk: I64) -> tuple[I64, I64]:
    idx = lk - 1
    n_c = np.cumsum(valid & candidate, axis=-1)[..., idx]
    n_p = np.cumsum(valid & ~candidate, axis=-1)[..., idx]
    return n_c.astype(np.int64), n_p.astype(np.int64)


def diff_of_means(
    n_c: NDArray[np.integer] | F,
    s1_c: F,
    s2_c: F,
    n_p: NDArray[np.integer] | F,
    s1_p: F,
    s2_p: F,
    *,
    sigma_floor: float,
) -> tuple[F, F, F]:
    """(x̄_c − x̄_p, σ_d² = s_c² + s_p², information n_eff = σ_d² / Var(x̄_c − x̄_p)) from each
    arm's count, sum and sum of squares (any leading shape; NaN estimate below 2 in an arm).
    The variances are floored at `sigma_floor`²."""
    moments = []
    for n, s1, s2 in ((n_c, s1_c, s2_c), (n_p, s1_p, s2_p)):
        nf = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        mean = s1 / nf
        var = np.maximum((s2 - nf * mean**2) / np.maximum(nf - 1.0, 1.0), sigma_floor**2)
        moments.append((np.where(np.asarray(n) >= 2, mean, np.nan), var, nf))
    (m_c, v_c, nf_c), (m_p, v_p, nf_p) = moments
    var_unit: F = v_c + v_p
    t: F = var_unit / (v_c / nf_c + v_p / nf_p)
    estimate: F = m_c - m_p
    return estimate, var_unit, t


class MeanDiff:
    """Confidence sequence for mean(candidate) − mean(production) at each look."""

    __slots__ = ("estimate", "horizon", "n_c", "n_p", "t", "var_unit")

    def __init__(
        self,
        x: F,
        candidate: NDArray[np.bool_],
        looks: I64 | None = None,
        *,
        horizon: float,
        sigma_floor: float,
    ) -> None:
        x = np.asarray(x, dtype=np.float64)
        candidate = np.asarray(candidate, dtype=bool)
        lk = _looks(x.shape[-1], looks)
        valid = np.isfinite(x)
        self.n_c, self.n_p = _arm_counts(valid, candidate, lk)
        self.horizon = float(horizon)
        z = np.where(valid, x, 0.0)
        sums = []
        for arm in (candidate, ~candidate):
            use = valid & arm
            s1 = np.cumsum(np.where(use, z, 0.0), axis=-1)[..., lk - 1]
            s2 = np.cumsum(np.where(use, z * z, 0.0), axis=-1)[..., lk - 1]
            sums.append((s1, s2))
        (s1_c, s2_c), (s1_p, s2_p) = sums
        self.estimate, self.var_unit, self.t = diff_of_means(
            self.n_c, s1_c, s2_c, self.n_p, s1_p, s2_p, sigma_floor=sigma_floor
        )

    def bounds(self, alpha_lower: float, alpha_upper: float) -> tuple[F, F]:
        """(lower, upper): one-sided always-valid bounds at their own levels (NaN below 2
        sessions in an arm)."""
        sd = np.sqrt(self.var_unit)
        lo = self.estimate - mixture_boundary(self.t, self.horizon, alpha_lower) * sd / self.t
        hi = self.estimate + mixture_boundary(self.t, self.horizon, alpha_upper) * sd / self.t
        return lo, hi

    def decide(self, margin: float, alpha_harm: float, alpha_ok: float, min_units: int) -> Codes:
        """Decision code per look: harm (lower bound past the margin), ok (upper bound inside
        it), undecided, or insufficient (an arm below `min_units` sessions)."""
        lo, hi = self.bounds(alpha_harm, alpha_ok)
        return _codes(lo > margin, hi < margin, self.n_c, self.n_p, min_units)


class ShareDiff:
    """Betting confidence sequence for share(candidate) − share(production) at each look."""

    __slots__ = ("_count", "_d", "n_c", "n_p")

    def __init__(
        self,
        x: F,
        candidate: NDArray[np.bool_],
        looks: I64 | None = None,
        *,
        candidate_smaller: bool,
    ) -> None:
        x = np.asarray(x, dtype=np.float64)
        candidate = np.asarray(candidate, dtype=bool)
        lk = _looks(x.shape[-1], looks)
        valid = np.isfinite(x)
        self.n_c, self.n_p = _arm_counts(valid, candidate, lk)
        rows_x = x.reshape(-1, x.shape[-1])
        rows_c = candidate.reshape(-1, x.shape[-1])
        rows_v = valid.reshape(-1, x.shape[-1])
        diffs, counts = [], []
        for xr, cr, vr in zip(rows_x, rows_c, rows_v, strict=True):
            d, close = _pair(xr, cr, vr, candidate_smaller)
            diffs.append(d)
            counts.append(np.searchsorted(close, lk - 1, side="right"))
        width = max((len(d) for d in diffs), default=0)
        self._d = np.zeros((len(diffs), width))
        for i, d in enumerate(diffs):
            self._d[i, : len(d)] = d
        self._count = np.array(counts, dtype=np.int64).reshape((*x.shape[:-1], len(lk)))

    @property
    def pairs(self) -> I64:
        """Pairs complete at each look."""
        return self._count

    def _p(self, m: float, side: Literal["below", "above"]) -> F:
        """Always-valid p-value per look (1 where a look has no pair yet)."""
        flat = self._count.reshape(self._d.shape[0], -1)
        if self._d.shape[1] == 0:
            return np.ones(self._count.shape)
        stat = BoundedStat(self._d, np.arange(1, self._d.shape[1] + 1, dtype=np.int64))
        p = stat.p(m, side)
        got = np.take_along_axis(p, np.maximum(flat - 1, 0), axis=1)
        return np.where(flat > 0, got, 1.0).reshape(self._count.shape)

    def decide(self, margin: float, alpha_harm: float, alpha_ok: float, min_units: int) -> Codes:
        """Decision code per look, as `MeanDiff.decide` (harm: evidence the difference is
        above the margin; ok: evidence it is below)."""
        harm = self._p(margin, "above") <= alpha_harm
        ok = self._p(margin, "below") <= alpha_ok
        return _codes(harm, ok, self.n_c, self.n_p, min_units)

    def covers(self, truth: float, alpha_lower: float, alpha_upper: float) -> NDArray[np.bool_]:
        """Whether each look's interval holds `truth` (vectorized, through the p-values)."""
        return (self._p(truth, "above") > alpha_lower) & (self._p(truth, "below") > alpha_upper)

    def bounds(self, alpha_lower: float, alpha_upper: float) -> tuple[F, F, F]:
        """(estimate, lower, upper) at each look of one run: the pairs' mean and its
        one-sided always-valid bounds (root finding; NaN before the first pair)."""
        if self._d.shape[0] != 1 or self._count.ndim != 1:
            raise UsageError("ShareDiff.bounds is for one run; use decide() or covers() for many")
        est, lo, hi = (np.full(self._count.shape, np.nan) for _ in range(3))
        has = np.flatnonzero(self._count > 0)
        if len(has):
            stat = BoundedStat(self._d[0], self._count[has])
            est[has] = stat.mean
            lo[has] = stat.bounds(alpha_lower)[0]
            hi[has] = stat.bounds(alpha_upper)[1]
        return est, lo, hi


def _pair(
    x: F, candidate: NDArray[np.bool_], valid: NDArray[np.bool_], candidate_smaller: bool
) -> tuple[F, I64]:
    """(candidate − production per pair, closing position of each pair) for one run.

    The k-th unit of the smaller arm takes the first unit of the larger arm after it that no
    earlier pair took: j_k = max(a_k, j_{k-1} + 1) = k + max_{i<=k} (a_i - i)."""
    small = np.flatnonzero(valid & (candidate == candidate_smaller))
    large = np.flatnonzero(valid & (candidate != candidate_smaller))
    k = np.arange(len(small))
    j = k + np.maximum.accumulate(np.searchsorted(large, small) - k) if len(small) else k
    keep = j < len(large)  # j increases, so this is a prefix
    small, j = small[keep], j[keep]
    partner = large[j]
    d = x[small] - x[partner] if candidate_smaller else x[partner] - x[small]
    return d, np.maximum(small, partner).astype(np.int64)


def _codes(
    harm: NDArray[np.bool_],
    ok: NDArray[np.bool_],
    n_c: I64,
    n_p: I64,
    min_units: int,
) -> Codes:
    out = np.full(harm.shape, UNDECIDED, dtype=np.int8)
    out[ok] = OK
    out[harm] = HARM
    out[(n_c < min_units) | (n_p < min_units)] = INSUFFICIENT
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """One gating test at one look, as the step and `canary ramp` show it. Latency is on the
    log-ratio scale (exp gives the ratio of geometric means); shares are differences; `scale`
    says which, for whoever shows it (the live page: x0.95, +0.4 pp). estimate/lower/upper are
    None when the decision is "insufficient"."""

    name: str
    decision: Decision
    margin: float
    n_candidate: int
    n_production: int
    estimate: float | None
    lower: float | None  # at the harm level
    upper: float | None  # at the pass level
    scale: Scale = "log_ratio"


def comparison(
    name: str,
    stat: MeanDiff | ShareDiff,
    *,
    margin: float,
    alpha_harm: float,
    alpha_ok: float,
    min_units: int,
) -> Comparison:
    """The last look of a one-run statistic as a Comparison."""
    code = int(stat.decide(margin, alpha_harm, alpha_ok, min_units).reshape(-1)[-1])
    n_c, n_p = int(stat.n_c.reshape(-1)[-1]), int(stat.n_p.reshape(-1)[-1])
    scale: Scale = "log_ratio" if isinstance(stat, MeanDiff) else "share"
    if code == INSUFFICIENT:
        return Comparison(name, "insufficient", margin, n_c, n_p, None, None, None, scale)
    if isinstance(stat, MeanDiff):
        est = stat.estimate
        lo, hi = stat.bounds(alpha_harm, alpha_ok)
    else:
        est, lo, hi = stat.bounds(alpha_harm, alpha_ok)
    return Comparison(
        name,
        DECISIONS[code],
        margin,
        n_c,
        n_p,
        float(est.reshape(-1)[-1]),
        float(lo.reshape(-1)[-1]),
        float(hi.reshape(-1)[-1]),
        scale,
    )
