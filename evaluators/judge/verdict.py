"""The three-valued decision: promote, hold or reject, with a one-line reason per metric.

Rules (STATISTICS.md), on always-valid p-values so any number of looks stays honest:

* reject — a critical metric is wholly beyond its critical margin δc (any look; at its share
  α w / Σw of α, w its weight: `primary_weight` for the metrics a decision rests on, net
  preference and tool validity, 1 for every other gating metric), or a gating metric is
  wholly beyond δ (Holm's weighted step-down over them at α, the same weights) where
  its harm counts: at any look for the betting sequences (rates, agreement, tool validity,
  preference: exact at every look, their evidence latched), from the horizon on for the mean
  sequences (latency, length, cost: the planned look happens by itself at the planned size),
  and at any planned look. The two share one α: δc lies past δ, so a metric's evidence beyond
  δc is never stronger than beyond δ, and a false reject of either kind needs some metric
  within its margins to show p_beyond <= α w / (the weights within their margins) at some look,
  which Ville's inequality bounds by α in all (STATISTICS.md, "Harm shown early").
* promote — every guardrail wholly inside δ (an intersection–union test: no correction needed),
  the kind's goal improvement shown at α, at least `min_pairs` usable pairs, and coverage of
  sampled copies >= `min_coverage`. Kinds without a goal promote on non-inferiority alone.
* hold — otherwise, naming the undecided metrics and about how many more pairs each needs.

A gating metric that cannot be judged fairly or at all is "ungated" and says why: without a
control, latency (no same-load reference) and agreement (no noise floor); with no usable pair,
any metric. An ungated goal keeps the verdict from promoting (a goal not shown is not met; the
verdict says which and why); any other ungated metric only stops gating, and is named in the
verdict line and the reasons so it never drops out of the verdict unnoticed.

`decide_arrays` is vectorized (metrics on axis 0, then runs/looks) so the simulation tests run
the very rules a report runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import msgspec
import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import Evidence, MetricResult, Role, Status
from evaluators.judge.settings import VerdictSettings
from evaluators.stats.sequential import holm

VerdictName = Literal["promote", "hold", "reject"]
HOLD, PROMOTE, REJECT = 0, 1, 2
VERDICTS: tuple[VerdictName, ...] = ("hold", "promote", "reject")
STATUSES: tuple[Status, ...] = (
    "n/a",
    "info",
    "insufficient",
    "undecided",
    "inside",
    "improved",
    "beyond",
    "critical",
    "ungated",
)
_S = {name: i for i, name in enumerate(STATUSES)}


class Reason(msgspec.Struct, frozen=True):
    """One line of the verdict's explanation."""

    metric: str
    status: str
    reason: str


def decide_arrays(
    roles: Sequence[Role],
    evidence: Sequence[Evidence],
    *,
    n_pairs: NDArray[np.float64] | float,
    coverage_ok: NDArray[np.bool_] | bool,
    planned: NDArray[np.bool_] | bool,
    settings: VerdictSettings,
    early: Sequence[bool] | NDArray[np.bool_] | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[NDArray[np.int8], NDArray[np.int8]]:
    """(verdict codes, status codes per metric) for stacked evidence of K metrics.

    `early`: per metric (axis 0, broadcast over runs/looks), whether its harm beyond δ rejects
    without a planned look (`MetricResult.beyond_counts`); None: only at planned looks.
    `weights`: per metric, its shares of α in the reject test (`weights_of`; None: one each);
    only the guard metrics (critical, guardrail) share it."""
    s = settings
    role = np.array(roles).reshape((len(roles),) + (1,) * np.ndim(evidence[0].n))
    n = np.stack([np.asarray(e.n, dtype=np.float64) for e in evidence])
    shape = np.broadcast_shapes(n.shape, *(np.shape(e.p_inside) for e in evidence))
    n = np.broadcast_to(n, shape)

    def stack(i: int) -> NDArray[np.float64]:
        rows = [np.asarray(e[i], dtype=np.float64) for e in evidence]
        return np.broadcast_to(np.stack(np.broadcast_arrays(*rows)), shape)

    p_inside, p_beyond, p_critical, p_goal = stack(1), stack(2), stack(3), stack(4)
    critical = role == "critical"
    guard = critical | (role == "guardrail")
    goal = role == "goal"
    has = n > 0
    enough = n >= s.min_metric_pairs
    # One α for both ways to reject (module docstring), shared by the guard metrics in
    # proportion to their weights: a metric's critical margin lies past its margin δ, so its
    # p_critical is never below its p_beyond, and a critical hit at α w / Σw is a p_beyond at
    # α w / Σw too, no more than weighted Holm's threshold for it when it is falsely hit.
    is_guard = np.array([r in ("critical", "guardrail") for r in roles])
    w = np.where(is_guard, np.ones(len(roles)) if weights is None else np.asarray(weights), 0.0)
    share = (w / max(float(w.sum()), 1e-300)).reshape(role.shape)
    crit_hit = critical & enough & (p_critical <= s.alpha * share)
    beyond = holm(np.where(guard & enough, p_beyond, 1.0), s.alpha, w) & guard & enough
    inside = guard & enough & (p_inside <= s.alpha)
    improved = goal & enough & (p_goal <= s.alpha)
    counts = np.asarray(planned)
    if early is not None:
        e = np.asarray(early, dtype=bool)
        counts = counts | (e.reshape(role.shape) if e.ndim == 1 else e)
    reject = np.any(crit_hit, axis=0) | np.any(beyond & counts, axis=0)
    guards_ok = np.all(~guard | ~has | inside, axis=0)
    goals_ok = np.all(~goal | improved, axis=0)
    gates = (np.asarray(n_pairs) >= s.min_pairs) & np.asarray(coverage_ok)
    promote = ~reject & guards_ok & goals_ok & gates
    verdict = np.where(reject, REJECT, np.where(promote, PROMOTE, HOLD)).astype(np.int8)
    order: tuple[Status, ...] = (
        "n/a",
        "info",
        "insufficient",
        "critical",
        "beyond",
        "improved",
        "inside",
    )
    conditions = [~has, role == "diagnostic", ~enough, crit_hit, beyond, improved, inside]
    choices = [np.full(shape, _S[name], dtype=np.int8) for name in order]
    status: NDArray[np.int8] = np.select(
        conditions, choices, default=np.int8(_S["undecided"])
    ).astype(np.int8)
    return verdict, status


# The metrics a decision rests on, each given `primary_weight` shares of α in the reject test
# against one for every other gating metric: people's and the grader's net preference (what a
# model upgrade is judged by) and tool-call validity (what an agent's calls are judged by).
PRIMARY_METRICS = frozenset({"preference", "human_preference", "tool_validity"})


def weights_of(names: Sequence[str], settings: VerdictSettings) -> list[float]:
    """Each metric's shares of α in the reject test (weighted Holm, `decide_arrays`)."""
    return [settings.primary_weight if n in PRIMARY_METRICS else 1.0 for n in names]


def _p(value: float | None) -> float:
    return 1.0 if value is None or not math.isfinite(value) else value


def judge(
    results: list[MetricResult],
    *,
    n_pairs: int,
    coverage: float | None,
    planned: bool,
    settings: VerdictSettings,
) -> tuple[VerdictName, list[Reason]]:
    """Set each result's status and reason; return the verdict and its reasons, gates first."""
    s = settings
    for r in results:
        if r.gating and r.status == "n/a" and not r.ungated:
            # Nothing measurable (no such pairs, no closed unit yet): say so, do not gate.
            r.status, r.ungated = "ungated", r.reason or "no data"
            r.ungated_blocks = r.role == "goal"  # a goal not shown is not a goal met
            r.reason = f"not gating: {r.ungated}"
    judged = [r for r in results if r.status == "undecided"]  # the ones judge_* produced
    coverage_ok = coverage is None or coverage >= s.min_coverage
    reasons: list[Reason] = []
    if judged:
        evidence = [
            Evidence(
                np.array(float(r.units if r.units is not None else r.n)),
                np.array(_p(r.p_inside)),
                np.array(_p(r.p_beyond)),
                np.array(_p(r.p_critical)),
                np.array(_p(r.p_goal)),
            )
            for r in judged
        ]
        verdict_code, status = decide_arrays(
            [r.role for r in judged],
            evidence,
            n_pairs=float(n_pairs),
            coverage_ok=coverage_ok,
            planned=planned,
            settings=s,
            early=[r.beyond_counts for r in judged],
            weights=weights_of([r.name for r in judged], s),
        )
        verdict = VERDICTS[int(verdict_code)]
        for r, code in zip(judged, status, strict=True):
            r.status = STATUSES[int(code)]
            if r.status != "undecided":
                r.more_pairs = None  # only an open question has "pairs still needed"
                r.eta_s = None
            r.reason = reason_line(r, s, planned)
    else:
        verdict = "hold"
    blocking = [r for r in results if r.status == "ungated" and r.ungated_blocks]
    if verdict == "promote" and blocking:
        verdict = "hold"
    for r in results:
        if not r.reason:
            r.reason = reason_line(r, s, planned)
    reasons.append(
        Reason(
            "pairs",
            "ok" if n_pairs >= s.min_pairs else "insufficient",
            f"{n_pairs:,} usable pairs (minimum {s.min_pairs:,})",
        )
    )
    reasons.append(
        Reason(
            "coverage",
            "ok" if coverage_ok else "insufficient",
            "unknown (no copy accounting)"
            if coverage is None
            else f"{coverage:.1%} of sampled copies observed (minimum {s.min_coverage:.0%})",
        )
    )
    reasons.extend(Reason(r.name, r.status, r.reason) for r in results if r.gating)
    return verdict, reasons


def fmt(r: MetricResult, value: float | None) -> str:
    """A value in the metric's natural units: ratios as 1.234, rates as signed pp."""
    if value is None or not math.isfinite(value):
        return "–"
    if r.scale == "ratio":
        return f"{value:.3f}"
    if r.unit == "rate":
        return f"{value * 100:+.2f} pp" if abs(value) < 0.1 else f"{value * 100:+.1f} pp"
    if r.unit == "fraction":
        return f"{value:.3f}"
    return f"{value:+.3f}"


def fmt_margin(r: MetricResult, value: float | None) -> str:
    if value is None:
        return "–"
    if r.scale == "ratio":
        return f"{value:g}" if r.harm != "both" else f"[{1 / value:.3g}, {value:g}]"
    if r.unit == "rate":
        return f"{value * 100:g} pp"
    return f"{value:g}"


def reason_line(r: MetricResult, s: VerdictSettings, planned: bool) -> str:
    """One line: the estimate with its interval and n, and what it means for the verdict."""
    if r.status == "n/a":
        return r.reason or "no data"
    if r.status == "ungated" and (r.n == 0 or r.estimate is None):
        return f"not gating: {r.ungated}"
    if r.status == "insufficient":  # no number that would look precise
        return r.reason or f"insufficient data: n={r.n:,} < {s.min_metric_pairs} pairs"
    units = f" ({r.units:,} sessions)" if r.units is not None and r.units < r.n else ""
    head = f"{fmt(r, r.estimate)} [{fmt(r, r.ci_low)}, {fmt(r, r.ci_high)}] n={r.n:,}{units}"
    more = f"; ≈{r.more_pairs:,} more pairs" if r.more_pairs else ""
    if r.more_pairs and r.eta_s is not None:
        more += f" (≈{fmt_duration(r.eta_s)} at the observed pair rate)"
    match r.status:
        case "ungated":
            return f"{head}: not gating: {r.ungated}"
        case "critical":
            return f"{head}: beyond the critical margin {fmt_margin(r, r.critical_margin)}"
        case "beyond":
            if planned or r.beyond_counts:
                when = "rejects"
            else:
                when = f"would reject from {s.horizon_units:,} units (the planned size) on"
            return f"{head}: beyond the margin {fmt_margin(r, r.margin)}; {when}"
        case "inside":
            return f"{head}: within the margin {fmt_margin(r, r.margin)}"
        case "improved":
            return f"{head}: improvement shown (goal < {fmt_margin(r, r.goal)})"
        case "undecided" if r.role == "goal":
            return f"{head}: improvement not shown yet (goal < {fmt_margin(r, r.goal)}){more}"
        case "undecided":
            if r.more_pairs is None:
                return f"{head}: undecided vs {fmt_margin(r, r.margin)}; estimate at/past it"
            return f"{head}: undecided vs {fmt_margin(r, r.margin)}{more}"
    return head


def fmt_duration(seconds: float) -> str:
    """A duration as 45 s, 12 min, 3.5 h or 2.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def summary(verdict: VerdictName, results: list[MetricResult], reasons: list[Reason]) -> str:
    """The verdict in one sentence."""
    if verdict == "reject":
        bad = [r.label for r in results if r.status in ("critical", "beyond") and r.gating]
        return "reject: harm shown on " + ", ".join(bad)
    if verdict == "promote":
        line = "promote: every guardrail within its margin" + (
            ", goal shown" if any(r.role == "goal" for r in results) else ""
        )
        ungated = [r.label for r in results if r.status == "ungated" and r.n]
        if ungated:
            line += "; not gating (see below): " + ", ".join(ungated)
        return line
    parts = [f"{g.metric} {g.status}" for g in reasons[:2] if g.status != "ok"]
    for r in results:
        if r.gating and r.status in ("undecided", "insufficient", "beyond"):
            more = f" (≈{r.more_pairs:,} more pairs" if r.more_pairs else ""
            if more and r.eta_s is not None:
                more += f", ≈{fmt_duration(r.eta_s)}"
            parts.append(f"{r.label} {r.status}{more}{')' if more else ''}")
    blocked = [r.label for r in results if r.status == "ungated" and r.ungated_blocks]
    if blocked:
        parts.append(
            "cannot promote without a fair reference for " + ", ".join(blocked) + " (see below)"
        )
    return "hold: " + ("; ".join(parts) if parts else "nothing decided yet")
