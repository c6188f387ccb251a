"""What a metric is, what evidence it yields, and how one is judged from per-pair values.

A metric evaluator (see `evaluators.metrics.registry`) turns the PairSet into per-pair values and
calls
`judge_mean` (unbounded, e.g. log-ratios) or `judge_bounded` (in [-1, 1], e.g. paired rate
differences). Both return a `MetricResult` carrying its always-valid p-values at the metric's
margins; `evaluators.judge.verdict` turns those into statuses and the overall verdict.

Scales: a "ratio" metric's statistic is a mean log-ratio (margins are ratios, 1.05); a
"difference" metric's is a mean difference (margins are absolute, 0.001 = 0.1 pp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import msgspec
import numpy as np
from numpy.typing import NDArray

from domain.capture import CapacitySummary
from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.types import PairSet
from evaluators.stats.sequential import BoundedStat, MeanStat, pairs_needed

Role = Literal["critical", "guardrail", "goal", "diagnostic"]
Harm = Literal["higher", "lower", "both"]
Scale = Literal["ratio", "difference"]
Status = Literal[
    "inside", "improved", "undecided", "beyond", "critical", "insufficient", "n/a", "info"
]
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
        return math.exp(value) if self.scale == "ratio" else value

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


def evidence(spec: MetricSpec, stat: Stat) -> Evidence:
    """The p-values of `spec`'s tests from a confidence-sequence statistic."""
    ones = np.ones(stat.mean.shape)
    n = stat.t * ones
    p_inside, p_beyond, p_critical, p_goal = ones, ones, ones, ones
    if spec.delta is not None:
        sides = spec.harm_bounds(spec.delta)
        p_inside = np.maximum.reduce([stat.p(b, _flip(s)) for b, s in sides])
        p_beyond = np.minimum(1.0, len(sides) * np.minimum.reduce([stat.p(b, s) for b, s in sides]))
    if spec.critical is not None:
        sides = spec.harm_bounds(spec.critical)
        p_critical = np.minimum(
            1.0, len(sides) * np.minimum.reduce([stat.p(b, s) for b, s in sides])
        )
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
    # The newest recent `canary capacity` result of the candidate, when there is one (cost).
    capacity: CapacitySummary | None = None
    # Group code per pair when turns of a session are in the sample (computed once).
    session_groups: NDArray[np.int64] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        ps = self.pairs
        if self.candidate.sampling == "session" or np.any(ps.session[: ps.n]):
            object.__setattr__(self, "session_groups", _groups(ps.session[: ps.n]))

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
    spec: MetricSpec, stat: Stat, n: int, reference: str, detail: Detail, alpha: float
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
        detail=detail,
    )
    res.more_pairs = _more_pairs(spec, stat, n, est, lo, hi)
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


def _looks(n: int) -> NDArray[np.int64]:
    return np.array([max(n // 2, 1), n], dtype=np.int64)


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


def judge_mean(
    spec: MetricSpec,
    x: NDArray[np.float64],
    ctx: EvalContext,
    *,
    reference: str,
    detail: Detail | None = None,
    groups: NDArray[np.int64] | None = None,
    tau: float | None = None,
) -> MetricResult:
    """Judge the mean of an unbounded per-pair statistic (time-ordered)."""
    n = len(x)
    if n == 0:
        return empty_result(spec, reference, "no usable pairs")
    s = ctx.settings
    stat = MeanStat(
        x,
        _looks(n),
        tau=tau if tau is not None else s.latency_tau,
        sigma_floor=s.latency_sigma_floor,
        groups=groups,
    )
    return _result(spec, stat, n, reference, detail or {}, s.alpha)


def judge_bounded(
    spec: MetricSpec,
    d: NDArray[np.float64],
    ctx: EvalContext,
    *,
    reference: str,
    detail: Detail | None = None,
) -> MetricResult:
    """Judge the mean of a per-pair statistic in [-1, 1] (time-ordered)."""
    n = len(d)
    if n == 0:
        return empty_result(spec, reference, "no usable pairs")
    stat = BoundedStat(d, _looks(n))
    return _result(spec, stat, n, reference, detail or {}, ctx.settings.alpha)
