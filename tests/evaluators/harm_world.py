"""Runs for issue 52's "harm shown early" rows, written apart from the verdict they check.

Three kinds of evidence, each driven through the product's metric code for its unit values and
through `evaluators.judge.metric.evidence` and `verdict.decide_arrays` for the decision, looking
after every unit (the densest looking a report can do):

* net preference from `preference_world`'s grader, by `preference.unit_scores`;
* tool-call validity from `tool_world`'s sessions, by the `tool_validity` metric's own units;
* latency log-ratios of sessions with heavy tails (each arm's log TTFT is a t with 3 degrees of
  freedom plus a per-session effect, 1 to 6 turns a session), drawn here, for the mean sequence.

Nothing here decides: every reject comes from `decide_arrays` with `early` as a report passes it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

import evaluators.metrics.toolcalls as toolcalls_module
from evaluators.judge.metric import (
    EvalContext,
    Evidence,
    MetricSpec,
    beyond_from,
    evidence,
    mean_stat,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import REJECT, decide_arrays, weights_of
from evaluators.metrics import preference as preference_module
from evaluators.metrics import toolcalls
from evaluators.pairs.types import PairSet
from evaluators.stats.sequential import BoundedStat
from tests.evaluators import preference_world as pw
from tests.evaluators import tool_world as tw

F = NDArray[np.float64]


def preference_units(net: float, sessions: int, runs: int, seed: int) -> F:
    """(runs, units) net-preference unit values of `runs` draws of the world's grader."""
    grader = pw.Grader.planting(net)
    out = []
    for i in range(runs):
        g = pw.draw(grader, sessions, np.random.default_rng(seed + i))
        v, _ = preference_module.unit_scores(g, by_session=True)
        out.append(v)
    return pw.stack(out)


def tool_units_of(ps: PairSet) -> F:
    """Tool-validity unit values of one PairSet: the metric's own per-pair differences averaged
    over its own session units (captured as it passes them to `judge_bounded`)."""
    out: list[F] = []
    real = toolcalls_module.judge_bounded

    def capture(spec, d, ctx, *, use, reference, detail=None):  # type: ignore[no-untyped-def]
        out.append(ctx.units.means(d, use)[0])
        return real(spec, d, ctx, use=use, reference=reference, detail=detail)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(toolcalls_module, "judge_bounded", capture)
        ctx = EvalContext(
            pairs=ps, settings=VerdictSettings(), candidate=tw.CAND, trajectories=False
        )
        toolcalls.tool_validity(ctx)
    return out[0]


def tool_units(world: tw.World, sessions: int, runs: int, seed: int) -> F:
    """(runs, units) tool-validity unit values of `runs` draws of the world."""
    return pw.stack(
        [
            tool_units_of(tw.draw(world, sessions, np.random.default_rng(seed + i)))
            for i in range(runs)
        ]
    )


def tool_switch(
    before: tw.World, after: tw.World, switch: int, sessions: int, seed: int
) -> PairSet:
    """One run whose candidate behaves as in `before` for its first `switch` sessions and as in
    `after` from then on (the same draw otherwise: `tool_world` draws its structure first)."""
    ps = tw.draw(after, sessions, np.random.default_rng(seed))
    early = tw.draw(before, sessions, np.random.default_rng(seed))
    k = int(tw.session_ends(ps)[switch - 1])
    ps.candidate.tool_check[:k] = early.candidate.tool_check[:k]
    return ps


def latency_units(
    ratio: float, sessions: int, runs: int, seed: int, *, session_sd: float = 0.3
) -> F:
    """(runs, sessions) session means of log(candidate / reference TTFT): each arm's log TTFT
    is its session's effect plus 0.5 × a t(3) draw per turn, the candidate's shifted by
    log(ratio), so the mean over sessions is exactly log(ratio)."""
    rng = np.random.default_rng(seed)
    turns = rng.integers(1, 7, (runs, sessions))
    biggest = int(turns.max())
    keep = np.arange(biggest) < turns[..., None]

    def arm(shift: float) -> F:
        session = rng.normal(0.0, session_sd, (runs, sessions, 1))
        return shift + session + 0.5 * rng.standard_t(3, (runs, sessions, biggest))

    d = arm(math.log(ratio)) - arm(0.0)
    return np.where(keep, d, 0.0).sum(-1) / turns


def extra_metrics(ev: Evidence, k: int) -> list[Evidence]:
    """`k` more gating metrics showing nothing (p = 1): Holm's price for a report's others."""
    one = np.ones_like(ev.p_beyond)
    return [Evidence(ev.n, one, one, one, one)] * k


def first_reject(
    spec: MetricSpec,
    ev: Evidence,
    early: NDArray[np.bool_] | bool,
    s: VerdictSettings,
    *,
    others: int = 0,
) -> NDArray[np.float64]:
    """Units at each run's first reject by the product's rule (inf: never)."""
    evs = [ev, *extra_metrics(ev, others)]
    roles = [spec.role] + ["critical"] * others
    e = np.broadcast_to(np.asarray(early), ev.n.shape)
    early_k = np.stack([e] + [np.ones_like(e)] * others)
    names = [spec.name] + [f"other_{i}" for i in range(others)]
    verdict, _ = decide_arrays(
        roles,
        evs,
        n_pairs=ev.n,
        coverage_ok=True,
        planned=False,
        settings=s,
        early=early_k,
        weights=weights_of(names, s),
    )
    return first_true(verdict == REJECT, ev.n)


def first_true(hit: NDArray[np.bool_], n: F) -> F:
    """n at the first True along the last axis (inf where none)."""
    any_hit = hit.any(-1)
    idx = hit.argmax(-1)
    return np.where(any_hit, np.take_along_axis(n, idx[..., None], -1)[..., 0], np.inf)


def bounded_evidence(spec: MetricSpec, v: F) -> tuple[Evidence, F]:
    """(latched evidence, the current look's p beyond δ) after every unit."""
    stat = BoundedStat(v, np.arange(1, v.shape[-1] + 1, dtype=np.int64))
    (bound, side), *_ = spec.harm_bounds(spec.delta or 0.0)
    return evidence(spec, stat), stat.p(bound, side)


def mean_evidence(spec: MetricSpec, v: F, s: VerdictSettings) -> Evidence:
    """A mean sequence's evidence after every unit, p_beyond as a report counts it from the
    horizon on (`beyond_from`)."""
    ev = evidence(spec, mean_stat(v, np.arange(1, v.shape[-1] + 1, dtype=np.int64), s))
    due = beyond_from(ev, s.horizon_units)
    return ev._replace(p_beyond=np.where(ev.n >= s.horizon_units, due, ev.p_beyond))
