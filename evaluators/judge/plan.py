"""Sizing an experiment before it starts: units, pairs and time each gating test needs.

Pure: the same confidence sequences the verdict uses (`evaluators.stats.sequential`) are run on
the most favourable data a margin allows, so a number here is a floor no run of the product
can beat, not an estimate from a formula of another method:

* a rate margin δ (failures, agreement, SLO exceedance) with no discordant unit at all: the
  betting wealth against "harm >= δ" grows by about (1 + 0.8 δ) per unit, so ≈ log(1/α)/(0.8 δ)
  units (3.7/δ at α = 0.05); a background discordance q per pair adds variance and needs more
  (computed on seeded streams with that discordance: the units by which 95 % have shown it);
* a latency margin (ratio δ) at true ratio 1 with per-unit log-ratio sd σ: the normal-mixture
  half-width must shrink below log δ;
* a goal (ratio g expected, goal threshold 1): the half-width must shrink below |log g|.

Units are sessions when sampling by session (`turns` pairs each), else pairs. Time = units ×
turns ÷ (request rate × sample rate). Never does IO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from evaluators.judge.settings import VerdictSettings
from evaluators.stats.sequential import BoundedStat, MeanStat

# Longest experiment sized, in units: past this a margin is "out of reach".
MAX_UNITS = 200_000
# Seeded streams drawn when a background discordance is given; the plan states the units by
# which QUANTILE of them have shown the margin (a plan met by half the runs is no plan).
_RUNS = 40
QUANTILE = 0.95


@dataclass(frozen=True, slots=True)
class Traffic:
    """What the experiment will see."""

    rate_rps: float  # live requests per second
    sample_rate: float  # share of requests (or sessions) mirrored
    turns: float = 1.0  # pairs per unit: turns per session when sampling by session
    sd_pair: float = 0.14  # sd of one pair's latency log-ratio (10 % per-arm noise: 0.14)
    sd_session: float = 0.05  # sd of a session's shared shift of that log-ratio
    discordance: float = 0.0  # share of pairs where exactly one arm failed (background)
    # share of pairs where exactly one of candidate / control differs from production at T=0
    # (engine nondeterminism: 1 % per arm gives about 2 %)
    disagreement: float = 0.0
    goal_ratio: float = 0.8  # the improvement the goal is expected to show (later-turn TTFT)
    # share of pairs scored with prompt logprobs (score_rate; 0.1 for quantized by default):
    # logprob_divergence counts only those
    score_rate: float = 0.1
    # sd of one scored pair's top-1 disagreement difference (3.8 pp: bfloat16 vs float32 on
    # the real-engine suite)
    score_sd: float = 0.04

    @property
    def pairs_per_s(self) -> float:
        return self.rate_rps * self.sample_rate

    @property
    def sd_unit(self) -> float:
        """sd of a unit's mean log-ratio: pair noise averages over turns, session shifts do not."""
        shared = self.sd_session if self.turns > 1 else 0.0
        return math.sqrt(self.sd_pair**2 / self.turns + shared**2)


@dataclass(frozen=True, slots=True)
class Need:
    """One gating test's requirement."""

    metric: str
    margin: str
    units: int | None  # None: not within MAX_UNITS
    pairs: int | None
    seconds: float | None


def rate_units(delta: float, alpha: float, discordance: float = 0.0, turns: int = 1) -> int | None:
    """Units until a rate difference is shown within δ (true difference 0).

    `discordance` is the share of pairs where exactly one arm is "bad"; a unit is the mean of
    `turns` such pairs.
    """
    if discordance <= 0:
        d = np.zeros(MAX_UNITS)
        w = BoundedStat(d, None)
        log_w = np.cumsum(w._log_factors(delta, "below"))
        hit = np.flatnonzero(log_w >= math.log(1 / alpha))
        return int(hit[0]) + 1 if len(hit) else None
    return _grow(lambda k: _rate_median(delta, alpha, discordance, max(1, turns), k))


def _rate_median(delta: float, alpha: float, q: float, turns: int, n: int) -> float:
    rng = np.random.default_rng(7)
    u = rng.random((_RUNS, n, turns))
    d = np.where(u < q / 2, 1.0, np.where(u < q, -1.0, 0.0)).mean(axis=-1)
    stat = BoundedStat(d, np.arange(1, n + 1))
    crossed = stat.log_wealth(delta, "below") >= math.log(1 / alpha)
    first = np.where(crossed.any(axis=1), np.argmax(crossed, axis=1) + 1, np.inf)
    k = min(len(first) - 1, math.ceil(QUANTILE * len(first)) - 1)
    return float(np.sort(first)[k])  # inf while more than 5 % of the runs have not shown it


def _grow(f: Callable[[int], float]) -> int | None:
    """The crossing quantile, on horizons growing ×4 until it is finite."""
    n = 512
    while n <= MAX_UNITS:
        m = f(n)
        if math.isfinite(m):
            return int(m)
        n *= 4
    return None


def mean_units(width: float, sd: float, alpha: float, tau: float) -> int | None:
    """Units until the normal-mixture half-width of a mean with sd `sd` is below `width`."""
    if width <= 0:
        return None
    looks = np.unique(np.geomspace(2, MAX_UNITS, 400).astype(np.int64))
    stat = MeanStat(np.zeros(MAX_UNITS), looks, tau=tau, sigma_floor=sd)
    hw = stat.halfwidth(alpha)
    ok = np.flatnonzero(hw <= width)
    if not len(ok):
        return None
    i = int(ok[0])
    lo = int(looks[i - 1]) if i else 2
    for n in range(lo, int(looks[i]) + 1):  # exact within the bracket
        one = MeanStat(np.zeros(n), np.array([n]), tau=tau, sigma_floor=sd)
        if float(one.halfwidth(alpha)[0]) <= width:
            return n
    return int(looks[i])


def needs(traffic: Traffic, s: VerdictSettings, *, goal: bool = True) -> list[Need]:
    """What each gating test needs under `traffic` and the settings `s`."""
    turns = round(traffic.turns)
    rows: list[tuple[str, str, int | None]] = [
        (
            "failures",
            f"+{s.error_delta * 100:g} pp",
            rate_units(s.error_delta, s.alpha, traffic.discordance, turns),
        ),
        (
            "agreement",
            f"+{s.agreement_delta * 100:g} pp",
            rate_units(s.agreement_delta, s.alpha, traffic.disagreement, turns),
        ),
        (
            "SLO exceedance",
            f"+{s.slo_exceedance_delta * 100:g} pp",
            rate_units(s.slo_exceedance_delta, s.alpha),
        ),
        (
            "latency (TTFT, TPOT, E2E)",
            f"×{s.latency_delta:g}",
            mean_units(math.log(s.latency_delta), traffic.sd_unit, s.alpha, s.latency_tau),
        ),
        (
            "output length",
            f"×{s.length_delta:g}",
            mean_units(math.log(s.length_delta), 0.05, s.alpha, s.latency_tau),
        ),
    ]
    if goal:
        width = math.log(s.goal_ttft_ratio) - math.log(traffic.goal_ratio)
        rows.append(
            (
                f"goal (ratio {traffic.goal_ratio:g} expected)",
                f"< {s.goal_ttft_ratio:g}",
                mean_units(width, traffic.sd_unit, s.alpha, s.latency_tau),
            )
        )
    rows.append(
        ("minimum pairs gate", f"{s.min_pairs:,} pairs", math.ceil(s.min_pairs / traffic.turns))
    )
    out = []
    for metric, margin, units in rows:
        if units is not None:
            units = max(units, s.min_metric_pairs)
        pairs = None if units is None else math.ceil(units * traffic.turns)
        secs = None if pairs is None else pairs / traffic.pairs_per_s
        out.append(Need(metric, margin, units, pairs, secs))
    if traffic.score_rate > 0:
        # Scored pairs (by exchange, so each is its own unit): the mean of the per-pair top-1
        # disagreement difference within δ; they arrive at score_rate of the pairs.
        units = mean_units(s.score_delta, traffic.score_sd, s.alpha, s.score_delta)
        if units is not None:
            units = max(units, s.min_metric_pairs)
        # Units are scored pairs; pairs are the mirrored pairs that many scored ones take.
        pairs = None if units is None else math.ceil(units / traffic.score_rate)
        secs = None if pairs is None else pairs / traffic.pairs_per_s
        out.append(
            Need(
                f"logprob divergence ({traffic.score_rate:g} scored)",
                f"+{s.score_delta * 100:g} pp",
                units,
                pairs,
                secs,
            )
        )
    return out


def margin_for(budget_s: float, traffic: Traffic, s: VerdictSettings) -> tuple[float | None, float]:
    """(smallest failure-rate margin δ, smallest latency ratio margin) shown within `budget_s`,
    at the traffic's background failures."""
    units = budget_s * traffic.pairs_per_s / traffic.turns
    if units < 2:
        return None, math.inf
    turns = round(traffic.turns)

    def fits(delta: float) -> bool:
        need = rate_units(delta, s.alpha, traffic.discordance, turns)
        return need is not None and need <= units

    rate: float | None = None
    lo, hi = 1e-4, 0.5
    if fits(hi):
        for _ in range(14):  # ~5 % precision on a log scale
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        rate = hi
    n = int(units)
    stat = MeanStat(np.zeros(n), np.array([n]), tau=s.latency_tau, sigma_floor=traffic.sd_unit)
    return rate, math.exp(float(stat.halfwidth(s.alpha)[0]))
