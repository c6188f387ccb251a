"""`canary demo`: see the whole loop (mirror, measure, decide) with zero setup."""

from __future__ import annotations

import argparse
from typing import Any

from domain.errors import UsageError

EPILOG = """\
what it does:
  1. starts four engine simulators: production, a control (production's profile), a bi-kv
     candidate (keeps each session's KV cache) and a quantized candidate (30 %% of answers
     diverge), plus a gateway in front of production, with SQLite in a temporary directory;
  2. drives agent-like multi-turn sessions through the gateway, --batch at a time, and asks
     for both candidates' verdicts between batches (the progress line shows them as they
     form) until bi-kv and quantized are each promoted or rejected, or --max-sessions is
     reached (it says which ended it); the intervals are valid at every look;
  3. stops the gateway, which drains the mirror and flushes storage;
  4. prints both candidates' reports and writes their HTML forms to --out-dir.

examples:
  canary demo
  canary demo --max-sessions 200 --seed 7
  canary demo --sessions 100 --turns 8    # exactly 100 sessions, no looking between them
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
        default=400,
        help="at most this many conversations while waiting for the verdicts (default 400)",
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
        "--keep",
        action="store_true",
        help="leave the gateway and simulators running; print URLs and commands to try",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.cli.progress import Progress
    from gateway.process.demo import DemoOptions, run_demo

    if args.sessions < 0:
        raise UsageError("--sessions must be at least 1 (or 0: until every candidate is decided)")
    for flag in ("max_sessions", "batch", "turns", "concurrency"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    if not args.time_scale > 0:
        raise UsageError("--time-scale must be positive")
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
    )
    try:
        return asyncio.run(run_demo(opts, Progress))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C or SIGTERM: run_demo has already stopped every process it started.
        print("canary demo: interrupted; every process it started has been stopped", flush=True)
        return 130
