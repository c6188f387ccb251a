"""The ramp's validation table (issue 43, round 5): the controller's decision rule
(`evaluators.rollout.rule`) read every 2 s in simulated time on the independent generator
`tests/evaluators/rollout_traffic.py`, with the workers' guard rule, 200 runs per case at the
default settings. `tests/evaluators/test_rollout_rule.py` asserts the targets; this prints them.

    python bench/rollout_validation.py [--runs 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._shared.rollout_sim import (
    STEPS,
    planned_seconds,
    rolled_back_by,
    simulate_rollout,
)

CASES = (
    ("ttft", 0, 1),
    ("ttft", 1, 1),
    ("ttft", 2, 2),
    ("ttft", 3, 3),
    ("failures", 0, 2),
    ("failures", 1, 2),
    ("failures", 2, 2),
)


def main() -> None:
    """Print one row per case: what was planted, the target, the measured rate."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    began = time.process_time()
    good = simulate_rollout(args.seed, runs=args.runs)
    done = (good.state == "completed") & (good.seconds <= 3600.0)
    rolled = good.state == "rolled_back"
    completed = good.seconds[good.state == "completed"]
    rows = [
        ("good: completes 1 -> 100 % in <= 60 min", ">= 90 %", f"{done.mean():.1%}"),
        (
            "A/A: rolled back (tests or guards)",
            "<= 5 %",
            f"{rolled.mean():.1%} (guards {good.by_guard.mean():.1%})",
        ),
        ("A/A: held at 50 % (margins not shown)", "", f"{np.mean(good.state == 'held'):.1%}"),
        (
            "good: time to complete, median / 90th pct",
            "",
            f"{np.median(completed) / 60:.1f} / {np.percentile(completed, 90) / 60:.1f} min",
        ),
        (
            "canary plan's expected time",
            "within 1.5x of the median",
            f"{planned_seconds() / 60:.1f} min",
        ),
    ]
    for harm, at, until in CASES:
        out = simulate_rollout(
            args.seed + 9 + at,  # the seeds of tests/evaluators/test_rollout_rule.py at --seed 1
            runs=args.runs,
            harm=harm,
            harm_step=at,
            until_step=until,
            before=good,
        )
        what = "TTFT x1.3" if harm == "ttft" else "failing sessions 2 -> 5 %"
        rows.append(
            (
                f"{what} from {STEPS[at]:g} %: rolled back before leaving {STEPS[until]:g} %",
                ">= 90 %",
                f"{rolled_back_by(out, until):.1%} (guards {out.by_guard.mean():.1%})",
            )
        )
    print(f"| case (n = {args.runs} runs each) | target | measured |")
    print("|---|---|---|")
    for case, target, measured in rows:
        print(f"| {case} | {target} | {measured} |")
    print(f"\n{time.process_time() - began:.1f} s of CPU")


if __name__ == "__main__":
    main()
