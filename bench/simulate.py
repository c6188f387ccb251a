#!/usr/bin/env python3
"""The long validation: every row of the audit's table, many runs each (a benchmark, not a test).

Each run draws one experiment from the independent world of `tests/evaluators/world.py`
(sessions, clustered failures, heavy tails, nondeterministic engines, live-load differences)
and judges it through the product's path (`pairset_from_pairs` -> `build_report`) at evenly
spaced looks, the last a planned look; the run's outcome is its first non-hold verdict. Prints,
per row, the rate of each target outcome with its 95 % Clopper–Pearson interval, the target,
and the median pairs to a decision. The CI part (`tests/evaluators/test_eval_validation.py`)
runs the same rows on a few fixed seeds.

    .venv/bin/python bench/simulate.py                 # 300 runs per row, 20 looks
    .venv/bin/python bench/simulate.py --runs 100 --looks 10 --rows 1,2,3
    .venv/bin/python bench/simulate.py --rows 9 --drop-sessions   # the mutation, measured
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench._shared import world


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes in n."""
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--looks", type=int, default=20)
    ap.add_argument("--rows", help="comma-separated row numbers (1-based); default all")
    ap.add_argument("--seed", type=int, default=10_000, help="first seed (CI uses 0..)")
    ap.add_argument(
        "--drop-sessions",
        action="store_true",
        help="mutation: every pair its own unit (shows what the session units are for)",
    )
    args = ap.parse_args()
    if args.drop_sessions:
        import evaluators.judge.metric as metric_module

        real = metric_module.build_units

        def per_pair(*a: object, **k: object) -> object:
            return real(*a, **{**k, "by_session": False})  # type: ignore[arg-type]

        metric_module.build_units = per_pair  # type: ignore[assignment]
    cases = [*world.CASES, world.SENTINEL]
    if args.rows:
        cases = [cases[int(i) - 1] for i in args.rows.split(",")]
    print(f"runs per row: {args.runs}; looks per run: {args.looks}; first seed {args.seed}")
    print("| case | outcome | rate [95 % CI] | target | median pairs to decision | runs |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        t0 = time.perf_counter()
        outs = [
            world.run(
                case.world,
                kind=case.kind,
                sessions=case.sessions,
                looks=args.looks,
                seed=args.seed + i,
            )
            for i in range(args.runs)
        ]
        decided = [o.pairs for o in outs if o.decision != "hold"]
        median = f"{statistics.median(decided):,.0f}" if decided else "– (all held)"
        targets = [(w, f"≤ {b:.0%}") for w, b in case.at_most.items()]
        targets += [(w, f"≥ {b:.0%}") for w, b in case.at_least.items()]
        for what, target in targets:
            k = sum(world.happened(o, what) for o in outs)
            lo, hi = clopper_pearson(k, len(outs))
            rate = f"{k / len(outs):.1%} [{lo:.1%}, {hi:.1%}]"
            print(f"| {case.label} | {what} | {rate} | {target} | {median} | {len(outs)} |")
        holds = sum(o.decision == "hold" for o in outs)
        print(
            f"| {case.label} | (hold at horizon) | {holds / len(outs):.1%} | | | "
            f"{len(outs)} ({time.perf_counter() - t0:.0f} s) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
