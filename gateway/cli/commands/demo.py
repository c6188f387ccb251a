"""`canary demo`: see the whole loop (mirror, measure, decide) with zero setup."""

from __future__ import annotations

import argparse
from typing import Any

from domain.errors import EXIT_INTERRUPTED, UsageError

EPILOG = """\
what it does:
  1. starts six engine simulators: production, a control (production's profile), a bi-kv
     candidate (keeps each session's KV cache), a quantized candidate (30 % of answers
     diverge), an upgrade (a new checkpoint: every answer in its own words) and the LLM
     grader that judges the upgrade's pairs blind, in both orders (the simulator's: a planted
     position bias), plus a gateway in front of production, with SQLite in a temporary
     directory;
  2. drives agent-like multi-turn sessions through the gateway, --batch at a time, and asks
     for the candidates' verdicts between batches (the progress line shows them as they
     form) until bi-kv, quantized and upgrade are each promoted or rejected, or
     --max-sessions is reached (it says which ended it); the intervals are valid at every
     look; the upgrade is decided by the grader's net preference (at a 20 pp margin this
     demo's size can show), exact match reported as information for it;
  3. once bi-kv is promoted, ramps it on live traffic: 1, 5, 25, 50 and 100 % of new
     sessions, the controller alone walking the steps (each at least --step-dwell seconds,
     and until a planted harm would have been caught at the demo's measured noise and rate;
     50 % asks for bi-kv's margins once) while it and the workers' guards watch for harm,
     printing the live page's URL and one line per step with why it ended; at 100 % the
     controller completes it and bi-kv becomes the live endpoint. --fail-at-step K kills
     bi-kv's simulator at step K instead: a guard rolls the ramp back, production answers;
  4. stops the gateway, which drains the mirror and flushes storage;
  5. prints the candidates' reports (as they stood at the verdicts) and writes their HTML
     and JSON forms to --out-dir; then the upgrade's decision by preference (net preference
     with its interval and n, the grader's position bias) and what exact match, had it
     gated, would have decided.

examples:
  canary demo
  canary demo --max-sessions 200 --seed 7
  canary demo --sessions 100 --turns 8    # exactly 100 sessions, no looking between them
  canary demo --fail-at-step 3    # bi-kv dies at 25 %: watch the automatic rollback
  canary demo --keep          # leave everything running and print commands to explore
"""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the whole loop on simulated engines and print verdicts",
        description="Mirror, measure and decide on simulated engines, in about a minute.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="send exactly this many conversations, without looking in between (default: until"
        " every candidate is decided)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=600,
        help="at most this many conversations while waiting for the verdicts (default 600)",
    )
    parser.add_argument(
        "--batch", type=int, default=20, help="conversations between two looks (default 20)"
    )
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation (default 6)")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="conversations in flight (default 16)"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.25,
        help="multiply the simulators' latencies (default 0.25: a quick run)",
    )
    parser.add_argument(
        "--out-dir",
        default="canary-reports",
        help="HTML report folder (default ./canary-reports)",
    )
    parser.add_argument("--seed", type=int, default=0, help="traffic seed (default 0)")
    parser.add_argument(
        "--step-dwell",
        type=float,
        default=3.0,
        help="each ramp step's minimum dwell in seconds, the rollout's min_step_s (default 3)",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=0,
        metavar="K",
        help="kill bi-kv's simulator when the ramp reaches step K (1: the first; not the last)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the gateway and simulators running; print URLs and commands to try",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.cli.progress import Progress
    from gateway.process.demo import ROLLOUT_STEPS, DemoOptions, run_demo

    if args.sessions < 0:
        raise UsageError("--sessions must be at least 1 (or 0: until every candidate is decided)")
    for flag in ("max_sessions", "batch", "turns", "concurrency"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    if not args.time_scale > 0:
        raise UsageError("--time-scale must be positive")
    if not args.step_dwell > 0:
        raise UsageError("--step-dwell must be positive")
    if not 0 <= args.fail_at_step < len(ROLLOUT_STEPS):
        raise UsageError(
            f"--fail-at-step must be a step before the last (1-{len(ROLLOUT_STEPS) - 1}), or 0"
        )
    opts = DemoOptions(
        sessions=args.sessions,
        max_sessions=args.max_sessions,
        batch=args.batch,
        turns=args.turns,
        concurrency=args.concurrency,
        time_scale=args.time_scale,
        keep=args.keep,
        out_dir=args.out_dir,
        seed=args.seed,
        step_dwell_s=args.step_dwell,
        fail_at_step=args.fail_at_step,
    )
    try:
        return asyncio.run(run_demo(opts, Progress))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C or SIGTERM: run_demo has already stopped every process it started.
        print("canary demo: interrupted; every process it started has been stopped", flush=True)
        return EXIT_INTERRUPTED
