"""Process lifecycle helpers shared by every process the gateway starts (workers, the mirror
process, the report process, the simulator): which event loop runs, dying with the parent, and
a lower CPU priority (light to import, so a process can lower it before its own imports). No
wiring here: the planes and the simulator may import this, it imports nothing of ours."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Coroutine
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
