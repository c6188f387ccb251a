"""Rollback reach across a fleet: how long after replica A decides a rollback replica B still
routes new sessions to the candidate.

    .venv/bin/python bench/rollout_fleet.py [--trials 20] [--kinds abort,guard] [--poll-s 5]

Two `canary serve` replicas on one throwaway PostgreSQL database (created on the server at
$CANARY_TEST_PG_DSN, default postgresql://postgres@127.0.0.1:5432/postgres, dropped after) behind
the shipped nginx config; production and the candidate are nginx servers naming their arm in the
answer (bench/_shared/rollout_fleet.py). Per trial: a forced rollout at 50 % opened through A,
then A decides a rollback, either an operator abort on A's admin API or A's worker guard tripped by
five failing candidate requests, while B is probed every 10 ms with a fresh session bound to the
candidate; reach = B's first production answer minus the stored rollback event's `at`. A new
rollout each trial. Prints markdown tables: p50, p95 and max per kind, against the registry poll
interval (the fallback when the push is lost). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._shared.nginx import MISSING, find_nginx
from bench._shared.rollout_fleet import PROBE_EVERY_S, Reach, rollout_fleet, trial

PG = os.environ.get("CANARY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


async def run(trials: int, kinds: list[str], poll_s: float) -> dict[str, list[Reach]]:
    name = f"canary_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(PG)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = urlunsplit(urlsplit(PG)._replace(scheme="postgresql+asyncpg", path=f"/{name}"))
    out: dict[str, list[Reach]] = {kind: [] for kind in kinds}
    try:
        with tempfile.TemporaryDirectory(prefix="canary-ramp-fleet-") as tmp:
            async with rollout_fleet(Path(tmp), url, poll_s=poll_s) as fleet:
                for n in range(trials):
                    for kind in kinds:
                        out[kind].append(await trial(fleet, n, kind, timeout_s=poll_s * 3))
    finally:
        admin = await asyncpg.connect(PG)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kinds", default="abort,guard")
    parser.add_argument("--poll-s", type=float, default=5.0, help="registry_poll_interval_s")
    args = parser.parse_args()
    if find_nginx() is None:
        parser.exit(2, f"rollout_fleet: {MISSING}\n")
    load0 = os.getloadavg()
    res = asyncio.run(run(args.trials, args.kinds.split(","), args.poll_s))
    load1 = os.getloadavg()
    print(
        f"Machine: {os.cpu_count()} cores, load average {load0[0]:.2f} / {load0[1]:.2f} at the "
        f"start, {load1[0]:.2f} / {load1[1]:.2f} at the end (1 / 5 min); B probed every "
        f"{PROBE_EVERY_S * 1e3:.0f} ms; registry poll {args.poll_s:g} s\n"
    )
    print(
        "| decision on A | trials | reach p50 ms | p95 ms | max ms | max / poll interval "
        "| candidate answers on B after the decision (max) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, reaches in res.items():
        ms = [r.reach_s * 1e3 for r in reaches]
        label = "operator abort (A's admin API)" if kind == "abort" else "guard trip (A's worker)"
        print(
            f"| {label} | {len(ms)} | {pct(ms, 0.5):.0f} | {pct(ms, 0.95):.0f} | {max(ms):.0f} "
            f"| {max(ms) / 1e3 / args.poll_s:.3f} | {max(r.late_probes for r in reaches)} |"
        )
    aborts = [r for r in res.get("abort", []) if r.answered_at is not None]
    if aborts:
        after = [(r.reached_at - r.answered_at) * 1e3 for r in aborts]  # type: ignore[operator]
        api = [(r.answered_at - r.decided_at) * 1e3 for r in aborts]  # type: ignore[operator]
        print(
            f"\nAbort: A's API answered {pct(api, 0.5):.0f} ms (p50) after the stored `at`; "
            f"B routed to production {pct(after, 0.5):.0f} ms (p50), {max(after):.0f} ms (max) "
            "after A's answer (negative: before it)."
        )
    print("\nPer trial (ms): " + "; ".join(
        f"{kind}: " + ", ".join(f"{r.reach_s * 1e3:.0f}" for r in rs) for kind, rs in res.items()
    ))  # fmt: skip


if __name__ == "__main__":
    main()
