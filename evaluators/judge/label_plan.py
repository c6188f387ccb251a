"""Sizing people's check of a graded candidate (`canary plan --graded --labels`): the labels
by which 95 % of runs decide at a margin, from people's labels alone and prediction-powered
(`evaluators.human`), and the factor the grader saves at a measured or assumed agreement.

The runs are the verdict's own sequences and rule (`human_verdicts`, which the validation
tests run too): a unit's people's score y is drawn from {-1, 0, 1} with the net preference
expected (`effect`) and sd `sd`; the grader's verdict f copies it with the probability that
makes P(f = y) = `agreement`, else it is an independent draw of the same shares (a grader that
agrees only by chance is worth nothing). Units are chosen for people with probability `rate`.
Never imports the CLI; pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluators.human.estimate import HumanOnlyStat, PPIStat
from evaluators.judge.metric import Evidence
from evaluators.judge.plan import QUANTILE
from evaluators.judge.preference_plan import PREFERENCE_SD, max_sd
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import HOLD, PROMOTE, REJECT, decide_arrays

__all__ = [
    "LabelPlan",
    "decide",
    "draw",
    "human_verdicts",
    "label_plan",
]

F = NDArray[np.float64]
B = NDArray[np.bool_]
I8 = NDArray[np.int8]
# Seeded runs behind a label plan, and the most labels it looks for (a 5 pp margin at a
# 10 pp loss needs about 4,000 from people alone).
_RUNS = 200
_MAX_LABELS = 32_768
# Runs whose width is measured for the width factor (each bound is found by root finding).
_WIDTH_RUNS = 41


@dataclass(frozen=True, slots=True)
class LabelPlan:
    """Labels a decision on people's preference needs at a margin, two ways."""

    margin: float
    effect: float  # people's expected net preference
    agreement: float  # P(the grader's verdict = the person's label)
    rate: float  # share of graded units chosen for people
    human_labels: int | None  # labels alone: by which QUANTILE of runs decide (None: > max)
    ppi_labels: int | None  # prediction-powered
    graded_units: int | None  # graded units behind ppi_labels (ppi_labels / rate)
    label_factor: float | None  # human_labels / ppi_labels
    width_factor: float | None  # median human-only width / PPI width at ppi_labels labels


def decide(ev: Evidence, s: VerdictSettings) -> I8:
    """Verdict codes of people's preference gating alone (one critical metric, harm shown
    early as for every betting sequence), by the verdict's own rule."""
    verdict, _ = decide_arrays(
        ["critical"],
        [ev],
        n_pairs=math.inf,
        coverage_ok=True,
        planned=False,
        settings=s,
        early=[True],
    )
    return verdict


def human_verdicts(
    f: F,
    chosen: B,
    y_low: F,
    y_high: F,
    fit: B,
    labels: F,
    skips: F,
    rate: float,
    s: VerdictSettings,
) -> tuple[I8, F]:
    """(verdict code, labels) at every prefix of units (runs on leading axes, units last) of
    a candidate gating on people: the PPI sequence's evidence, held below `min_labels` labels
    and past `label_skip_max` skipped. `labels`/`skips`: per unit, pairs labelled/skipped."""
    n = f.shape[-1]
    stat = PPIStat.of(f, chosen, y_low, y_high, fit, rate, np.arange(1, n + 1))
    verdict = decide(stat.evidence(s.preference_delta, s.preference_critical), s)
    lab = np.cumsum(labels, axis=-1)
    skp = np.cumsum(skips, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(lab + skp > 0, skp / (lab + skp), 0.0)
    hold = (lab < s.min_labels) | (share > s.label_skip_max)
    return np.where(hold, np.int8(HOLD), verdict).astype(np.int8), lab.astype(np.float64)


def draw(
    rng: np.random.Generator, shape: tuple[int, ...], effect: float, sd: float, agreement: float
) -> tuple[F, F]:
    """(y, f) per unit: people's score with mean `effect` and sd `sd` on {-1, 0, 1}, and the
    grader's verdict agreeing with it with probability `agreement`."""
    if not 0.0 < sd <= max_sd(effect) + 1e-12:
        raise ValueError(f"sd {sd} is not possible for a mean {effect} in [-1, 1]")
    second = sd * sd + effect * effect
    up, down = (second + effect) / 2.0, (second - effect) / 2.0
    tie = 1.0 - up - down
    chance = up * up + down * down + tie * tie
    copy = float(np.clip((agreement - chance) / (1.0 - chance), 0.0, 1.0)) if chance < 1 else 1.0

    def one() -> F:
        u = rng.random(shape)
        return np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))

    y = one()
    f = np.where(rng.random(shape) < copy, y, one())
    return y, f


def _first(verdict: I8) -> F:
    decided = verdict != HOLD
    return np.where(decided.any(axis=-1), np.argmax(decided, axis=-1) + 1, np.inf).astype(
        np.float64
    )


def _quantile(x: F) -> int | None:
    k = min(len(x) - 1, math.ceil(QUANTILE * len(x)) - 1)
    q = float(np.sort(x)[k])
    return math.ceil(q) if math.isfinite(q) else None


def _human_times(rng: np.random.Generator, n: int, effect: float, sd: float, ppu: float,
                 s: VerdictSettings) -> F:  # fmt: skip
    """Labels (units x ppu) at which each run of people's labels alone first decides."""
    y, _ = draw(rng, (_RUNS, n), effect, sd, 1.0)
    stat = HumanOnlyStat.of(y, y, np.arange(1, n + 1))
    verdict = decide(stat.evidence(s.preference_delta, s.preference_critical), s)
    verdict = np.where(np.arange(1, n + 1) * ppu < s.min_labels, np.int8(HOLD), verdict)
    return _first(verdict.astype(np.int8)) * ppu


def _ppi_times(rng: np.random.Generator, n_labels: int, effect: float, sd: float,
               agreement: float, rate: float, ppu: float, s: VerdictSettings) -> F:  # fmt: skip
    """Labels at which each prediction-powered run first decides (n_labels: chosen units)."""
    units = math.ceil(n_labels / rate)
    out = np.full(_RUNS, np.inf)
    for lo in range(0, _RUNS, 50):
        k = min(50, _RUNS - lo)
        y, f = draw(rng, (k, units), effect, sd, agreement)
        chosen = rng.random((k, units)) < rate
        verdict, labels = human_verdicts(
            f, chosen, y, y, chosen, np.where(chosen, ppu, 0.0), np.zeros((k, units)), rate, s
        )
        t = _first(verdict)
        idx = np.minimum(np.nan_to_num(t, posinf=units).astype(np.int64), units) - 1
        at = np.take_along_axis(labels, idx[:, None], axis=-1)[:, 0]
        out[lo : lo + k] = np.where(np.isfinite(t), at, np.inf)
    return out


def _grow(times: F, needed: int) -> bool:
    return bool(np.mean(np.isfinite(times)) >= 0.97) or needed >= _MAX_LABELS


def _widths(rng: np.random.Generator, labels: int, effect: float, sd: float, agreement: float,
            rate: float, alpha: float) -> float | None:  # fmt: skip
    """Median human-only width / median PPI width at `labels` labels."""
    units = math.ceil(labels / rate)
    wh, wp = [], []
    for _ in range(_WIDTH_RUNS):
        y, f = draw(rng, (units,), effect, sd, agreement)
        chosen = rng.random(units) < rate
        lo, hi = PPIStat.of(f, chosen, y, y, chosen, rate).bounds(alpha)
        wp.append(hi - lo)
        yl = y[chosen]
        lo, hi = HumanOnlyStat.of(yl, yl).bounds(alpha)
        wh.append(hi - lo)
    p = float(np.median(wp))
    return float(np.median(wh)) / p if p > 0 else None


def label_plan(
    margins: tuple[float, ...],
    *,
    settings: VerdictSettings,
    effect: float,
    agreement: float,
    rate: float,
    sd: float = PREFERENCE_SD,
    pairs_per_unit: float = 1.0,
    seed: int = 23,
) -> list[LabelPlan]:
    """For each margin: labels by which QUANTILE of the runs decide from labels alone and
    prediction-powered, at people's net preference `effect` and the grader's `agreement`.
    `sd`: of a unit's people's score (a session's mean; measured from the candidate's labels
    when it has some); `pairs_per_unit`: labels a chosen unit costs (its graded pairs)."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"label rate {rate} is not in (0, 1]")
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement {agreement} is not in [0, 1]")
    sd = min(sd, max_sd(effect))
    out = []
    for m in margins:
        s = settings.with_overrides(
            {"preference_delta": m, "preference_critical": max(m, settings.preference_critical)}
        )
        found: list[int | None] = []
        for sim in ("human", "ppi"):
            n = 256
            while True:
                rng = np.random.default_rng(seed)
                if sim == "human":
                    times = _human_times(rng, n, effect, sd, pairs_per_unit, s)
                else:
                    times = _ppi_times(rng, n, effect, sd, agreement, rate, pairs_per_unit, s)
                if _grow(times, n):
                    break
                n *= 2
            found.append(_quantile(times))
        human, ppi = found  # in labels
        factor = human / ppi if human and ppi else None
        units = None if ppi is None else math.ceil(ppi / pairs_per_unit)
        width = (
            _widths(np.random.default_rng(seed + 1), units, effect, sd, agreement, rate, s.alpha)
            if units
            else None
        )
        out.append(
            LabelPlan(
                margin=m,
                effect=effect,
                agreement=agreement,
                rate=rate,
                human_labels=human,
                ppi_labels=ppi,
                graded_units=math.ceil(units / rate) if units else None,
                label_factor=factor,
                width_factor=width,
            )
        )
    return out


__all__ += ["PROMOTE", "REJECT"]
