"""Per-request cost of the ramp's routing decision (gateway/rollout/arms.py).

    .venv/bin/python bench/arms.py [--sessions 20000] [--slots 1048576] [--cpu-time]

Times `ArmRouter.arm_for` with timeit on a real table in /dev/shm: with no rollout (the session
still recorded, so that a later ramp leaves it on production), during a ramp for sessions already
known, for sessions from before the ramp and for new ones, and after a rollback; beside them the
floor of encoding and hashing the key once. "New" runs use fresh keys in every repeat.

A second table times the proxy's whole share of the ramp per request (`gateway.server.proxy`):
reading the session header and deciding (what every request pays once a router is wired), and,
while a rollout ramps, that plus the request's record (counters, the session hash, the sink, the
candidate guard). Prints markdown tables of microseconds per call (best of 5 repeats). A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
import timeit
from collections.abc import Callable

import xxhash
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.load import config_from
from gateway.rollout.arms import ArmRouter, SessionArms, Split
from gateway.rollout.route import RolloutRoute
from gateway.server.prometheus import Exporter

REPEAT = 5
# Wall clock by default; --cpu-time times this process's CPU instead (on a shared host a busy
# neighbour preempts the timed loop, which the wall clock counts and the CPU clock does not).
TIMER = [time.perf_counter]
_fresh = itertools.count()


def _known(fn: Callable[[str], object], keys: list[str]) -> float:
    """µs per call, best of REPEAT passes over the same keys."""
    timer = timeit.Timer("for k in keys: fn(k)", timer=TIMER[0], globals={"fn": fn, "keys": keys})
    return min(timer.repeat(repeat=REPEAT, number=1)) / len(keys) * 1e6


def _new(fn: Callable[[str], object], n: int, prefix: str) -> tuple[float, list[str]]:
    """µs per call, best of REPEAT passes each over n keys never seen; and the first pass's keys."""
    batches = [[f"{prefix}-{next(_fresh)}" for _ in range(n)] for _ in range(REPEAT)]
    it = iter(batches)
    timer = timeit.Timer("for k in next(it): fn(k)", timer=TIMER[0], globals={"fn": fn, "it": it})
    return min(timer.repeat(repeat=REPEAT, number=1)) / n * 1e6, batches[0]


class _NullSink:
    def put_rollout(self, request: object) -> None:
        pass


def _proxy_rows(table: SessionArms, n: int) -> list[tuple[str, float]]:
    """The proxy's per-request ramp work, as `Proxy._forward` does it (same statements)."""
    router = ArmRouter(table)
    rollout = RolloutRoute(
        router, config_from({}).rollout, Exporter(), session_header="X-Session-ID",
        sink=_NullSink(),
    )  # fmt: skip
    header = rollout.session_header

    def decide(headers: CIMultiDictProxy[str]) -> object:
        active: Split | None = rollout.router.rollout
        key = headers.get(header) or "rid"
        arm = rollout.router.arm_for(key)
        assert active is not None
        if active.state != "ramping":
            active = None
        if active is not None:
            rollout.record(active, arm, key, status=200, ttft_s=0.05, e2e_s=0.5, finished=True)
        return arm

    def requests(prefix: str, count: int) -> list[CIMultiDictProxy[str]]:
        return [
            CIMultiDictProxy(CIMultiDict({"X-Session-ID": f"{prefix}-{next(_fresh)}"}))
            for _ in range(count)
        ]

    def timed(batch: list[CIMultiDictProxy[str]]) -> float:
        timer = timeit.Timer(
            "for h in batch: fn(h)", timer=TIMER[0], globals={"fn": decide, "batch": batch}
        )
        return min(timer.repeat(repeat=REPEAT, number=1)) / len(batch) * 1e6

    rows = []
    no_router = requests("none", n)
    timer = timeit.Timer(
        "for h in batch: h.get('X-Session-ID')", timer=TIMER[0], globals={"batch": no_router}
    )
    floor = min(timer.repeat(repeat=REPEAT, number=1)) / n * 1e6
    rows.append(("no router wired: nothing (header read shown for scale)", floor))
    idle = requests("idle", n)
    timed(idle)  # first sight: recorded
    rows.append(("router idle, known session: decide", timed(idle)))
    router.swap(Split(3, salt=0x5EED, weight=0.5, candidate="cand", state="ramping"))
    during = requests("ramp", n)
    timed(during)
    rows.append(("ramp at 50 %, known session: decide + record", timed(during)))
    rows.append(("ramp at 50 %, session from before: decide + record", timed(idle)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=1 << 20)
    parser.add_argument("--cpu-time", action="store_true", help="time CPU, not wall clock")
    args = parser.parse_args()
    if args.cpu_time:
        TIMER[0] = time.process_time
    n = args.sessions
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(shm, f"canary-arms-bench-{os.getpid()}")
    rows: list[tuple[str, float]] = []
    with SessionArms.create(path, slots=args.slots) as table:
        router = ArmRouter(table)
        floor = _known(lambda k: xxhash.xxh3_64_intdigest(k.encode()), [f"f-{i}" for i in range(n)])
        rows.append(("floor: encode + xxh3_64 of the key", floor))
        us, before = _new(router.arm_for, n, "idle")
        rows.append(("no rollout, new session (recorded)", us))
        rows.append(("no rollout, known session", _known(router.arm_for, before)))
        rollout = Split(1, salt=0x5EED, weight=0.25, candidate="cand", state="ramping")
        router.swap(rollout)
        us, during = _new(router.arm_for, n, "ramp")
        rows.append(("ramp at 25 %, new session", us))
        rows.append(("ramp at 25 %, known session", _known(router.arm_for, during)))
        rows.append(("ramp at 25 %, session from before the ramp", _known(router.arm_for, before)))
        router.swap(rollout.rolled_back())
        rows.append(("rolled back, known session", _known(router.arm_for, during)))
        counters = router.counters()
    path = os.path.join(shm, f"canary-arms-bench-proxy-{os.getpid()}")
    with SessionArms.create(path, slots=args.slots) as table:
        proxy_rows = _proxy_rows(table, n)
    clock = "process CPU time" if args.cpu_time else "wall clock"
    print(f"{n} sessions per pass, {args.slots} slots ({args.slots * 8 >> 20} MiB), {clock}\n")
    print("| case | µs per call |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    print(f"\ncounters: {counters}\n")
    print("| the proxy's share, per request | µs |\n|---|---:|")
    for name, us in proxy_rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
