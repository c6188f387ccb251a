"""Sizing a model upgrade judged by an LLM grader (`evaluators.metrics.preference`): the graded
sessions by which 95 % of runs decide at a margin, the grader calls and what they cost.

The runs are the verdict's own betting sequence on unit values with exactly the sd given and
the net preference the user expects (`effect`): a session's mean score is drawn from {-1, 0, 1}
with those two moments (no clipping, which would plan for a smaller sd than the one stated).
A run decides at its first look where the net preference is shown above -margin (promote) or
below it (reject, latched, at α as the verdict's Holm tests it alone) or below the critical
margin (α). Never imports the CLI; pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.plan import _first, quantile_units
from evaluators.stats.sequential import BoundedStat

F = NDArray[np.float64]

# sd of one graded session's mean pair score when the grader is decisive most of the time:
# scores are ±1 per verdict, so near 0.9 at 80 % decisive (STATISTICS.md: σ² ≈ decisive share).
PREFERENCE_SD = 0.9
# What a grading costs when nothing is measured yet: a short conversation, two answers and the
# rubric in, a JSON object out.
TOKENS_PER_GRADING = 1_500


@dataclass(frozen=True, slots=True)
class PreferencePlan:
    """Graded sessions a preference decision needs at a margin, and what they cost."""

    margin: float  # the net preference the candidate may lose at most
    sessions: int | None  # graded sessions by which QUANTILE of runs decide (None: > MAX)
    gradings: int | None  # grader calls: sessions × pairs each × (1 + swap_rate)
    tokens: int | None
    cost_usd: float | None


def max_sd(effect: float) -> float:
    """The largest sd a unit value in [-1, 1] with mean `effect` can have."""
    return math.sqrt(max(0.0, 1.0 - effect * effect))


# Seeded runs behind a graded plan, drawn _CHUNK at a time: the plan's 95 % point must be
# known to about a percentage point of runs (the plan is checked at 93-97 %), so more runs than
# the other plans draw.
_GRADED_RUNS = 1_000
_CHUNK = 100
# The plan's reach, in units: a 5 pp margin at net -3 pp needs about 30,000.
_REACH = 262_144


def _draw(rng: np.random.Generator, shape: tuple[int, int], sd: float, effect: float) -> F:
    """Unit values in [-1, 1] of mean `effect` and sd `sd` exactly: half of the runs' units a
    single verdict's {-1, 0, 1}, half a session's smooth mean (a scaled beta), since a graded
    session is one verdict or an average of several."""
    second = sd * sd + effect * effect
    up, down = (second + effect) / 2.0, (second - effect) / 2.0  # P(+1), P(-1)
    u = rng.random(shape)
    lattice = np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))
    m, var = (effect + 1.0) / 2.0, sd * sd / 4.0
    k = m * (1.0 - m) / var - 1.0
    if k <= 0.0:  # only the two-point distribution has this sd
        return lattice
    smooth = 2.0 * rng.beta(max(m * k, 1e-6), max((1.0 - m) * k, 1e-6), shape) - 1.0
    return np.where(rng.random(shape) < 0.5, lattice, smooth)


def decide_times(
    margin: float, alpha: float, sd: float, effect: float = 0.0, critical: float | None = None
) -> F:
    """The unit at which each seeded run first decides (inf: not within _REACH): shown above
    -margin at α, or below it at α (latched), or below -critical at α."""
    if not (0.0 < sd <= max_sd(effect) + 1e-12):
        raise ValueError(f"sd {sd} is not possible for a mean {effect} in [-1, 1]")
    shown = reject = math.log(1.0 / alpha)

    def first(n: int) -> F:
        rng = np.random.default_rng(17)
        parts = []
        for _ in range(0, _GRADED_RUNS, _CHUNK):
            v = _draw(rng, (_CHUNK, n), sd, effect)
            stat = BoundedStat(v, np.arange(1, n + 1))
            hit = stat.log_wealth(-margin, "above") >= shown
            hit |= stat.p_latched(-margin, "below") <= math.exp(-reject)
            if critical is not None:
                hit |= stat.p_latched(-critical, "below") <= math.exp(-reject)
            parts.append(_first(hit, 1))
        return np.concatenate(parts)

    n = 512
    while True:
        times = first(n)
        if np.mean(np.isfinite(times)) >= 0.97 or n >= _REACH:
            return times
        n *= 2


def decide_units(
    margin: float, alpha: float, sd: float, effect: float = 0.0, critical: float | None = None
) -> int | None:
    """Units by which QUANTILE (95 %) of the runs have decided (None: not within reach)."""
    return quantile_units(decide_times(margin, alpha, sd, effect, critical))


def preference_plan(
    margins: tuple[float, ...],
    *,
    alpha: float,
    sd: float = PREFERENCE_SD,
    effect: float = 0.0,
    critical: float | None = None,
    pairs_per_session: float = 1.0,
    swap_rate: float = 0.25,
    tokens_per_grading: float = TOKENS_PER_GRADING,
    price_per_mtok: float = 0.0,
) -> list[PreferencePlan]:
    """For each margin: the graded sessions by which QUANTILE of runs of a candidate at net
    preference `effect` decide (`decide_units`) on unit values of sd `sd`, and what the grader
    is paid for them."""
    out = []
    for m in margins:
        units = decide_units(m, alpha, sd, effect, critical)
        if units is None:
            out.append(PreferencePlan(m, None, None, None, None))
            continue
        calls = math.ceil(units * pairs_per_session * (1.0 + swap_rate))
        tokens = math.ceil(calls * tokens_per_grading)
        out.append(PreferencePlan(m, units, calls, tokens, tokens / 1e6 * price_per_mtok))
    return out
