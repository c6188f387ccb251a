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

A candidate is promoted when every test has shown its margin, so the horizon the plan states
is the units by which 95 % of runs have shown every test together (`size`), not the slowest
test's own 95 %: with several tests near the slowest, that alone is met by fewer runs.

Units are sessions when sampling by session (`turns` pairs each), else pairs. Time = units ×
turns ÷ (request rate × sample rate). Never does IO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import MetricResult
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.divergence import NAME as SCORED_METRIC
from evaluators.stats.sequential import BoundedStat, MeanStat

# Longest experiment sized, in units: past this a margin is "out of reach".
MAX_UNITS = 200_000
# Seeded runs drawn per gating test; the plan states the units by which QUANTILE of the runs
# have decided every test together (a plan met by half the runs is no plan).
_RUNS = 400
QUANTILE = 0.95
# A test's runs are drawn until this share of them has decided (or for 4x its QUANTILE
# crossing), so the plan knows the share decided wherever its horizon may fall.
_COVER = 0.995
# Runs drawn at once (bounds the memory of a long simulation).
_CHUNK = 50
# Past this many simulated units a rate test draws fewer runs (`_runs_at`), never below _MIN_RUNS.
_FULL_RUNS_UP_TO = 8_192
_MIN_RUNS = 40

F = NDArray[np.float64]


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
    # share of pairs where exactly one arm's tool calls were invalid (production's own invalid
    # calls included: 1 % invalid on each arm gives about 2 %)
    tool_discordance: float = 0.0
    goal_ratio: float = 0.8  # the improvement the goal is expected to show (later-turn TTFT)
    # share of pairs scored with prompt logprobs (score_rate; 0 unless the candidate scores —
    # `canary plan --score-rate`, 0.1 for quantized): logprob_divergence counts only those
    score_rate: float = 0.0
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


def quantile_units(times: F) -> int | None:
    """The units by which QUANTILE of the runs have decided (None: not within MAX_UNITS)."""
    k = min(len(times) - 1, math.ceil(QUANTILE * len(times)) - 1)
    q = float(np.sort(times)[k])
    return math.ceil(q) if math.isfinite(q) and q <= MAX_UNITS else None


def rate_units(
    delta: float, alpha: float, discordance: float = 0.0, turns: int = 1, effect: float = 0.0
) -> int | None:
    """Units until a rate difference is shown within δ (true difference `effect`, 0 unless the
    user expects one), in QUANTILE of the runs. `discordance` is the share of pairs where
    exactly one arm is "bad"; a unit is the mean of `turns` such pairs."""
    return quantile_units(rate_times(delta, alpha, discordance, turns, effect))


def rate_times(
    delta: float, alpha: float, discordance: float = 0.0, turns: int = 1, effect: float = 0.0
) -> F:
    """The unit at which each seeded run first shows a rate within δ (inf: not by MAX_UNITS).
    Of the discordant pairs, (q + effect) / 2 are the candidate's bad ones, (q - effect) / 2
    the reference's (`effect` is clipped to [-q, q])."""
    effect = min(max(effect, -discordance), discordance)
    if discordance <= 0:  # nothing discordant: every run is the same, the floor of the test
        d = np.zeros(MAX_UNITS)
        w = BoundedStat(d, None)
        log_w = np.cumsum(w._log_factors(delta, "below"))
        hit = np.flatnonzero(log_w >= math.log(1 / alpha))
        return np.full(_RUNS, float(hit[0] + 1) if len(hit) else math.inf)
    turns = max(1, turns)

    def first(n: int) -> F:
        rng = np.random.default_rng(7)
        parts = []
        runs = _runs_at(n)
        for lo in range(0, runs, _CHUNK):
            u = rng.random((min(_CHUNK, runs - lo), n, turns), dtype=np.float32)
            q, worse = np.float32(discordance), np.float32((discordance + effect) / 2)
            d = np.where(u < worse, 1.0, np.where(u < q, -1.0, 0.0)).mean(axis=-1)
            stat = BoundedStat(d, np.arange(1, n + 1))
            parts.append(_first(stat.log_wealth(delta, "below") >= math.log(1 / alpha), 1))
        return np.concatenate(parts)

    return _grow(first)


def _runs_at(n: int) -> int:
    """Runs drawn for a test simulated n units long: _RUNS up to _FULL_RUNS_UP_TO units, then
    fewer (as few as _MIN_RUNS), so a plan at strict margins (tens of thousands of units) costs
    seconds, not minutes; its shares are then known to a few per cent."""
    return max(_MIN_RUNS, min(_RUNS, _RUNS * _FULL_RUNS_UP_TO // n))


def _first(crossed: NDArray[np.bool_], offset: int) -> F:
    """Per run (row), the first look at which `crossed` holds, counted from `offset`."""
    hit = crossed.any(axis=1)
    return np.where(hit, np.argmax(crossed, axis=1) + offset, np.inf).astype(np.float64)


def _grow(
    first: Callable[[int], F], *, start: int = 512, cap: int = MAX_UNITS, reach: float = 0.0
) -> F:
    """Crossing times drawn on horizons growing ×4 from `start` until _COVER of the runs have
    crossed or the horizon is 4x their QUANTILE crossing, and it is past `reach` (where the
    plan reads the share decided); never past `cap`."""
    n = start
    while True:
        times = first(n)
        done = float(np.mean(np.isfinite(times)))
        q = quantile_units(times)
        if n >= reach and (done >= _COVER or (q is not None and n >= 4 * q)):
            return times
        if n * 4 > cap:
            return times
        n *= 4


# Seeded runs behind a latency row (standardized normal unit means), and the scale the
# simulation is done at: gap / sd = _G0 (a few hundred units), the answer rescaled by (g0/g)².
_MEAN_RUNS = 400
_G0 = 0.2


@dataclass(frozen=True, slots=True)
class MeanRow:
    """A gating test on the mean of unit values (a latency, length or cost log-ratio)."""

    metric: str
    margin: str
    sd: float  # sd of one unit's mean (measured, or from the noise model)
    gap: float  # distance from the true mean to the boundary the bound must clear (> 0)


@dataclass(frozen=True, slots=True)
class RateRow:
    """A gating test on a rate difference: per-pair discordance q, `turns` pairs a unit."""

    metric: str
    margin: str
    delta: float
    discordance: float
    turns: int = 1


@dataclass(frozen=True, slots=True)
class BoundedRow:
    """A gating test on a continuous difference in [-1, 1] (text similarity): unit sd `sd`."""

    metric: str
    margin: str
    delta: float
    sd: float


@dataclass(frozen=True, slots=True)
class FixedRow:
    """A gate with a known size (the minimum pairs gate)."""

    metric: str
    margin: str
    units: int


Row = MeanRow | RateRow | BoundedRow | FixedRow


_SIMULATED: dict[int, MeanStat] = {}
# Longest horizon simulated as such; longer ones are rescaled to it (`mean_times`).
_SIM_HORIZON = 2_048
# Simulated lengths kept between calls (a plan tunes the same draws to many horizons): up to
# 4,096 units, ~40 MB each; longer ones are drawn when asked.
_KEEP_UP_TO = 4_096


def _unit_means(n: int) -> MeanStat:
    """The seeded standardized unit means behind every latency row, n looks long (its running
    moments: tuning to a horizon is `MeanStat.tuned`)."""
    stat = _SIMULATED.get(n)
    if stat is None:
        rng = np.random.default_rng(11)
        z = rng.standard_normal((_MEAN_RUNS, n))
        stat = MeanStat(z, np.arange(2, n + 1), horizon=n, sigma_floor=1e-6)
        if n <= _KEEP_UP_TO:
            _SIMULATED[n] = stat
    return stat


def mean_units(
    gap: float, sd: float, alpha: float, horizon: float, planned: float = 0.0
) -> int | None:
    """Units by which QUANTILE of runs have shown a mean inside a boundary `gap` away."""
    times = mean_times(gap, sd, alpha, horizon, planned)
    return None if times is None else quantile_units(times)


def mean_times(
    gap: float, sd: float, alpha: float, horizon: float, planned: float = 0.0
) -> F | None:
    """The unit at which each seeded run first shows a mean inside a boundary `gap` away.

    The verdict's own sequence (`MeanStat` tuned to `horizon`, `planned` of alpha on the
    boundary planned to it) on normal unit means of sd `sd`, looked at after every unit;
    simulated at gap/sd = _G0 and rescaled (the sequence is scale-free in units of its
    variance: the horizon is rescaled with the answer). None when the margin is degenerate.
    """
    if not (gap > 0 and sd > 0):
        return None
    g = gap / sd
    # Brownian scaling: time × k, gap ÷ sqrt(k), horizon × k leave the crossing law unchanged.
    k = (_G0 / g) ** 2 if g < _G0 else 1.0
    # ... and a long horizon is simulated at most _SIM_HORIZON units long, rescaled the same
    # way, so its draws are the kept ones (a strict plan's horizon is tens of thousands).
    k = max(k, horizon / _SIM_HORIZON)
    gs, hs = g * math.sqrt(k), max(10.0, horizon / k)

    def first(n: int) -> F:
        stat = _unit_means(n).tuned(hs, alpha=alpha, planned=planned)
        return _first(stat.p(gs, "below") <= alpha, 2)

    return _grow(first, start=256, cap=65_536, reach=hs) * k


def bounded_units(delta: float, alpha: float, sd: float) -> int | None:
    """Units by which QUANTILE of runs show a [-1, 1] difference within δ."""
    return quantile_units(bounded_times(delta, alpha, sd))


def bounded_times(delta: float, alpha: float, sd: float) -> F:
    """The unit at which each seeded run first shows a [-1, 1] difference within δ (true
    difference 0, normal unit values of sd `sd`, clipped), with the verdict's betting
    sequence."""
    if sd <= 0:
        return rate_times(delta, alpha)

    def first(n: int) -> F:
        rng = np.random.default_rng(13)
        d = np.clip(rng.normal(0.0, sd, (_RUNS, n)), -1.0, 1.0)
        stat = BoundedStat(d, np.arange(1, n + 1))
        return _first(stat.log_wealth(delta, "below") >= math.log(1 / alpha), 1)

    return _grow(first)


def measured_rows(
    metrics: list[MetricResult], s: VerdictSettings, *, goal_ratio: float | None = None
) -> list[Row]:
    """One row per gating test of a running experiment, as the verdict gates it, sized from
    what its pairs so far measured: each latency, length or cost ratio from the sd of its unit
    values (`detail.unit_sd`), each rate from its share of discordant pairs and pairs per unit,
    similarity from its unit sd. Guardrails are sized for a candidate truly at the reference
    (ratio 1, difference 0); the goal for `goal_ratio`, else the improvement measured so far
    (when there is one), else 0.8. The scored divergence test is not a row: its units are
    scored pairs, a share of the pairs (`needs` sizes it from `measured_scoring`).
    """
    rows: list[Row] = []
    for r in metrics:
        if not r.gating or r.status in ("ungated", "n/a") or r.n == 0:
            continue
        if r.name == SCORED_METRIC:
            continue
        sd = r.detail.get("unit_sd")
        if isinstance(sd, float) and r.scale == "ratio":
            sd = max(sd, s.latency_sigma_floor)  # the verdict's floor: identical arms decide
        units = r.units or r.n
        label = f"{r.label} ({r.name})"
        if r.scale == "ratio":
            if not isinstance(sd, float):
                continue
            if r.role == "goal" and r.goal is not None:
                est = r.estimate if r.estimate is not None and r.estimate < r.goal else 0.8
                expected = goal_ratio if goal_ratio is not None else est
                rows.append(
                    MeanRow(
                        f"{label}, {expected:.3g} expected",
                        f"< {r.goal:g}",
                        sd,
                        math.log(r.goal) - math.log(expected),
                    )
                )
            elif r.margin is not None:
                rows.append(MeanRow(label, f"×{r.margin:g}", sd, math.log(r.margin)))
        elif r.margin is not None:
            share = r.detail.get("discordant_share")
            margin = f"+{r.margin * 100:g} pp" if r.unit == "rate" else f"{r.margin:g}"
            if r.unit == "rate" and isinstance(share, float):
                turns = max(1, round(r.n / max(units, 1)))
                if isinstance(sd, float) and sd > 0 and share > 0:
                    # Discordance clustered by session: a unit's variance q/k measured says
                    # how many independent pairs k a unit is worth (at most its turns).
                    turns = int(min(turns, max(1, round(share / sd**2))))
                rows.append(RateRow(label, margin, r.margin, share, turns))
            elif isinstance(sd, float):
                rows.append(BoundedRow(label, margin, r.margin, sd))
    return rows


def measured_scoring(metrics: list[MetricResult], pairs: int) -> tuple[float, float] | None:
    """(share of the pairs scored, sd of one scored pair's difference) that the divergence test
    of a running experiment measured, for `Traffic.score_rate` and `score_sd`; None when it is
    not gated or has no scored pair yet."""
    for r in metrics:
        if r.name != SCORED_METRIC or not r.gating or r.status in ("ungated", "n/a"):
            continue
        scored, sd = r.detail.get("pairs_scored"), r.detail.get("unit_sd")
        if isinstance(scored, int) and scored > 0 and pairs > 0 and isinstance(sd, float):
            return min(1.0, scored / pairs), sd
    return None


def noise_rows(traffic: Traffic, s: VerdictSettings, *, goal: bool, first_turn: bool) -> list[Row]:
    """The gating tests of a candidate from the noise model of `traffic` (before any data)."""
    turns = round(traffic.turns)
    rows: list[Row] = [
        RateRow(
            "failures", f"+{s.error_delta * 100:g} pp", s.error_delta, traffic.discordance, turns
        ),
        RateRow(
            "agreement",
            f"+{s.agreement_delta * 100:g} pp",
            s.agreement_delta,
            traffic.disagreement,
            turns,
        ),
        RateRow(
            "tool-call validity",
            f"+{s.tool_validity_delta * 100:g} pp",
            s.tool_validity_delta,
            traffic.tool_discordance,
            turns,
        ),
        RateRow(
            "SLO exceedance",
            f"+{s.slo_exceedance_delta * 100:g} pp",
            s.slo_exceedance_delta,
            0.0,
            1,
        ),
    ]
    lat = math.log(s.latency_delta)
    if first_turn and traffic.turns > 1:
        one = math.sqrt(traffic.sd_pair**2 + traffic.sd_session**2)
        rows.append(MeanRow("TTFT, turn 1", f"×{s.latency_delta:g}", one, lat))
    rows.append(MeanRow("latency (TTFT, TPOT, E2E)", f"×{s.latency_delta:g}", traffic.sd_unit, lat))
    rows.append(MeanRow("output length", f"×{s.length_delta:g}", 0.05, math.log(s.length_delta)))
    if goal:
        later = traffic.sd_unit
        if traffic.turns > 1:
            later = math.sqrt(
                traffic.sd_pair**2 / max(traffic.turns - 1, 1) + traffic.sd_session**2
            )
        width = math.log(s.goal_ttft_ratio) - math.log(traffic.goal_ratio)
        rows.append(
            MeanRow(
                f"goal (ratio {traffic.goal_ratio:g} expected)",
                f"< {s.goal_ttft_ratio:g}",
                later,
                width,
            )
        )
    rows.append(
        FixedRow(
            "minimum pairs gate", f"{s.min_pairs:,} pairs", math.ceil(s.min_pairs / traffic.turns)
        )
    )
    return rows


def size(
    rows: list[Row], s: VerdictSettings, horizon: int | None = None
) -> tuple[list[int | None], int]:
    """(units each row needs, the horizon they were sized at).

    Each row's units are those by which QUANTILE of its seeded runs show it. Without a horizon
    the plan finds its own: the smallest horizon by which, every test's sequences tuned to it,
    QUANTILE of runs have shown every test together — the product of the tests' shares (the
    tests read different quantities, and where they share noise a joint share is only larger,
    so the product never promises more than the runs give); searched on a log scale to 2 %.
    That is the horizon to set on the candidate (`horizon_units`), so the verdict runs the same
    sequences. A test a horizon cannot reach (past MAX_UNITS) does not move it.
    """
    cache: dict[Row, F] = {}

    def times(row: Row, h: float) -> F | None:
        if isinstance(row, FixedRow):
            return np.full(_RUNS, float(row.units))
        if isinstance(row, MeanRow):
            t = mean_times(row.gap, row.sd, s.alpha, h, s.planned_share)
        else:
            if row not in cache:
                cache[row] = (
                    rate_times(row.delta, s.alpha, row.discordance, row.turns)
                    if isinstance(row, RateRow)
                    else bounded_times(row.delta, s.alpha, row.sd)
                )
            t = cache[row]
        return None if t is None else np.maximum(t, float(s.min_metric_pairs))

    def at(h: float) -> tuple[list[int | None], list[float]]:
        """(each row's units, each row's share of runs shown by h) with sequences tuned to h."""
        units: list[int | None] = []
        shares: list[float] = []
        for row in rows:
            t = times(row, h)
            units.append(None if t is None else quantile_units(t))
            shares.append(0.0 if t is None else float(np.mean(t <= h)))
        return units, shares

    if horizon is not None:
        return at(float(horizon))[0], horizon
    first, _ = at(float(s.horizon_units))
    if not any(u is not None for u in first):
        return first, s.horizon_units
    reachable = [i for i, u in enumerate(first) if u is not None]

    def fits(h: float) -> tuple[bool, list[int | None]]:
        units, shares = at(h)
        each = all(units[i] is not None and units[i] <= h for i in reachable)  # type: ignore[operator]
        return each and math.prod(shares[i] for i in reachable) >= QUANTILE, units

    # Every row that does not depend on the horizon is a floor under it.
    floor = max(
        [10.0]
        + [
            float(u)
            for r, u in zip(rows, first, strict=True)
            if u is not None and not isinstance(r, MeanRow)
        ]
    )
    lo, hi = floor, floor
    ok, units = fits(hi)
    if ok:
        return units, max(10, round(hi))
    while not ok and hi < MAX_UNITS:
        lo, hi = hi, min(hi * 2.0, float(MAX_UNITS))
        ok, units = fits(hi)
    if not ok:  # past MAX_UNITS: state what the largest horizon gives
        return units, max(10, round(hi))
    best = units
    while hi / lo > 1.02:
        mid = math.sqrt(lo * hi)
        ok, units = fits(mid)
        if ok:
            hi, best = mid, units
        else:
            lo = mid
    return best, max(10, math.ceil(hi))


def needs(
    traffic: Traffic,
    s: VerdictSettings,
    *,
    goal: bool = True,
    first_turn: bool = True,
    rows: list[Row] | None = None,
    horizon: int | None = None,
) -> tuple[list[Need], int]:
    """(what each gating test needs under `traffic` and the settings `s`, the horizon)."""
    rows = rows if rows is not None else noise_rows(traffic, s, goal=goal, first_turn=first_turn)
    units, h = size(rows, s, horizon)
    out = []
    for row, u in zip(rows, units, strict=True):
        pairs = None if u is None else math.ceil(u * traffic.turns)
        secs = None if pairs is None else pairs / traffic.pairs_per_s
        out.append(Need(row.metric, row.margin, u, pairs, secs))
    if traffic.score_rate > 0:
        # Scored pairs (by exchange, so each is its own unit): the mean of the per-pair top-1
        # disagreement difference within δ; they arrive at score_rate of the pairs. The
        # verdict runs the mixture alone on them (their count is not the horizon's).
        scored = mean_units(s.score_delta, traffic.score_sd, s.alpha, h)
        if scored is not None:
            scored = max(scored, s.min_metric_pairs)
        # Units are scored pairs; pairs are the mirrored pairs that many scored ones take.
        pairs = None if scored is None else math.ceil(scored / traffic.score_rate)
        secs = None if pairs is None else pairs / traffic.pairs_per_s
        out.append(
            Need(
                f"logprob divergence ({traffic.score_rate:g} scored)",
                f"+{s.score_delta * 100:g} pp",
                scored,
                pairs,
                secs,
            )
        )
    return out, h


def margins_within(
    units: float, rows: list[Row], s: VerdictSettings, *, discordance: float = 0.0, turns: int = 1
) -> tuple[float | None, float | None]:
    """(smallest failure-rate margin δ, smallest latency ratio margin) that QUANTILE of clean
    candidates show within `units`, with the sequences tuned to that many units.

    The latency margin is the one the noisiest latency guardrail among `rows` needs (turn-1
    TTFT when it is gated: one pair per session, nothing averaged); None when out of reach.
    """
    if units < 2:
        return None, None

    def fits_rate(delta: float) -> bool:
        need = rate_units(delta, s.alpha, discordance, turns)
        return need is not None and max(need, s.min_metric_pairs) <= units

    rate: float | None = None
    lo, hi = 1e-4, 0.5
    if fits_rate(hi):
        for _ in range(14):  # ~5 % precision on a log scale
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if fits_rate(mid) else (mid, hi)
        rate = hi
    sds = [r.sd for r in rows if isinstance(r, MeanRow) and r.margin.startswith("×")]
    if not sds:
        return rate, None
    sd = max(sds)

    def fits_latency(gap: float) -> bool:
        need = mean_units(gap, sd, s.alpha, units, s.planned_share)
        return need is not None and max(need, s.min_metric_pairs) <= units

    glo, ghi = 1e-4, 3.0
    if not fits_latency(ghi):
        return rate, None
    for _ in range(18):
        mid = math.sqrt(glo * ghi)
        glo, ghi = (glo, mid) if fits_latency(mid) else (mid, ghi)
    return rate, math.exp(ghi)
