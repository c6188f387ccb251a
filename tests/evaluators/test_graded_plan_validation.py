"""`canary plan --graded` plans for what it is told (issue 52, item 2): for the sd a user
measures and the net preference they expect, the sessions it states are those by which 95 % of
runs decide. Checked on `preference_world` (a grader written apart from the plan, sessions of 1
to 3 turns, a quarter graded in both orders), through `preference.unit_scores` and the verdict's
rule, looking after every session: the plan is met in 93-97 % of runs at net 0, -3 pp and
-15 pp (1,000 runs at 0 and -15 pp, 200 at -3 pp, whose plan is about 27,000 sessions).
"""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.judge.metric import evidence
from evaluators.judge.preference_plan import decide_units
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import HOLD, STATUSES, decide_arrays
from evaluators.metrics import preference
from evaluators.stats.sequential import BoundedStat
from tests.evaluators import harm_world as hw

S = VerdictSettings()
INSIDE = STATUSES.index("inside")


def met(net: float, runs: int) -> tuple[int, float]:
    """(the plan's sessions, the share of runs decided by them) for a grader planting `net`,
    planned with the sd a pilot of 20 runs measures."""
    sd = float(hw.preference_units(net, 2000, 20, 90_000).std())
    sessions = decide_units(S.preference_delta, S.alpha, sd, net, S.preference_critical)
    assert sessions is not None
    spec = preference.preference_spec(S)
    v = hw.preference_units(net, sessions, runs, 5000)
    ev = evidence(spec, BoundedStat(v, np.arange(1, v.shape[-1] + 1)))
    verdict, status = decide_arrays(
        [spec.role],
        [ev],
        n_pairs=2 * ev.n,
        coverage_ok=True,
        planned=False,
        settings=S,
        early=[True],
    )
    decided = (verdict != HOLD) | (status[0] == INSIDE)
    return sessions, float(decided.any(-1).mean())


@pytest.mark.slow
@pytest.mark.parametrize("net", [0.0, -0.15])
def test_the_graded_plan_is_met_in_95_percent_of_runs(net: float) -> None:
    """At net 0 (promote) and -15 pp (reject), 93-97 % of 1,000 runs decide by the plan."""
    sessions, share = met(net, 1000)
    assert 0.93 <= share <= 0.97, (sessions, share)


@pytest.mark.slow
def test_the_graded_plan_is_met_near_the_margin() -> None:
    """At -3 pp (inside the 5 pp margin, but close), 93-97 % of 200 runs decide by the plan."""
    sessions, share = met(-0.03, 200)
    assert 0.93 <= share <= 0.97, (sessions, share)


def test_clipping_the_simulated_scores_plans_for_a_smaller_sd() -> None:
    """Mutation: the old plan (normal scores clipped to [-1, 1]) at sd 0.9 is really planning
    for about 0.69, the mistake this plan no longer makes."""
    rng = np.random.default_rng(1)
    clipped = np.clip(rng.normal(0.0, 0.9, 100_000), -1.0, 1.0)
    assert abs(float(clipped.std()) - 0.69) < 0.02
    assert decide_units(S.preference_delta, S.alpha, 0.9) > decide_units(
        S.preference_delta, S.alpha, 0.69
    )
