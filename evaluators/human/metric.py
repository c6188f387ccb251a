"""People's net preference in the report: the prediction-powered estimate (gating with
`preference_source = "human"` from `min_labels` on, else shown beside the grader's), the
human-only and grader-only estimates, the grader's agreement with people and people's with
each other, and the grader's worth in labels (docs/grading.md, "People check the grader").

Units are the grader's preference units (`evaluators.metrics.preference`: session bursts when
sampling by session, closed units in closing order, verdicts on time). A unit is chosen for
people when any of its pairs was kept for labelling (the grader keeps whole units, by hash).
A look uses the units before the **labelled-through point**: the first chosen unit with a
kept pair nobody has labelled or skipped yet, so labelling lag never makes the labelled set
a non-random one. Pure: no IO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluators.human.agreement import CATEGORIES, cohen_kappa, confusion
from evaluators.human.data import HumanLabels
from evaluators.human.estimate import HumanOnlyStat, PPIStat, fixed_ppi, worth
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    ungate,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.preference import NAME as GRADER_NAME
from evaluators.metrics.preference import _units, on_time, pair_scores
from evaluators.pairs.gradings import Gradings
from evaluators.stats.sequential import BoundedStat

__all__ = ["NAME", "UnitTable", "human_preference", "source", "unit_table"]

NAME = "human_preference"
F = NDArray[np.float64]
B = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class UnitTable:
    """Per closed graded unit, in closing order, and per graded pair the person's view."""

    f: F  # the grader's unit score
    chosen: B  # a pair of it was kept for people
    y_low: F  # people's unit score, skipped pairs as -1 (chosen, complete units)
    y_high: F  # ... skipped pairs as +1
    fit: B  # chosen, complete and nothing skipped: λ may learn from it
    through: int  # units before the labelled-through point
    labels: int  # labelled pairs (not skipped) in those units
    skips: int  # skipped pairs in those units
    waiting: int  # kept pairs of closed units still waiting for a label
    pair_f: F  # per graded pair used: the grader's score
    pair_y: F  # per graded pair used: people's first label (NaN: none, or skipped)


def unit_table(g: Gradings, hl: HumanLabels, s: VerdictSettings, *, by_session: bool,
               as_of: float) -> UnitTable:  # fmt: skip
    """The units the estimate bets on, from the gradings and the labels."""
    use, _ = on_time(g, as_of=as_of, deadline_s=s.grading_deadline_s)
    ps = pair_scores(g, use)
    ok = ps.graded
    units = _units(
        ps, by_session=by_session, as_of=as_of, idle_s=s.session_idle_s,
        deadline_s=s.grading_deadline_s,
    )  # fmt: skip
    kept, done, first = hl.first(g.pairs)
    rank = units.rank
    k = units.count
    closed = rank >= 0
    f_pair = ps.score[ok]
    kept_g, done_g, y_g = kept[ok], done[ok], first[ok]
    r = rank[closed].astype(np.intp)

    def per_unit(x: NDArray[np.float64] | B) -> F:
        w = np.asarray(x, dtype=np.float64)[closed]
        return np.asarray(np.bincount(r, weights=w, minlength=k), dtype=np.float64)

    size = per_unit(np.ones(len(f_pair)))
    f = per_unit(f_pair) / np.maximum(size, 1.0)
    n_kept = per_unit(kept_g)
    n_done = per_unit(kept_g & done_g)
    labelled = kept_g & done_g & np.isfinite(y_g)
    n_lab = per_unit(labelled)
    n_skip = n_done - n_lab
    sum_y = per_unit(np.where(labelled, y_g, 0.0))
    chosen = n_kept > 0
    complete = chosen & (n_done >= n_kept)
    denom = np.maximum(n_kept, 1.0)
    y_low = np.where(complete, (sum_y - n_skip) / denom, np.nan)
    y_high = np.where(complete, (sum_y + n_skip) / denom, np.nan)
    open_ = np.flatnonzero(chosen & ~complete)
    through = int(open_[0]) if len(open_) else k
    inside = np.arange(k) < through
    return UnitTable(
        f=f,
        chosen=chosen,
        y_low=y_low,
        y_high=y_high,
        fit=complete & (n_skip == 0),
        through=through,
        labels=int(n_lab[inside].sum()),
        skips=int(n_skip[inside].sum()),
        waiting=int((n_kept - n_done).sum()),
        pair_f=f_pair,
        pair_y=np.where(kept_g & done_g, y_g, np.nan),
    )


def human_spec(s: VerdictSettings) -> MetricSpec:
    """People's net preference: the grader's margins, gating only with source "human"."""
    gates = s.preference_source == "human"
    return MetricSpec(
        name=NAME,
        label="net preference (people, prediction-powered)",
        role="critical" if gates else "diagnostic",
        harm="lower",
        scale="difference",
        delta=s.preference_delta,
        critical=s.preference_critical,
        unit="rate",
    )


def _fnum(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _agreement(t: UnitTable, hl: HumanLabels, pairs: int) -> Detail:
    m = confusion(t.pair_f, t.pair_y)
    kappa, po, n = cohen_kappa(m)
    out: Detail = {"agreement_n": n, "agreement_share": _fnum(po), "kappa": _fnum(kappa)}
    for i, gi in enumerate(CATEGORIES):
        for j, pj in enumerate(CATEGORIES):
            out[f"confusion_grader_{gi}_people_{pj}"] = int(m[i, j])
    a, b = hl.doubles(pairs)
    pk, ppo, pn = cohen_kappa(confusion(a, b))
    out.update(people_n=pn, people_agreement_share=_fnum(ppo), people_kappa=_fnum(pk))
    return out


def _interval(stat: PPIStat | HumanOnlyStat, alpha: float) -> tuple[float | None, float | None]:
    lo, hi = stat.bounds(alpha)
    return _fnum(lo), _fnum(hi)


def human_preference(ctx: EvalContext) -> list[MetricResult]:
    """People's estimate (gating or beside the grader's), with its companions in `detail`;
    nothing for a candidate without labels and not gating on people."""
    s = ctx.settings
    g, hl = ctx.gradings, ctx.labels
    spec = human_spec(s)
    gates = spec.role == "critical" and ctx.candidate.grader is not None
    if hl is None or g is None or g.n == 0 or (hl.n == 0 and len(hl.kept) == 0):
        if not gates:
            return []
        return [ungate(empty_result(spec, "production", ""), "no pair labelled yet", blocks=True)]
    by_session = bool(ctx.candidate.sampling == "session" or np.any(g.session))
    as_of = math.inf if ctx.as_of is None or ctx.planned_look else ctx.as_of
    t = unit_table(g, hl, s, by_session=by_session, as_of=as_of)
    k = t.through
    res = empty_result(spec, "production", "")
    detail: Detail = {
        "label_rate": hl.rate,
        "graded_units": len(t.f),
        "labelled_through_units": k,
        "chosen_units": int(np.count_nonzero(t.chosen[:k])),
        "labels": t.labels,
        "label_skips": t.skips,
        "label_skip_share": _fnum(t.skips / (t.labels + t.skips)) if t.labels + t.skips else None,
        "labels_waiting": t.waiting,
        "min_labels": s.min_labels,
        "preference_source": s.preference_source,
    }
    detail.update(_agreement(t, hl, g.pairs))
    if len(t.f) >= 2:
        glo, ghi = BoundedStat(t.f).bounds(s.alpha)
        detail.update(
            grader_estimate=float(np.mean(t.f)),
            grader_low=_fnum(float(glo[-1])),
            grader_high=_fnum(float(ghi[-1])),
            grader_units=len(t.f),
        )
    sel = t.chosen[:k]
    lab = sel & t.fit[:k]
    y_lo, y_hi = t.y_low[:k][sel], t.y_high[:k][sel]
    if len(y_lo) >= 2:
        h = HumanOnlyStat.of(y_lo, y_hi)
        lo, hi = _interval(h, s.alpha)
        detail.update(
            human_estimate=float(np.mean((y_lo + y_hi) / 2.0)), human_low=lo, human_high=hi
        )
    y_fit, f_fit = t.y_low[:k][lab], t.f[:k][lab]
    est, lam = fixed_ppi(y_fit, f_fit, t.f[:k]) if len(y_fit) else (math.nan, 0.0)
    w = worth(y_fit, f_fit, t.f[:k], lam)
    detail.update(ppi_lambda=lam, effective_labels=_fnum(w[0]) if w else None,
                  grader_worth_labels=_fnum(w[1]) if w else None)  # fmt: skip
    res.detail, res.n, res.units = detail, t.labels, k
    if hl.rate <= 0.0 or k < 2 or not np.any(sel):
        why = "the grader's label_rate is 0" if hl.rate <= 0 else "no labelled unit yet"
        return [ungate(res, why, blocks=True) if gates else _info(res, why)]
    stat = PPIStat.of(t.f[:k], sel, t.y_low[:k], t.y_high[:k], t.fit[:k], hl.rate)
    ev = stat.evidence(s.preference_delta, s.preference_critical)
    lo, hi = _interval(stat, s.alpha)
    res.estimate, res.ci_low, res.ci_high = _fnum(est), lo, hi
    detail.update(ppi_estimate=_fnum(est), ppi_low=lo, ppi_high=hi)
    if not gates:
        return [_info(res, "")]
    res.p_inside = float(ev.p_inside[-1])
    res.p_beyond = float(ev.p_beyond[-1])
    res.p_critical = float(ev.p_critical[-1])
    res.status, res.beyond_counts = "undecided", True
    share = detail["label_skip_share"]
    if t.labels < s.min_labels:
        ungate(res, f"{t.labels:,} labels of min_labels {s.min_labels:,}: holds until then",
               blocks=True)  # fmt: skip
    elif isinstance(share, float) and share > s.label_skip_max:
        ungate(
            res,
            f"{share:.1%} of the pairs chosen for people were skipped (more than "
            f"label_skip_max {s.label_skip_max:.0%}): the labelled set is no longer random",
            blocks=True,
        )
    return [res]


def _info(res: MetricResult, why: str) -> MetricResult:
    res.status, res.reason = "info", why
    return res


def source(results: list[MetricResult], ctx: EvalContext) -> None:
    """With `preference_source = "human"`, the grader's net preference stops gating (shown,
    deciding nothing): people's estimate gates instead."""
    if ctx.settings.preference_source != "human":
        return
    for r in results:
        if r.name == GRADER_NAME and r.gating and r.status != "ungated":
            ungate(r, "people's preference gates (preference_source = human)", blocks=False)
