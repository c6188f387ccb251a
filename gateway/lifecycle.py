"""Process lifecycle helpers shared by every process the gateway starts (workers, the mirror
process, the report process, the simulator): which event loop runs, dying with the parent, a
lower CPU priority (light to import, so a process can lower it before its own imports), the
shutdown of a stage's owned tasks (`finish_tasks`), and, last, multiprocessing's resource
tracker (`stop_resource_tracker`). No
wiring here: the planes and the simulator may import this, it imports nothing of ours."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import sys
import time
from collections.abc import Collection, Coroutine
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def run_loop(main: Coroutine[Any, Any, None], loop: str = "auto") -> None:
    """Run `main` to completion on uvloop when installed ("auto") or asked ("uvloop"), else
    on asyncio's default loop (`event_loop` in the config)."""
    factory: Any = None
    if loop != "asyncio":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is optional
            if loop == "uvloop":
                raise
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGTERM this child when its parent dies (Linux), so a supervisor (or the
    demo) killed with SIGKILL or by the OOM killer never leaves children holding ports."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def lower_priority(mode: str, niceness: int) -> str:
    """Lower this process's CPU priority; returns what the kernel granted ("SCHED_IDLE",
    "nice+N" or "normal"). Lowering priority never needs privileges on Linux; if SCHED_IDLE is
    not available (another OS, a seccomp policy) nice is the fallback."""
    if mode == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.nice(niceness)  # inert under SCHED_IDLE; applies if the policy is reset
            return "SCHED_IDLE"
        except (AttributeError, OSError):
            pass
    if mode in ("idle", "nice"):
        try:
            os.nice(niceness)
            return f"nice+{niceness}"
        except OSError:
            pass
    return "normal"


# The cyclic collector's youngest-generation threshold once a process serves (CPython's default
# is 700 allocations). A proxied request allocates a few hundred container objects, nearly all
# freed by reference counting as soon as it ends; at 700 the collector ran every request or two
# and took 13-18 % of a worker's CPU at 1,000 req/s (bench/spy.py). At 10,000 it runs about
# every 20 requests and what it finds is mostly already gone: ~3-4 %. Cyclic garbage waits for
# at most 10,000 allocations, a few MB.
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once a process has imported and built what it keeps for its life (called when it starts
    serving): collect once, move every surviving object out of the collector's sight
    (`gc.freeze`: a full collection no longer walks the imported modules) and collect the young
    generation every `YOUNG_THRESHOLD` allocations instead of 700."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


async def finish_tasks(tasks: Collection[asyncio.Task[Any]], timeout_s: float) -> None:
    """Let `tasks` run for up to `timeout_s` (0: not at all), then cancel what is left and wait
    for it: the one shutdown of a stage's owned tasks (the counter's, the scorer's, ...)."""
    pending = list(tasks)
    if pending and timeout_s > 0:
        await asyncio.wait(pending, timeout=timeout_s)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stop_resource_tracker(timeout_s: float = 5.0) -> bool:
    """Stop multiprocessing's resource tracker, the helper process its spawn start method runs
    beside every child, and reap it; True when none is left running.

    The tracker exits when the last holder of its pipe does, which is this process: as PID 1 of
    a container it would still be alive when this process exits, and the kernel kills it then
    (an orphan). So the last process standing closes its end and waits for the tracker, at most
    `timeout_s` (a descendant that still holds the pipe would keep it alive; not waited for).
    """
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    pid: int | None = getattr(tracker, "_pid", None)
    fd: int | None = getattr(tracker, "_fd", None)
    if pid is None or fd is None:
        return True
    with contextlib.suppress(OSError):
        os.close(fd)
    tracker._fd = None  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            tracker._pid = None  # type: ignore[attr-defined]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
