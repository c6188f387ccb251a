"""Deciding as fast as the evidence allows: sequences tuned to the horizon, plans that agree.

* The latency sequence tuned to a horizon N is at most 1.6x as wide as a fixed-sample interval
  at N, whatever the noise (at most 1.35x with the default share of α on the boundary planned
  to N; within 1.6x on Student-t(3) data too), and keeps its error bound at every look for any
  horizon.
* On the independent world (`tests.evaluators.world.PLANNED`: simulator-like noise, and real
  engines' noise — per-arm log SD 0.8, Student-t tails, three-turn sessions), a plan made the
  operator's way (`canary plan --candidate` on a 100-session pilot) states sessions by which the
  verdict, looking every 20 pairs, decides right; and they are not more than 1.5x the sessions
  it needed. A/A rows neither promote nor reject.
* Broken on purpose: the latency sequences tuned in absolute units as before (for ~9,000 units
  at real engines' noise) make the real-noise bi-kv row miss its plan.

CI runs few runs per row (a bound of 5 % then allows one bad run of RUNS, which only catches
gross breakage); `bench/horizon.py` runs many (bench/RESULTS.md, "Decide as fast as the
evidence allows").
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

import evaluators.judge.metric as metric_module
from bench._shared import world
from evaluators.judge import plan
from evaluators.judge.settings import VerdictSettings
from evaluators.stats.sequential import BoundedStat, MeanStat

ALPHA = 0.05
RUNS = 3


# The verdict's default (a share of alpha on the boundary planned to the horizon) and the
# mixture alone (planned = 0), with the most each may cost at the horizon.
DESIGNS = [(VerdictSettings().planned_share, 1.35), (0.0, 1.6)]


@pytest.mark.parametrize("sd", [0.14, 0.5, 1.1])
@pytest.mark.parametrize("horizon", [100, 400, 2000])
@pytest.mark.parametrize(("planned", "most"), DESIGNS)
def test_width_at_the_horizon_is_within_1_6x_of_fixed_sample(
    sd: float, horizon: int, planned: float, most: float
) -> None:
    """Half-width at N of the sequence tuned to N over z(1-α) σ̂ / √N, mean over 100 runs."""
    rng = np.random.default_rng(horizon)
    x = rng.normal(0.0, sd, (100, horizon))
    st = MeanStat(
        x, np.array([horizon]), horizon=horizon, sigma_floor=0.01, alpha=ALPHA, planned=planned
    )
    lo, hi = st.bounds(ALPHA)
    fixed = stats.norm.isf(ALPHA) * np.sqrt(st.var[:, 0] / horizon)
    ratio = float(np.mean((hi - lo)[:, 0] / 2 / fixed))
    print(f"sd {sd} N {horizon} planned {planned}: {ratio:.3f}")
    assert 1.0 < ratio <= most


@pytest.mark.parametrize("horizon", [100, 400, 2000])
def test_heavy_tails_at_the_horizon_stay_within_1_6x(horizon: int) -> None:
    """Student-t(3) unit values: the skewness term widens the default design by a few
    percent, still within 1.6x of the fixed-sample width at N."""
    rng = np.random.default_rng(horizon + 1)
    x = rng.standard_t(3, (100, horizon))
    st = MeanStat(
        x,
        np.array([horizon]),
        horizon=horizon,
        sigma_floor=0.01,
        alpha=ALPHA,
        planned=VerdictSettings().planned_share,
    )
    lo, hi = st.bounds(ALPHA)
    fixed = stats.norm.isf(ALPHA) * np.sqrt(st.var[:, 0] / horizon)
    ratio = float(np.mean((hi - lo)[:, 0] / 2 / fixed))
    print(f"t(3) N {horizon}: {ratio:.3f}")
    assert 1.0 < ratio <= 1.6


def test_the_planned_boundary_is_narrower_at_the_horizon_and_wider_far_from_it() -> None:
    """What the planned share buys and costs, against the mixture alone: narrower at N,
    wider at N/4 and at 2N (where only the mixture's share of alpha is left)."""
    rng = np.random.default_rng(3)
    n = 400
    x = rng.normal(0.0, 1.0, (200, 2 * n))
    looks = np.array([n // 4, n, 2 * n])
    share = VerdictSettings().planned_share
    planned = MeanStat(x, looks, horizon=n, sigma_floor=0.01, alpha=ALPHA, planned=share)
    mixture = MeanStat(x, looks, horizon=n, sigma_floor=0.01, alpha=ALPHA)
    ratio = np.mean(planned.halfwidth(ALPHA) / mixture.halfwidth(ALPHA), axis=0)
    print(f"planned / mixture at N/4, N, 2N: {ratio}")
    assert ratio[1] < 0.8
    assert ratio[0] > 1.0 and ratio[2] > 1.0


@pytest.mark.parametrize("horizon", [30, 100, 1000])
@pytest.mark.parametrize("dist", ["normal", "t3", "skewed"])
@pytest.mark.parametrize("planned", [d for d, _ in DESIGNS])
def test_any_horizon_keeps_the_error_bound_under_peeking(
    horizon: int, dist: str, planned: float
) -> None:
    """Looking every 10 units from 30 to 1,000 under the null, each side's bound is crossed in
    at most α of 1,000 runs, for a horizon below, inside and past the looks (so the planned
    boundary is looked at up to its horizon and the mixture alone after it)."""
    rng = np.random.default_rng(horizon + len(dist))
    shape = (1000, 1000)
    if dist == "normal":
        x = rng.normal(0.0, 1.1, shape)
    elif dist == "t3":
        x = 0.8 * rng.standard_t(3, shape)
    else:
        x = rng.lognormal(0.0, 0.5, shape) - math.exp(0.125)
    st = MeanStat(
        x,
        np.arange(30, 1001, 10),
        horizon=horizon,
        sigma_floor=0.01,
        alpha=ALPHA,
        planned=planned,
    )
    for side in ("below", "above"):
        crossed = float(np.mean(np.any(st.p(0.0, side) <= ALPHA, axis=1)))
        print(f"{dist} N={horizon} planned {planned} {side}: {crossed:.3f}")
        assert crossed <= ALPHA


def _planned(case: world.PlannedCase, seed0: int) -> tuple[list[int], list[world.Outcome]]:
    """RUNS experiments, each planned from its own 100-session pilot (as operators each plan
    their own; bench/horizon.py's protocol) and run for its plan's sessions."""
    plans = [world.plan_sessions(case, seed=seed0 + 500_000 + i) for i in range(RUNS)]
    outs = [world.run_planned(case, n, h, seed=seed0 + i) for i, (n, h) in enumerate(plans)]
    return [n for n, _ in plans], outs


PROMOTE = [c for c in world.PLANNED if c.expect == "promote"]
OTHER = [c for c in world.PLANNED if c.expect != "promote"]


def agreement_misses(case: world.PlannedCase, seed0: int = 300) -> list[str]:
    """What the plan-vs-verdict rule finds wrong in RUNS runs of `case` (empty: they agree):
    each run promotes within its own plan's sessions (one miss of RUNS allowed), and the median
    plan is not more than 1.5x the median sessions the verdict needed."""
    plans, outs = _planned(case, seed0)
    needed = [min(o.units, o.sessions) if o.decision == "promote" else math.inf for o in outs]
    print(f"{case.label}: plans {plans}, needed {needed}")
    misses = []
    if sum(u <= n for u, n in zip(needed, plans, strict=True)) < RUNS - 1:
        misses.append(f"promoted within its plan's sessions in fewer than {RUNS - 1} runs")
    plan, need = statistics.median(plans), statistics.median(needed)
    if plan > 1.5 * need:
        misses.append(f"median plan {plan} > 1.5x the median needed {need}")
    return misses


@pytest.mark.parametrize("case", PROMOTE, ids=[c.label[:48] for c in PROMOTE])
def test_plan_and_verdict_agree(case: world.PlannedCase) -> None:
    """The plan's sessions suffice and are not 1.5x more than needed."""
    assert agreement_misses(case) == []


@pytest.mark.parametrize("case", OTHER, ids=[c.label[:48] for c in OTHER])
def test_planted_harm_and_aa_are_decided_right(case: world.PlannedCase) -> None:
    """Harm is rejected within the plan's sessions; A/A neither promotes nor rejects."""
    plans, outs = _planned(case, 400)
    print(case.label, plans, [(o.decision, o.units) for o in outs])
    assert sum(world.right(case, o) for o in outs) >= RUNS - (1 if case.expect != "aa" else 0)


def test_a_mixture_tuned_in_absolute_units_fails_the_agreement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutation: the latency sequences tuned as before this change (a fixed scale in log
    units: τ = 0.03 tunes them for ~9,000 units at a noise of 1.1) — the real-noise bi-kv row
    no longer promotes within its plan's sessions, and the rule above says so."""

    def old(v: np.ndarray, looks: np.ndarray | None, s: VerdictSettings) -> MeanStat:
        return MeanStat(v, looks, horizon=9000, sigma_floor=s.latency_sigma_floor, alpha=s.alpha)

    monkeypatch.setattr(metric_module, "mean_stat", old)
    case = next(c for c in PROMOTE if c.label.startswith("bi-kv, later turns 20 % faster, real"))
    assert agreement_misses(case) != []


def _all_shown_share(h: int, tests: int, q: float, turns: int, delta: float, runs: int) -> float:
    """Share of `runs` independent experiments (a generator apart from the plan's: its own
    seed and draw) in which every one of `tests` rate tests, each on its own discordant pairs,
    has shown its margin within h units."""
    rng = np.random.default_rng(2024)
    s = VerdictSettings()
    all_shown = np.ones(runs, dtype=bool)
    for _ in range(tests):
        k = rng.binomial(turns, q, size=(runs, h))  # discordant pairs in each unit
        plus = rng.binomial(k, 0.5)  # of which the candidate's side
        d = (2 * plus - k) / turns
        crossed = BoundedStat(d, np.arange(1, h + 1)).log_wealth(delta, "below") >= math.log(
            1 / s.alpha
        )
        all_shown &= crossed[:, max(s.min_metric_pairs, 1) - 1 :].any(axis=1)
    return float(np.mean(all_shown))


def test_the_plan_horizon_is_met_by_every_test_together() -> None:
    """Four rate tests of the same size (as at real engines' noise, where several decide close
    together): the plan's horizon is met by ~95 % of independent runs for all four at once,
    while the slowest test's own 95th percentile (the old horizon) is met by far fewer."""
    rows: list[plan.Row] = [plan.RateRow(f"t{i}", "+3 pp", 0.03, 0.04, 3) for i in range(4)]
    s = VerdictSettings()
    units, h = plan.size(rows, s)
    slowest = max(u for u in units if u is not None)
    together = _all_shown_share(h, 4, 0.04, 3, 0.03, 2000)
    alone = _all_shown_share(slowest, 4, 0.04, 3, 0.03, 2000)
    print(f"horizon {h} (slowest alone {slowest}): all four by it {together:.3f}, by {alone:.3f}")
    assert h > slowest
    assert together >= 0.93  # 0.95 less 2.5 standard errors of 2,000 runs
    assert alone < 0.9
