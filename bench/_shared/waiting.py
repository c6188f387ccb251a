"""Waiting for the product, in one place: a script or a test that waits for something the
product does waits for the product's own signal (a status it reports, a counter reaching a
value), polled cheaply, never for a guessed number of sleeps. Each wait carries a bound derived
from the product's own settings, and its failure says what was awaited and the last thing seen.

A bound is not the host's speed: on a busy host the product's settings still hold, and where
the product promises no bound of its own (a child process's imports at low priority), the bound
here is generous (a test's own timeout is the backstop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from gateway.config.sections import ReportsConfig

T = TypeVar("T")

POLL_S = 0.05  # between two looks: the product's signals are cheap to read
# How long a `canary serve` takes to serve, as the product bounds it: a worker waits for its
# mirror process (`PlaneProcess.wait_ready`, 30 s, then exits) and for its report process
# (`[reports] start_wait_s`, then serves anyway); its own imports and its children's are not
# bounded by the product (a busy host slows them), hence the generous last term.
MIRROR_START_S = 30.0
IMPORTS_S = 60.0
SERVE_START_S = MIRROR_START_S + ReportsConfig().start_wait_s + IMPORTS_S


async def until(
    probe: Callable[[], Awaitable[T]],
    *,
    what: str,
    within_s: float,
    every_s: float = POLL_S,
) -> T:
    """The first truthy value `probe` returns, looking every `every_s`; an AssertionError
    naming `what` and the last value seen if none came within `within_s` (a probe's exception
    is re-raised at once: a broken probe is not a slow product)."""
    deadline = time.monotonic() + within_s
    seen: T = await probe()
    while not seen:
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {within_s:g} s (last seen: {seen!r})")
        await asyncio.sleep(every_s)
        seen = await probe()
    return seen


async def until_ready(
    url: str, proc: Any, *, within_s: float = SERVE_START_S, ok: Callable[[int], bool] | None = None
) -> None:
    """Until `url` answers a status `ok` accepts (default: 200) or `proc` (an asyncio
    subprocess) ends; an AssertionError saying which, after `within_s` or at once when it
    ended (the caller reads its log)."""
    accept = ok or (lambda status: status == 200)
    async with aiohttp.ClientSession() as http:

        async def answered() -> str | None:
            if proc.returncode is not None:
                return "ended"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as resp:
                    return "ready" if accept(resp.status) else None
            return None

        seen = await until(answered, what=f"{url} answering", within_s=within_s)
    if seen == "ended":
        raise AssertionError(f"the process behind {url} ended (exit code {proc.returncode})")
