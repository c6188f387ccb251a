"""The demo's simulated labeller: a stand-in for a person, who labels the upgrade's pairs kept
for people while the demo's traffic runs, through the labelling API as a person's browser does
(`GET /admin/labels/upgrade/next`, then `POST /admin/labels/upgrade` with the offered `order`).

It knows the simulator's planted truth, which a person would have to judge: the grader
profile's taste without its position bias. It tells the two answers' styles apart by their
words (the upgrade's against production's, `gateway.sim.grader.is_new_style`), ties with the
profile's `grader_tie`, else prefers the upgrade's words with `grader_prefers_new` (two answers
of one style: either, half each), each draw seeded by the pair, so a run is reproducible. It
sees what a labeller sees (A and B in a random order) and never which arm is which; what the
grader said it never reads. Prints nothing; `Labelled.line` says what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Final, NamedTuple

import aiohttp

from gateway.process.demo.arms import LABEL_RATE, UPGRADE

# A pause between two labels: the labelling API shares the gateway's worker with production,
# and a person labels a pair in seconds; this stand-in still labels ten a second.
PAUSE_S: Final = 0.1
# With nothing to label, look again this often (new pairs are kept as the grader grades).
IDLE_S: Final = 1.0
# Once the demo's traffic stops, the pairs graded last are labelled for at most this long.
DRAIN_S: Final = 5.0
# One call of the labelling API, at most (the demo's host is busy).
CALL_S: Final = 30.0


class Labelled(NamedTuple):
    """What the simulated labeller did: its labels by choice, and why it stopped early if so."""

    a: int = 0
    b: int = 0
    tie: int = 0
    refused: str = ""

    @property
    def total(self) -> int:
        return self.a + self.b + self.tie

    def line(self) -> str:
        """The demo's line: what the stand-in labelled, said to be one."""
        who = "simulated labeller (a stand-in for a person, it knows the simulator's planted truth)"
        if self.refused:
            return f"{who}: the labelling API refused: {self.refused}"
        return (
            f"{who}: labelled {self.total} of {UPGRADE}'s pairs kept for people (label_rate "
            f"{LABEL_RATE:g}): {self.a} A, {self.b} B, {self.tie} ties, blind, in the shown order"
        )


def choose(answer_a: str, answer_b: str, key: str, seed: int) -> str:
    """The planted truth's label of a pair shown as A and B: "A", "B" or "tie"."""
    from gateway.sim.grader import is_new_style
    from gateway.sim.profiles import get_profile

    taste = get_profile("grader")
    rng = random.Random(f"{seed}:{key}")
    if rng.random() < taste.grader_tie:
        return "tie"
    a_new, b_new = is_new_style(answer_a), is_new_style(answer_b)
    if a_new == b_new:
        return "A" if rng.random() < 0.5 else "B"
    new, old = ("A", "B") if a_new else ("B", "A")
    return new if rng.random() < taste.grader_prefers_new else old


async def simulated_labeller(gateway_url: str, stop: asyncio.Event, seed: int) -> Labelled:
    """Label the upgrade's kept pairs until `stop` is set, then those left for `DRAIN_S`."""
    base = f"{gateway_url}/admin/labels/{UPGRADE}"
    counts = {"A": 0, "B": 0, "tie": 0}
    drain_until: float | None = None
    loop = asyncio.get_running_loop()
    timeout = aiohttp.ClientTimeout(total=CALL_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while drain_until is None or loop.time() < drain_until:
            if drain_until is None and stop.is_set():
                drain_until = loop.time() + DRAIN_S
            try:
                async with http.get(f"{base}/next") as resp:
                    body = await resp.json()
                    if resp.status != 200:
                        return _labelled(counts, refused=_message(body))
                pair = body.get("pair")
                if pair is None:
                    if drain_until is not None:
                        break  # every pair kept so far is labelled
                    await _wait(stop, IDLE_S)
                    continue
                answer = choose(pair["answer_a"], pair["answer_b"], pair["exchange_id"], seed)
                label = {"exchange_id": pair["exchange_id"], "order": pair["order"]}
                async with http.post(base, json={**label, "answer": answer}) as resp:
                    if resp.status == 201:
                        counts[answer] += 1
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass  # a busy or restarting gateway: look again after the pause
            await _wait(stop if drain_until is None else None, PAUSE_S)
    return _labelled(counts)


def _labelled(counts: dict[str, int], refused: str = "") -> Labelled:
    return Labelled(a=counts["A"], b=counts["B"], tie=counts["tie"], refused=refused)


def _message(body: object) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else str(body)


async def _wait(stop: asyncio.Event | None, seconds: float) -> None:
    """Sleep `seconds`, or less when `stop` is set meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
