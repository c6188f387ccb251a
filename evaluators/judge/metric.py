"""What a metric is, what evidence it yields, and how one is judged from per-pair values.

A metric evaluator (see `evaluators.metrics.catalog`) turns the PairSet into per-pair values and
calls `judge_mean` (unbounded, e.g. log-ratios) or `judge_bounded` (in [-1, 1], e.g. paired rate
differences) with the mask of pairs they came from. Both average the values over units of
independence first (`evaluators.stats.units`: session bursts when sampling by session, else
pairs; only closed units) and bet on the unit means, so every gating interval holds under
session correlation. The estimand of every metric is therefore the mean over units of the
unit's mean per-pair statistic (for ratios: exp of the mean log-ratio); the verdict, the tables
and the plots all show that one number. Both return a `MetricResult` carrying its always-valid
p-values at the metric's margins; `evaluators.judge.verdict` turns those into statuses.

Scales: a "ratio" metric's statistic is a mean log-ratio (margins are ratios, 1.05); a
"difference" metric's is a mean difference (margins are absolute, 0.001 = 0.1 pp).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import msgspec
import numpy as np
from numpy.typing import NDArray

from domain.capture import CapacitySummary
from domain.endpoint import Endpoint
from evaluators.human.data import HumanLabels
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.gradings import Gradings
from evaluators.pairs.types import PairSet
from evaluators.stats.sequential import PLOT_XTOL, BoundedStat, MeanStat, pairs_needed
from evaluators.stats.units import Units, build_units

Role = Literal["critical", "guardrail", "goal", "diagnostic"]
Harm = Literal["higher", "lower", "both"]
Scale = Literal["ratio", "difference"]
Status = Literal[
    "inside",
    "improved",
    "undecided",
    "beyond",
    "critical",
    "insufficient",
    "n/a",
    "info",
    "ungated",
]
B = NDArray[np.bool_]
# Per-pair values: float64, or float32 where they are exact in it (indicators, differences).
Floats = NDArray[np.float64] | NDArray[np.float32]
# Looks at which a gating metric's always-valid interval is drawn against pairs (HTML plot).
TRAJECTORY_LOOKS = 16
Detail = dict[str, float | int | str | None]


class MetricSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A metric's identity and decision rule, in natural units (ratios or differences)."""

    name: str
    label: str
    role: Role
    harm: Harm
    scale: Scale
    delta: float | None = None  # non-inferiority margin
    critical: float | None = None  # decisive-harm margin (role "critical")
    goal: float | None = None  # improvement threshold (role "goal")
    unit: str = ""

    def to_stat(self, value: float) -> float:
        """A natural-unit threshold on the statistic's scale (log for ratios)."""
        return math.log(value) if self.scale == "ratio" else value

    def to_natural(self, value: float) -> float:
        if self.scale != "ratio":
            return value
        return math.exp(value) if value < 700.0 else math.inf  # a bound out of any range

    def harm_bounds(self, margin: float) -> list[tuple[float, Literal["below", "above"]]]:
        """(boundary, side on which harm lies) for a margin: one side, or two for "both"."""
        m = abs(self.to_stat(margin))
        out: list[tuple[float, Literal["below", "above"]]] = []
        if self.harm in ("higher", "both"):
            out.append((m, "above"))
        if self.harm in ("lower", "both"):
            out.append((-m, "below"))
        return out


class Evidence(NamedTuple):
    """Always-valid p-values of one metric at each look (arrays broadcast over runs/looks)."""

    n: NDArray[np.float64]
    p_inside: NDArray[np.float64]  # null: harm at least δ
    p_beyond: NDArray[np.float64]  # null: harm at most δ
    p_critical: NDArray[np.float64]  # null: harm at most δc
    p_goal: NDArray[np.float64]  # null: no improvement past the goal


Stat = MeanStat | BoundedStat


def _flip(side: Literal["below", "above"]) -> Literal["below", "above"]:
    return "above" if side == "below" else "below"


def beyond_from(ev: Evidence, start: float) -> NDArray[np.float64]:
    """A mean sequence's p_beyond as it counts from its planned size `start` on: the lowest at
    any look at or past `start` so far (looks on the last axis, every unit a look from `start`
    on), 1 before it. The minimum over looks is valid because each look's p-value is (the
    planned boundary holds at any looks up to the horizon, the mixture at any look at all), and
    it latches a reject the way a betting sequence's does."""
    p = np.where(ev.n >= start, ev.p_beyond, 1.0)
    return np.minimum.accumulate(p, axis=-1)


def evidence(spec: MetricSpec, stat: Stat) -> Evidence:
    """The p-values of `spec`'s tests from a confidence-sequence statistic.

    A betting sequence's harm p-values are latched (`BoundedStat.p_latched`): the evidence of
    the best look so far, as valid as the current look's, so a reject shown stays shown."""
    ones = np.ones(stat.mean.shape)
    n = stat.t * ones
    p_inside, p_beyond, p_critical, p_goal = ones, ones, ones, ones
    harm = stat.p_latched if isinstance(stat, BoundedStat) else stat.p
    if spec.delta is not None:
        sides = spec.harm_bounds(spec.delta)
        p_inside = np.maximum.reduce([stat.p(b, _flip(s)) for b, s in sides])
        p_beyond = np.minimum(1.0, len(sides) * np.minimum.reduce([harm(b, s) for b, s in sides]))
    if spec.critical is not None:
        sides = spec.harm_bounds(spec.critical)
        p_critical = np.minimum(1.0, len(sides) * np.minimum.reduce([harm(b, s) for b, s in sides]))
    if spec.goal is not None:
        side: Literal["below", "above"] = "below" if spec.harm == "higher" else "above"
        p_goal = stat.p(spec.to_stat(spec.goal), side)
    return Evidence(n, p_inside, p_beyond, p_critical, p_goal)


class MetricResult(msgspec.Struct, kw_only=True):
    """One metric in the report: estimate, always-valid interval, n, tests and judgement."""

    name: str
    label: str
    role: Role
    harm: Harm
    scale: Scale
    unit: str = ""
    reference: str = "production"
    n: int = 0
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    margin: float | None = None
    critical_margin: float | None = None
    goal: float | None = None
    status: Status = "n/a"
    reason: str = ""
    p_inside: float | None = None
    p_beyond: float | None = None
    p_critical: float | None = None
    p_goal: float | None = None
    more_pairs: int | None = None
    # Units of independence behind n (sessions when sampling by session, else pairs).
    units: int | None = None
    # Seconds until `more_pairs` arrive at the observed pair rate (undecided metrics only).
    eta_s: float | None = None
    # Whether harm beyond the margin rejects at this look without a planned look: a betting
    # sequence (exact at every look; its p_beyond is latched), or a mean sequence whose units
    # have reached the horizon, its planned size (p_beyond is then the lowest from there on).
    beyond_counts: bool = False
    # Why a metric that would gate does not (no control, nothing measurable); "" = it gates.
    ungated: str = ""
    # Whether an ungated metric keeps the candidate from being promoted (a goal that cannot be
    # shown, latency without a same-load reference) or only stops gating (agreement without a
    # noise floor, nothing measurable).
    ungated_blocks: bool = False
    # [pairs, low, high] of the always-valid interval at earlier looks (gating metrics).
    trajectory: list[list[float | None]] = msgspec.field(default_factory=list)
    detail: Detail = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    slices: list[Detail] = msgspec.field(default_factory=list)  # diagnostic, BH-adjusted

    @property
    def gating(self) -> bool:
        return self.role in ("critical", "guardrail", "goal")


@dataclass(frozen=True, slots=True)
class EvalContext:
    """Everything a metric evaluator may read."""

    pairs: PairSet
    settings: VerdictSettings
    candidate: Endpoint
    live: Endpoint | None = None
    control: Endpoint | None = None
    planned_look: bool = False
    # "Now" for deciding which units are closed; None = every unit is closed (the pairs given
    # are final). A planned (final) look closes every unit too: no look follows it.
    as_of: float | None = None
    # Draw each gating metric's interval at earlier looks (off in bulk simulations).
    trajectories: bool = True
    # The newest recent `canary capacity` result of the candidate, when there is one (cost).
    capacity: CapacitySummary | None = None
    # The candidate's LLM gradings (a model upgrade, evaluators.metrics.preference), and the
    # control's against production (the grader's A/A); None when not loaded.
    gradings: Gradings | None = None
    control_gradings: Gradings | None = None
    # People's labels of the candidate's graded pairs (evaluators.human); None when not loaded.
    labels: HumanLabels | None = None
    units: Units = field(init=False)

    def __post_init__(self) -> None:
        ps = self.pairs
        by_session = bool(self.candidate.sampling == "session" or np.any(ps.session[: ps.n]))
        as_of = math.inf if self.as_of is None or self.planned_look else self.as_of
        t = ps.received_at[: ps.n]
        ref = ps.control if ps.has_control else ps.production
        # Settled: every arm answered (or failed), or the copy is past the candidate's timeout.
        answered = ps.candidate.present[: ps.n] & ref.present[: ps.n]
        settled = answered | (t + self.candidate.timeout_s <= as_of)
        units = build_units(
            t,
            ps.session[: ps.n],
            by_session=by_session,
            as_of=as_of,
            idle_s=self.settings.session_idle_s,
            settled=settled,
        )
        object.__setattr__(self, "units", units)
        ps.release()

    def session_groups(self, idx: NDArray[np.intp]) -> NDArray[np.int64] | None:
        """Dense group codes of the pairs `idx` (a session each, and one per pair that has
        none), for resampling whole sessions; None when units are not sessions."""
        return _groups(self.pairs.session[idx]) if self.units.by_session else None

    @property
    def has_control(self) -> bool:
        return self.pairs.has_control

    @property
    def reference(self) -> str:
        """The fair reference arm for latency, errors and throughput."""
        return "control" if self.has_control else "production"


def _groups(session: NDArray[np.uint64]) -> NDArray[np.int64]:
    """Dense group codes: one per session, and one per pair that has no session."""
    _, codes = np.unique(session, return_inverse=True)
    codes = codes.astype(np.int64)
    lone = session == 0
    if np.any(lone):
        codes[lone] = codes.max() + 1 + np.arange(int(np.count_nonzero(lone)))
    return codes


def _fnum(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _result(
    spec: MetricSpec,
    stat: Stat,
    n: int,
    units: int,
    reference: str,
    detail: Detail,
    alpha: float,
) -> MetricResult:
    ev = evidence(spec, stat)
    lo, hi = stat.bounds(alpha)
    est = float(stat.mean[-1])
    res = MetricResult(
        name=spec.name,
        label=spec.label,
        role=spec.role,
        harm=spec.harm,
        scale=spec.scale,
        unit=spec.unit,
        reference=reference,
        n=n,
        estimate=_fnum(spec.to_natural(est)),
        ci_low=_fnum(spec.to_natural(float(lo[-1]))),
        ci_high=_fnum(spec.to_natural(float(hi[-1]))),
        margin=spec.delta,
        critical_margin=spec.critical,
        goal=spec.goal,
        p_inside=_fnum(float(ev.p_inside[-1])),
        p_beyond=_fnum(float(ev.p_beyond[-1])),
        p_critical=_fnum(float(ev.p_critical[-1])),
        p_goal=_fnum(float(ev.p_goal[-1])),
        status="undecided",  # until evaluators.judge.verdict judges it with the other metrics
        units=units,
        detail=detail,
    )
    res.beyond_counts = isinstance(stat, BoundedStat)
    more_units = _more_pairs(spec, stat, units, est, lo, hi)
    # Units still needed, in pairs at the observed pairs per unit.
    res.more_pairs = None if more_units is None else math.ceil(more_units * n / max(units, 1))
    return res


def _more_pairs(
    spec: MetricSpec,
    stat: Stat,
    n: int,
    est: float,
    lo: NDArray[np.float64],
    hi: NDArray[np.float64],
) -> int | None:
    """Pairs still needed for the bound that would decide this metric to clear its boundary."""
    if not math.isfinite(est) or len(lo) < 2:
        return None
    n_half = int(stat.t[0])
    needs: list[int | None] = []
    targets: list[tuple[float, Literal["below", "above"]]] = []
    if spec.role == "goal" and spec.goal is not None:
        targets.append((spec.to_stat(spec.goal), "below" if spec.harm == "higher" else "above"))
    elif spec.delta is not None:
        targets.extend((b, _flip(s)) for b, s in spec.harm_bounds(spec.delta))
    for boundary, side in targets:
        if side == "below":  # the upper bound must fall below the boundary
            width, width_half, gap = hi[-1] - est, hi[0] - stat.mean[0], boundary - est
        else:
            width, width_half, gap = est - lo[-1], stat.mean[0] - lo[0], est - boundary
        needs.append(pairs_needed(n, n_half, float(width), float(width_half), float(gap)))
    if not needs or any(k is None for k in needs):
        return None
    return max(k for k in needs if k is not None)


def mean_stat(
    v: NDArray[np.float64], looks: NDArray[np.int64] | None, s: VerdictSettings
) -> MeanStat:
    """The verdict's sequence for unit means v: tuned to the candidate's horizon."""
    return MeanStat(
        v,
        looks,
        horizon=s.horizon_units,
        sigma_floor=s.latency_sigma_floor,
        alpha=s.alpha,
        planned=s.planned_share,
    )


def _sd(v: NDArray[np.float64]) -> float | None:
    """The sd of the unit values a sequence bets on (what `canary plan` sizes from)."""
    return float(np.std(v, ddof=1)) if len(v) >= 2 else None


def _looks(n: int) -> NDArray[np.int64]:
    return np.array([max(n // 2, 1), n], dtype=np.int64)


def ungate(res: MetricResult, why: str, *, blocks: bool) -> MetricResult:
    """Mark a gating metric as not gating, saying why; diagnostics are returned unchanged."""
    if res.role == "diagnostic":
        return res
    res.status, res.ungated, res.ungated_blocks = "ungated", why, blocks
    res.more_pairs = None
    return res


def empty_result(spec: MetricSpec, reference: str, reason: str) -> MetricResult:
    """A metric with no data (e.g. no temperature-0 pairs): not applicable."""
    return MetricResult(
        name=spec.name,
        label=spec.label,
        role=spec.role,
        harm=spec.harm,
        scale=spec.scale,
        unit=spec.unit,
        reference=reference,
        margin=spec.delta,
        critical_margin=spec.critical,
        goal=spec.goal,
        status="n/a",
        reason=reason,
    )


def _unit_values(
    x: Floats, use: B, ctx: EvalContext
) -> tuple[NDArray[np.float64], NDArray[np.int64], int]:
    """Per-unit means of x (one value per pair in `use`), in closing order; pairs used."""
    return ctx.units.means(x, use)


def _trajectory(
    spec: MetricSpec, make: Callable[[NDArray[np.int64]], Stat], sizes: NDArray[np.int64], a: float
) -> list[list[float | None]]:
    """[pairs, low, high] at up to TRAJECTORY_LOOKS looks spaced evenly over the units."""
    k = len(sizes)
    if k < 2:
        return []
    looks = np.unique(np.linspace(1, k, min(TRAJECTORY_LOOKS, k)).round().astype(np.int64))
    stat = make(looks)
    lo, hi = stat.bounds(a, PLOT_XTOL)
    pairs = np.cumsum(sizes)[looks - 1]
    return [
        [float(p), _fnum(spec.to_natural(float(low))), _fnum(spec.to_natural(float(high)))]
        for p, low, high in zip(pairs, lo, hi, strict=True)
    ]


def _no_units(spec: MetricSpec, ctx: EvalContext, reference: str, n_open: int) -> MetricResult:
    why = "no usable pairs"
    if n_open:
        why = f"no closed unit yet ({n_open:,} pairs wait for their session or timeout to end)"
    return empty_result(spec, reference, why)


def judge_mean(
    spec: MetricSpec,
    x: NDArray[np.float64],
    ctx: EvalContext,
    *,
    use: B,
    reference: str,
    detail: Detail | None = None,
    planned: bool = True,
) -> MetricResult:
    """Judge the mean of an unbounded per-pair statistic; `x` holds the values of `use`.

    `planned=False`: the mixture alone (no share of α on the boundary planned to the horizon),
    for a test whose units are not the horizon's (scored pairs are a share of the sessions).
    """
    v, sizes, n = _unit_values(x, use, ctx)
    if len(v) == 0:
        return _no_units(spec, ctx, reference, len(x))
    s = ctx.settings if planned else msgspec.structs.replace(ctx.settings, planned_share=0.0)

    def make(looks: NDArray[np.int64]) -> MeanStat:
        return mean_stat(v, looks, s)

    detail = {**(detail or {}), "unit_sd": _sd(v)}
    res = _result(spec, make(_looks(len(v))), n, len(v), reference, detail, s.alpha)
    if len(v) >= s.horizon_units and spec.delta is not None:
        # The planned look happens by itself at the planned size: harm beyond δ counts from the
        # horizon on, at every look (STATISTICS.md "Harm shown early": a cold candidate's
        # first minutes do not reject it; a candidate nobody asks about still does).
        dense = make(np.arange(s.horizon_units, len(v) + 1, dtype=np.int64))
        res.p_beyond = _fnum(float(beyond_from(evidence(spec, dense), s.horizon_units)[-1]))
        res.beyond_counts = True
    if ctx.trajectories and spec.role != "diagnostic":
        res.trajectory = _trajectory(spec, make, sizes, s.alpha)
    return res


def indicator_difference(worse: B, better: B) -> NDArray[np.float32]:
    """1{worse} - 1{better} per pair: -1, 0 or 1, exact in float32 (a quarter of the memory of
    widening both indicators to float64, at ten million pairs 240 MB less)."""
    d = worse.astype(np.float32)
    d -= better
    return d


def judge_bounded(
    spec: MetricSpec,
    d: Floats,
    ctx: EvalContext,
    *,
    use: B,
    reference: str,
    detail: Detail | None = None,
) -> MetricResult:
    """Judge the mean of a per-pair statistic in [-1, 1]; `d` holds the values of `use`."""
    v, sizes, _ = _unit_values(d, use, ctx)
    if len(v) == 0:
        return _no_units(spec, ctx, reference, len(d))
    used = d[ctx.units.rank[use] >= 0]
    detail = {
        **(detail or {}),
        "discordant_share": float(np.count_nonzero(used) / len(used)) if len(used) else None,
    }
    return judge_bounded_units(
        spec,
        v,
        sizes,
        alpha=ctx.settings.alpha,
        reference=reference,
        detail=detail,
        trajectories=ctx.trajectories,
    )


def judge_bounded_units(
    spec: MetricSpec,
    v: NDArray[np.float64],
    sizes: NDArray[np.int64],
    *,
    alpha: float,
    reference: str,
    detail: Detail | None = None,
    trajectories: bool = True,
) -> MetricResult:
    """Judge the mean of unit values `v` in [-1, 1] (closed units in closing order, `sizes`
    pairs each): for a statistic whose units are not the PairSet's (the grader's verdicts,
    evaluators.metrics.preference). `v` must not be empty."""

    def make(looks: NDArray[np.int64]) -> BoundedStat:
        return BoundedStat(v, looks)

    n = int(sizes.sum())
    detail = {**(detail or {}), "unit_sd": _sd(v)}
    res = _result(spec, make(_looks(len(v))), n, len(v), reference, detail, alpha)
    if trajectories and spec.role != "diagnostic":
        res.trajectory = _trajectory(spec, make, sizes, alpha)
    return res
