"""People gate a graded candidate: 200 runs a case of the world in human_world.py (sessions,
correlated turns, a grader that is biased or honest), a look every 20 labels, decided by the
product's own sequence and rule (`evaluators.judge.label_plan.human_verdicts`) and sized by
`canary plan --graded --labels` (`label_plan`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluators.human.estimate import HumanOnlyStat, PPIStat
from evaluators.judge.label_plan import PROMOTE, REJECT, human_verdicts, label_plan
from evaluators.judge.metric import evidence
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import decide_arrays
from evaluators.metrics.preference import preference_spec
from evaluators.stats.sequential import BoundedStat
from tests.evaluators.human_world import Runs, World, look_prefixes

pytestmark = pytest.mark.slow

RUNS = 200
EVERY = 20
MARGIN = 0.2
S = VerdictSettings().with_overrides(
    {"preference_source": "human", "preference_delta": MARGIN, "min_labels": 50}
)


def _verdicts(r: Runs, rate: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per run: the verdict and the labels at each look (a look every EVERY labels)."""
    verdicts, labels = [], []
    for lo in range(0, r.f.shape[0], 50):
        sl = slice(lo, lo + 50)
        v, lab = human_verdicts(
            r.f[sl], r.chosen[sl], r.y_low[sl], r.y_high[sl], r.fit[sl],
            r.labels[sl], r.skips[sl], rate, S,
        )  # fmt: skip
        for i in range(v.shape[0]):
            run = lo + i
            ends = look_prefixes(r.chosen[run], r.labels[run], EVERY)
            verdicts.append(v[i, ends - 1])
            labels.append(lab[i, ends - 1])
    return verdicts, labels


def _plan(world: World, effect: float):  # type: ignore[no-untyped-def]
    agree, sd, ppu = world.pilot()
    return label_plan(
        (MARGIN,), settings=S, effect=effect, agreement=agree, rate=world.rate, sd=sd,
        pairs_per_unit=ppu,
    )[0]  # fmt: skip


def _sessions(labels: float, world: World) -> int:
    _, _, ppu = world.pilot()
    return math.ceil(labels / (world.rate * ppu))


def test_biased_grader_promotes_alone_and_people_reject_it() -> None:
    world = World(people=-0.30, grader=0.10, copy=0.4)
    plan = _plan(world, -0.30)
    assert plan.ppi_labels is not None
    r = world.runs(RUNS, _sessions(plan.ppi_labels * 1.2, world), seed=1)
    # The grader alone, by the product's preference test: promotes it.
    spec = preference_spec(S)
    ev = evidence(spec, BoundedStat(r.f, np.array([r.f.shape[1]])))
    v, _ = decide_arrays(
        ["critical"], [ev], n_pairs=math.inf, coverage_ok=True, planned=False, settings=S,
        early=[True],
    )  # fmt: skip
    assert np.mean(v == PROMOTE) >= 0.95
    verdicts, labels = _verdicts(r, world.rate)
    promoted = np.mean([np.any(v == PROMOTE) for v in verdicts])
    rejected = np.mean(
        [
            np.any((v == REJECT) & (lab <= plan.ppi_labels))
            for v, lab in zip(verdicts, labels, strict=True)
        ]
    )
    print(
        f"biased: plan {plan.ppi_labels} labels, promoted {promoted:.3f}, rejected {rejected:.3f}"
    )
    assert promoted <= 0.05
    assert rejected >= 0.80


def test_null_at_the_margin_promotes_rarely() -> None:
    world = World(people=-MARGIN, grader=0.0, copy=0.5)
    r = world.runs(RUNS, _sessions(2000, world), seed=2)
    verdicts, _ = _verdicts(r, world.rate)
    looks = sum(len(v) for v in verdicts)
    promoted = np.mean([np.any(v == PROMOTE) for v in verdicts])
    print(f"null at margin: promoted {promoted:.3f} over {looks} looks")
    assert looks >= RUNS * 90  # every look counted: ~100 looks a run
    assert promoted <= 0.05


@pytest.mark.parametrize(("grader", "copy"), [(0.0, 0.66), (0.2, 0.5)], ids=["honest", "biased"])
def test_aa_false_rejects(grader: float, copy: float) -> None:
    world = World(people=0.0, grader=grader, copy=copy)
    r = world.runs(RUNS, _sessions(2000, world), seed=3)
    verdicts, _ = _verdicts(r, world.rate)
    rejected = np.mean([np.any(v == REJECT) for v in verdicts])
    print(f"A/A {grader=}: rejected {rejected:.3f}")
    assert rejected <= 0.05
    if grader == 0.0:  # and the grader's own test, gating as by default
        ev = evidence(preference_spec(S), BoundedStat(r.f, np.arange(1, r.f.shape[1] + 1)))
        v, _ = decide_arrays(
            ["critical"], [ev], n_pairs=math.inf, coverage_ok=True, planned=False,
            settings=S, early=[True],
        )  # fmt: skip
        assert np.mean(np.any(v == REJECT, axis=-1)) <= 0.05


def test_honest_grader_narrows_by_the_planned_factor() -> None:
    world = World(people=-0.1, grader=-0.1, copy=0.66)
    plan = _plan(world, -0.1)
    assert plan.ppi_labels is not None and plan.width_factor is not None
    r = world.runs(RUNS, _sessions(plan.ppi_labels * 1.3, world), seed=4)
    wp, wh = [], []
    for i in range(RUNS):
        lab = np.cumsum(r.labels[i])
        k = int(np.searchsorted(lab, plan.ppi_labels)) + 1
        ch = r.chosen[i, :k]
        lo, hi = PPIStat.of(
            r.f[i, :k], ch, r.y_low[i, :k], r.y_high[i, :k], r.fit[i, :k], world.rate
        ).bounds(S.alpha)
        wp.append(hi - lo)
        lo, hi = HumanOnlyStat.of(r.y_low[i, :k][ch], r.y_high[i, :k][ch]).bounds(S.alpha)
        wh.append(hi - lo)
    ppi, human = float(np.median(wp)), float(np.median(wh))
    measured = human / ppi
    print(f"honest: plan {plan.ppi_labels} labels, width PPI {ppi:.3f} human {human:.3f}, "
          f"factor {measured:.3f} vs planned {plan.width_factor:.3f}")  # fmt: skip
    assert ppi <= human
    assert abs(measured / plan.width_factor - 1.0) <= 0.15
