"""Late gradings never change a closed unit of the net preference: the closing rule
(`preference.on_time` and the units it feeds) on hand-made verdicts, the report path's count of
late verdicts, and, in the slow tier, the intervals' coverage under a slow, bursty grader
written apart from the rule (`late_world`), 200 runs, a look every three minutes."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from domain.endpoint import CandidateSpec, GraderSpec
from domain.errors import InvalidSettings
from domain.records import GRADING_OUTCOMES
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import preference
from evaluators.pairs.gradings import COLUMNS, Gradings
from evaluators.pairs.types import PairSet
from evaluators.stats.sequential import BoundedStat
from tests.evaluators import late_world as lw

S = VerdictSettings()
D = S.grading_deadline_s
IDLE = S.session_idle_s
GRADED = GRADING_OUTCOMES.index("graded")


def _gradings(rows: list[tuple[int, float, int, float, float]]) -> Gradings:
    """Verdicts as (pair, pair arrival, session, score, stored at), in pair order."""
    a = np.array(rows, dtype=np.float64)
    n = len(rows)
    return Gradings(
        pair=a[:, 0].astype(np.int64),
        received_at=a[:, 1],
        session=a[:, 2].astype(np.uint64),
        candidate_first=np.ones(n, dtype=bool),
        swapped=np.zeros(n, dtype=bool),
        outcome=np.full(n, GRADED, dtype=np.int8),
        score=a[:, 3],
        candidate_chars=np.full(n, 100, dtype=np.int64),
        reference_chars=np.full(n, 100, dtype=np.int64),
        tokens=np.full(n, 10, dtype=np.int64),
        graded_at=a[:, 4],
    )


def _units(g: Gradings, as_of: float) -> list[float]:
    v, _ = preference.unit_scores(g, by_session=True, as_of=as_of, idle_s=IDLE, deadline_s=D)
    return [float(x) for x in v]


def test_a_session_unit_closes_its_deadline_after_its_idle_gap() -> None:
    """Two turns at 0 s and 5 s: their unit is not used until 5 + idle + deadline, then holds
    both verdicts, the slower one stored 10 minutes after its pair."""
    g = _gradings([(0, 0.0, 1, 1.0, 20.0), (1, 5.0, 1, -1.0, 605.0)])
    close = 5.0 + IDLE + D
    assert _units(g, close - 1.0) == []
    assert _units(g, close) == [0.0]


def test_a_verdict_stored_past_its_deadline_is_late_and_never_used() -> None:
    """A verdict stored after its pair's arrival plus the deadline is late at every look, the
    final one included: the unit a look used keeps its value, and the late one is counted."""
    g = _gradings([(0, 0.0, 1, 1.0, 20.0), (1, 5.0, 1, -1.0, 5.0 + D + 1.0)])
    close = 5.0 + IDLE + D
    used = _units(g, close)
    assert used == [1.0]
    assert _units(g, close + 3600.0) == used == _units(g, math.inf)
    use, late = preference.on_time(g, as_of=math.inf, deadline_s=D)
    assert late == 1 and use.tolist() == [True, False]


def test_a_verdict_not_yet_stored_at_a_look_is_not_used_there() -> None:
    """A look in the past (a replayed report) sees only the verdicts stored by then."""
    g = _gradings([(0, 0.0, 0, 1.0, 400.0)])
    use, late = preference.on_time(g, as_of=300.0, deadline_s=D)
    assert late == 0 and not use.any()
    use, _ = preference.on_time(g, as_of=400.0, deadline_s=D)
    assert use.all()


def test_every_look_uses_a_prefix_of_the_next_looks_units() -> None:
    """On a slow, bursty grader's verdicts, each look's unit values are the first ones of every
    later look's, unchanged: the betting sequence sees one sequence, whatever the looks."""
    g = lw.draw(lw.World(duration_s=1_800.0), np.random.default_rng(3))
    prev: list[float] = []
    for t in np.arange(600.0, 1_800.0 + 2 * D, 60.0):
        now = _units(g, float(t))
        assert now[: len(prev)] == prev
        prev = now
    assert len(prev) > 300


def test_rows_read_without_their_storing_time_are_on_time() -> None:
    """Rows laid out as before `graded_at` was a column (a world's or an older reader's) are
    taken as stored when their pair arrived: nothing is late, nothing waits."""
    assert COLUMNS[-1] == "graded_at"
    row = ("e1", 10.0, "s1", True, False, "graded", "candidate", 5, 5, 1, 1)
    g = Gradings.from_rows([row])
    assert math.isnan(float(g.graded_at[0]))  # type: ignore[index]
    use, late = preference.on_time(g, as_of=11.0, deadline_s=D)
    assert use.all() and late == 0


def _candidate() -> object:
    return CandidateSpec(
        name="upgrade",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:10", model="judge"),
    ).to_endpoint()


def test_the_report_counts_late_verdicts_and_stops_gating_past_the_missing_share() -> None:
    """Through `preference()`: the late verdicts are counted in the detail with the deadline;
    with 15 % of them late (past grading_failure_max) preference stops gating and says why."""
    g = lw.draw(lw.World(duration_s=1_800.0), np.random.default_rng(5))
    cand = _candidate()
    ctx = EvalContext(pairs=PairSet.empty(0), settings=S, candidate=cand, gradings=g)  # type: ignore[arg-type]
    res = preference.preference(ctx)[0]
    late = int(np.count_nonzero(g.graded_at - g.received_at > D))  # type: ignore[operator]
    assert res.detail["gradings_late"] == late and res.detail["grading_deadline_s"] == D
    assert res.status != "ungated"
    slow = np.random.default_rng(6).random(g.n) < 0.15
    stored = np.where(slow, g.received_at + D + 60.0, g.graded_at)  # type: ignore[arg-type]
    g = replace(g, graded_at=stored)
    ctx = EvalContext(pairs=PairSet.empty(0), settings=S, candidate=cand, gradings=g)  # type: ignore[arg-type]
    res = preference.preference(ctx)[0]
    assert res.status == "ungated" and res.ungated_blocks and "late" in res.ungated


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_deadline_that_is_not_positive_is_refused_by_name(value: float) -> None:
    """`grading_deadline_s` must be > 0: a bad value names the setting."""
    with pytest.raises(InvalidSettings, match="grading_deadline_s"):
        S.with_overrides({"grading_deadline_s": value})


RUNS = 200
LOOK_EVERY_S = 180.0


@pytest.mark.slow
def test_intervals_keep_their_coverage_under_a_slow_bursty_grader() -> None:
    """200 runs of 90 minutes of a grader that answers losses six times slower, goes down for
    minutes at a time and catches up in bursts, with stragglers: at every look (each three
    minutes, then the final one) the net preference's always-valid bounds at α hold the
    planted value in all but α + 1 pp of runs on each side, and every look's units are a
    prefix of the next look's."""
    w = lw.World()
    miss_low = miss_high = 0
    late = 0.0
    for r in range(RUNS):
        g = lw.draw(w, np.random.default_rng(10_000 + r))
        late += float(np.mean(g.graded_at - g.received_at > D))  # type: ignore[operator]
        low_missed = high_missed = False
        prev = np.zeros(0)
        looks = [*np.arange(600.0, w.duration_s + IDLE + D + LOOK_EVERY_S, LOOK_EVERY_S)]
        for t in [*looks, math.inf]:
            v, _ = preference.unit_scores(
                g, by_session=True, as_of=float(t), idle_s=IDLE, deadline_s=D
            )
            assert np.array_equal(v[: len(prev)], prev), (r, t)
            prev = v
            if len(v) < 2:
                continue
            lo, hi = BoundedStat(v, np.array([len(v)])).bounds(S.alpha)
            low_missed |= bool(lo[-1] > w.net)
            high_missed |= bool(hi[-1] < w.net)
        miss_low += low_missed
        miss_high += high_missed
    print(f"late share {late / RUNS:.2%}; misses low {miss_low}/{RUNS}, high {miss_high}/{RUNS}")
    assert miss_low / RUNS <= S.alpha + 0.01 and miss_high / RUNS <= S.alpha + 0.01
