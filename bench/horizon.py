#!/usr/bin/env python3
"""Width, power and plan agreement of the horizon-tuned sequences (a benchmark, not a test).

Three tables for bench/RESULTS.md ("Decide as fast as the evidence allows"):

* width — the always-valid half-width at the horizon N (the verdict's `MeanStat` tuned to N,
  skewness correction included, σ̂ plugged in) over the fixed-sample half-width z(1-α) σ̂ / √N
  on the same data, for noise 0.14, 0.5, 1.1 × N = 100, 400, 2,000; normal and Student-t(3)
  unit values; the mean over runs. Beside it the mixture fixed in absolute units it replaces
  (τ = 0.03 in log units, ρ = σ̂⁴/τ²).
* plan — for each world, `canary plan`'s sessions (from a 100-session pilot of the world, through
  the product's sizing core) against the sessions the verdict actually needed on
  `tests/evaluators/world.py` (looks every 20 pairs): the share decided by the plan's sessions
  and plan / median. Each run has its own pilot and is judged against its own plan (what the
  plan promises an operator who pilots once); `--pilots fixed` judges one pilot's plan instead.
* power — planted effects and A/A rows on the independent world, run through the product's
  path (`build_report`), looks every 20 pairs, each run as long as its plan says.

    .venv/bin/python bench/horizon.py width
    .venv/bin/python bench/horizon.py worlds --runs 200                  # a pilot per run
    .venv/bin/python bench/horizon.py worlds --runs 200 --pilots fixed   # one pilot per row
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from evaluators.judge.settings import VerdictSettings
from evaluators.stats.sequential import MeanStat


def _old_halfwidth(x: np.ndarray, alpha: float, tau: float = 0.03) -> np.ndarray:
    """The replaced sequence: one-sided normal mixture with ρ = σ̂⁴/τ² (τ fixed in log units)."""
    t = x.shape[-1]
    var = np.var(x, axis=-1, ddof=1)
    ratio = var / tau**2
    vr = var * (t + ratio)
    r = np.sqrt(ratio / (t + ratio))
    return np.sqrt(2.0 * vr * np.log1p(1.0 / (2.0 * alpha * r))) / t


def width(runs: int, alpha: float) -> None:
    z = stats.norm.isf(alpha)
    share = VerdictSettings().planned_share
    print(f"runs per cell: {runs}; α = {alpha} one-sided; ratio = mean over runs")
    print(
        f"| noise (sd of a unit) | horizon N | planned {share:g}: normal | planned {share:g}: t(3) "
        "| mixture: normal | mixture: t(3) | old τ = 0.03: normal |"
    )
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(5)
    for sd in (0.14, 0.5, 1.1):
        for n in (100, 400, 2000):
            cells: dict[tuple[float, str], float] = {}
            for dist in ("normal", "t3"):
                if dist == "normal":
                    x = rng.normal(0.0, sd, (runs, n))
                else:
                    x = sd * rng.standard_t(3, (runs, n)) / math.sqrt(3.0)
                for planned in (share, 0.0):
                    st = MeanStat(
                        x, np.array([n]), horizon=n, sigma_floor=0.01, alpha=alpha, planned=planned
                    )
                    lo, hi = st.bounds(alpha)
                    half = (hi - lo)[..., 0] / 2
                    fixed = z * np.sqrt(st.var[..., 0]) / math.sqrt(n)
                    cells[planned, dist] = float(np.mean(half / fixed))
                if dist == "normal":
                    old = float(np.mean(_old_halfwidth(x, alpha) / fixed))
            print(
                f"| {sd} | {n:,} | {cells[share, 'normal']:.2f}x | {cells[share, 't3']:.2f}x | "
                f"{cells[0.0, 'normal']:.2f}x | {cells[0.0, 't3']:.2f}x | {old:.2f}x |"
            )


def worlds(
    runs: int, rows: list[int] | None, seed0: int, planned: float | None, pilots: str
) -> None:
    """Plan (from a 100-session pilot) against verdict on the independent world, per row:
    each run draws twice the plan's sessions (the last look planned) and looks every 20
    pairs; `decided by plan` is the share whose first decision came with at most the plan's
    sessions closed, and is the right one.

    `pilots = "fixed"`: one pilot per row (seed 999), so one plan judged over many runs (a
    plan conditional on one pilot draw). `pilots = "per-run"`: every run has its own pilot
    (fresh seed) and is judged against its own plan, as operators each plan their own
    experiment; the plan column is then the median plan, and plan / median the median plan
    over the median sessions needed."""
    from bench._shared import world

    cases = list(world.PLANNED)
    picked = [cases[i - 1] for i in rows] if rows else cases
    if planned is not None:  # the same worlds with another share of alpha on the plan
        picked = [
            dataclasses.replace(c, overrides={**c.overrides, "planned_share": planned})
            for c in picked
        ]
    share = planned if planned is not None else VerdictSettings().planned_share
    print(f"planned_share = {share}")
    print(
        f"runs per row: {runs}; looks every 20 pairs; plan from a 100-session pilot "
        f"({'one pilot per row' if pilots == 'fixed' else 'a pilot per run'})"
    )
    print(
        "| row | plan: sessions (horizon) | right by plan [95 % CI] | false promote | "
        "false reject | median sessions to decide | plan / median | runs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case in picked:
        t0 = time.perf_counter()
        plans: list[tuple[int, int]] = []
        outs = []
        for i in range(runs):
            if pilots == "fixed":
                plans.append(plans[0] if plans else world.plan_sessions(case))
            else:  # the pilot's seed space is apart from the runs'
                plans.append(world.plan_sessions(case, seed=seed0 + 500_000 + i))
            n_i, h_i = plans[-1]
            total = 2 * n_i if case.expect == "promote" else n_i
            outs.append(world.run_planned(case, total, h_i, seed=seed0 + i))
        planned_n = [p[0] for p in plans]
        n = round(statistics.median(planned_n))
        h = round(statistics.median(p[1] for p in plans))
        need = [min(o.units, o.sessions) if o.decision != "hold" else math.inf for o in outs]
        by_plan = [
            world.right(case, o) and u <= p for o, u, p in zip(outs, need, planned_n, strict=True)
        ]
        if case.expect == "aa":
            by_plan = [world.right(case, o) for o in outs]
        k = sum(by_plan)
        lo, hi = clopper_pearson(k, runs)
        fp = sum(o.decision == "promote" for o in outs) if case.expect != "promote" else 0
        fr = sum(o.decision == "reject" for o in outs) if case.expect != "reject" else 0
        med = statistics.median(need) if case.expect != "aa" else math.inf
        ratio = f"{n / med:.2f}" if math.isfinite(med) and med > 0 else "–"
        med_s = f"{med:,.0f}" if math.isfinite(med) else "–"
        spread = "" if pilots == "fixed" else f" [{min(planned_n):,}–{max(planned_n):,}]"
        print(
            f"| {case.label} | {n:,}{spread} ({h:,}) | {k / runs:.0%} [{lo:.0%}, {hi:.0%}] | "
            f"{fp / runs:.1%} | {fr / runs:.1%} | {med_s} | {ratio} | {runs} |  "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", choices=("width", "worlds"))
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--rows", help="comma-separated rows of world.PLANNED (1-based)")
    ap.add_argument("--seed", type=int, default=20_000)
    ap.add_argument(
        "--planned-share",
        type=float,
        help="share of alpha on the boundary planned to the horizon (default: the verdict's)",
    )
    ap.add_argument(
        "--pilots",
        choices=("per-run", "fixed"),
        default="per-run",
        help="a pilot per run, each run judged against its own plan (default), or one pilot "
        "per row (seed 999: one plan judged over all runs)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.table == "width":
        width(args.runs, args.alpha)
    else:
        rows = [int(r) for r in args.rows.split(",")] if args.rows else None
        worlds(args.runs, rows, args.seed, args.planned_share, args.pilots)
    print(f"took {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
