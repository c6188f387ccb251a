"""Net preference on people's scale from the grader's verdicts and a random labelled subset:
prediction-powered inference (PPI++), anytime-valid, by units (docs/reports-and-statistics.md,
"People check the grader").

Every graded unit i (closing order, as the grader's preference orders them) carries the
grader's unit score f_i; a unit is *chosen* for people by hash (the grader's `label_rate` π,
fixed before anyone sees a verdict), and a chosen unit carries people's score y_i. Each unit
contributes one term

    z_i = c_y + λ_i (f_i - c_f) + (ξ_i / π) (y_i - c_y - λ_i (f_i - c_f)),

ξ_i = 1 when chosen, where c_f (the mean of f over the units before i), c_y (the mean of y over
the labelled units before i) and λ_i (PPI++'s power tuning, fitted on the labelled units
before i only) are predictable. Given the past, E[z_i] = E[y] = θ whatever the grader's bias:
the inverse-probability-weighted prediction-powered term of active inference (Zrnic & Candès
2024), bet on as prediction-powered e-values do (Csillag et al. 2025; Kilian, Cortinovis &
Caron 2025 build confidence sequences for PPI and PPI++ the same way). The terms lie within
±R, R = 3 + 4/π, so the product's bounded-mean betting sequence (`BoundedStat`) on z / R is
an anytime-valid confidence sequence for θ / R.

A chosen unit whose pairs a person skipped has no y: its skipped pairs count as -1 for the
lower bound and +1 for the upper one (worst case both ways), so skips can only widen the
interval. The fixed-n point estimate shown beside it is PPI++'s (Angelopoulos, Duchi & Zrnic
2023), the same number `ppi_py.ppi_mean_pointestimate` gives. Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import Evidence
from evaluators.stats.sequential import BoundedStat

__all__ = [
    "MIN_FIT",
    "PPIStat",
    "fixed_ppi",
    "label_looks",
    "ppi_terms",
    "term_range",
]

F = NDArray[np.float64]
B = NDArray[np.bool_]
# Labelled units before λ is fitted: until then λ = 0 (people's labels alone, IPW).
MIN_FIT = 10


def term_range(rate: float) -> float:
    """R: every term lies within ±R at labelling rate π = `rate`."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"label rate {rate} is not in (0, 1]")
    return 3.0 + 4.0 / rate


def _before(x: F) -> F:
    """Sum over the earlier units of each unit (last axis)."""
    out = np.zeros_like(x)
    out[..., 1:] = np.cumsum(x, axis=-1)[..., :-1]
    return out


def ppi_terms(f: F, chosen: B, y: F, fit: B, rate: float) -> tuple[F, F]:
    """(z / R per unit, λ per unit): `y` counts where `chosen` (any value elsewhere), `fit`
    marks the chosen units whose y λ and c_y may learn from (labelled, nothing skipped).
    Vectorized over leading axes (simulated runs)."""
    r = term_range(rate)
    f = np.asarray(f, dtype=np.float64)
    xi = np.asarray(chosen, dtype=bool)
    w = np.asarray(fit, dtype=bool) & xi
    yv = np.where(xi, np.nan_to_num(np.asarray(y, dtype=np.float64)), 0.0)
    i = np.arange(f.shape[-1], dtype=np.float64)
    sf, sff = _before(f), _before(f * f)
    wf = w.astype(np.float64)
    n, sy, sx, sxy = _before(wf), _before(wf * yv), _before(wf * f), _before(wf * f * yv)
    with np.errstate(invalid="ignore", divide="ignore"):
        c_f = np.where(i > 0, sf / np.maximum(i, 1.0), 0.0)
        var_f = np.where(i > 1, (sff - i * c_f * c_f) / np.maximum(i - 1.0, 1.0), 0.0)
        c_y = np.where(n > 0, sy / np.maximum(n, 1.0), 0.0)
        mx = sx / np.maximum(n, 1.0)
        cov = sxy / np.maximum(n, 1.0) - mx * c_y
        lam = cov / ((1.0 + n / np.maximum(i, 1.0)) * var_f)
    lam = np.where((n >= MIN_FIT) & (var_f > 0) & np.isfinite(lam), np.clip(lam, 0.0, 1.0), 0.0)
    pred = lam * (f - c_f)
    z = c_y + pred + xi * (yv - c_y - pred) / rate
    return z / r, lam


def label_looks(chosen: B, every: int) -> NDArray[np.int64]:
    """Units in each look of a 1-D run labelled in order, a look every `every` labels: all the
    units before the next chosen unit still waiting for its label (the labelled-through point)."""
    idx = np.flatnonzero(chosen)
    n = len(chosen)
    ends = [int(idx[k]) if k < len(idx) else n for k in range(every, len(idx) + every, every)]
    return np.unique(np.array([e for e in ends if e > 0], dtype=np.int64))


@dataclass(frozen=True, slots=True)
class _Pair:
    low: BoundedStat  # the sequence skips count -1 in: its lower bound holds
    high: BoundedStat  # ... +1 in: its upper bound holds
    scale: float  # the statistic's [-1, 1] is [-scale, scale] on the net preference scale

    def evidence(self, delta: float, critical: float) -> Evidence:
        """p-values of the preference test (harm lower) at margin -delta and -critical."""
        s = self.scale
        p_inside = self.low.p(-delta / s, "above")
        p_beyond = self.high.p_latched(-delta / s, "below")
        p_critical = self.high.p_latched(-critical / s, "below")
        n = self.low.t * np.ones(p_inside.shape)
        return Evidence(n, p_inside, p_beyond, p_critical, np.ones(p_inside.shape))

    def bounds(self, alpha: float) -> tuple[float, float]:
        """(lower, upper) at the last look of a single run, clipped to [-1, 1]."""
        lo, _ = self.low.bounds(alpha)
        _, hi = self.high.bounds(alpha)
        return max(-1.0, float(lo[-1]) * self.scale), min(1.0, float(hi[-1]) * self.scale)


class PPIStat(_Pair):
    """The prediction-powered sequence over graded units (looks: unit counts)."""

    @classmethod
    def of(
        cls,
        f: F,
        chosen: B,
        y_low: F,
        y_high: F,
        fit: B,
        rate: float,
        looks: NDArray[np.int64] | None = None,
    ) -> PPIStat:
        z_lo, _ = ppi_terms(f, chosen, y_low, fit, rate)
        z_hi, _ = ppi_terms(f, chosen, y_high, fit, rate)
        return cls(BoundedStat(z_lo, looks), BoundedStat(z_hi, looks), term_range(rate))


class HumanOnlyStat(_Pair):
    """People's labels alone: the betting sequence on the labelled units' y (looks: labels)."""

    @classmethod
    def of(cls, y_low: F, y_high: F, looks: NDArray[np.int64] | None = None) -> HumanOnlyStat:
        return cls(BoundedStat(y_low, looks), BoundedStat(y_high, looks), 1.0)


def fixed_ppi(y: F, f_labelled: F, f_all: F) -> tuple[float, float]:
    """(PPI++ point estimate, λ) at a fixed sample: λ = Cov(y, f) / ((1 + n/N) Var(f)),
    clipped to [0, 1] (f over the labelled and all graded units together, as `ppi_py` does),
    then mean(λ f_all) + mean(y - λ f_labelled)."""
    n, big_n = len(y), len(f_all)
    if n < 2 or big_n < 2:
        return (float(np.mean(y)) if n else math.nan), 0.0
    cov = float(np.mean((y - y.mean()) * (f_labelled - f_labelled.mean())))
    var = float(np.var(np.concatenate([f_labelled, f_all]), ddof=1))
    lam = float(np.clip(cov / ((1.0 + n / big_n) * var), 0.0, 1.0)) if var > 0 else 0.0
    return float(np.mean(lam * f_all) + np.mean(y - lam * f_labelled)), lam


def worth(y: F, f_labelled: F, f_all: F, lam: float) -> tuple[float, float] | None:
    """(variance of people's labels alone ÷ the PPI++ estimate's, in labels: the effective
    sample size, and the grader's worth in labels: that minus the labels), None when unknown.
    Var(PPI++) = Var(y - λ f) / n + λ² Var(f) / N."""
    n, big_n = len(y), len(f_all)
    if n < 2 or big_n < 2:
        return None
    var_h = float(np.var(y, ddof=1))
    var_p = (
        float(np.var(y - lam * f_labelled, ddof=1)) / n
        + lam * lam * float(np.var(f_all, ddof=1)) / big_n
    )
    if var_p <= 0 or var_h <= 0:
        return None
    ess = var_h / var_p
    return ess, ess - n
