"""Waiting for the product, in one place: a test that waits for something the product does
waits for the product's own signal (a status it reports, a counter reaching a value, a line
of its log, a read its page says has ended), polled cheaply, never for a guessed number of
sleeps. Each wait carries a bound that says what the test expects of the product, derived
from the product's own settings (a timeout it promises to answer within, a start-up it waits
for), and its failure says what was awaited and the last thing seen. Holds no tests.

A bound is not the host's speed: on a busy host the product's settings still hold, and where
the product promises no bound of its own (a child process's imports at low priority), the
test's own timeout (pytest-timeout) is the backstop and the bound here is that generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

# The waits a benchmark script shares (bench/_shared/waiting.py), re-exported: one home.
from bench._shared.waiting import IMPORTS_S as IMPORTS_S
from bench._shared.waiting import MIRROR_START_S as MIRROR_START_S
from bench._shared.waiting import POLL_S as POLL_S
from bench._shared.waiting import SERVE_START_S as SERVE_START_S
from bench._shared.waiting import until as until
from bench._shared.waiting import until_ready as until_ready

T = TypeVar("T")

# A server started in a thread or a child process that only imports and listens (the
# simulator, a stand-in upstream): the imports alone.
LISTEN_S = IMPORTS_S
# A state the product reaches on its own loop right after an event the test caused (a
# cancelled upstream request, a counter, a disconnect noticed): no product setting bounds it
# beyond "the next turns of its loop", so the bound is a busy host's scheduling, generously.
SETTLE_S = 10.0


def until_sync(probe: Callable[[], T], *, what: str, within_s: float, every_s: float = POLL_S) -> T:
    """`until` for a test that is not a coroutine (a thread, a subprocess's lifetime)."""
    deadline = time.monotonic() + within_s
    seen = probe()
    while not seen:
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {within_s:g} s (last seen: {seen!r})")
        time.sleep(every_s)
        seen = probe()
    return seen
