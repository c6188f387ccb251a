"""The load sweep: both arms at each offered load in turn, from low to high, until each arm breaks
the SLO or the ceiling is reached.

Arms are driven alike and one at a time: at every load the candidate and the reference run the
same conversations in the same order, one after the other, and the order is swapped from one
run to the next (so neither arm always runs on a warmer machine); with `repeats` > 1 each load
is run that many times per arm, interleaved, and the runs are pooled into one step. Running
the arms at once would let two engines on one host compete for it. An arm stops at its first
failing step: beyond it queues only grow. The conversation pool advances between runs, so a
run does not replay what the previous one just replayed (once the pool is used up it starts
over, and that is counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import aiohttp
import msgspec

from domain.capture import CapturedSession
from evaluators.capacity.estimate import StepData
from evaluators.capacity.goodput import Sample, step_stats
from evaluators.capacity.slo import Slo
from gateway.capacity.replay import Arm, StepRun, run_step, send_turn
from gateway.capacity.scrape import hit_rate, scrape


class SweepPlan(msgspec.Struct, frozen=True, kw_only=True):
    loads: tuple[int, ...]  # offered loads (concurrent conversations), increasing
    step_s: float  # length of one step
    timeout_s: float  # per request
    slo: Slo
    attainment: float  # a step passes when this share of its requests meets the SLO
    think_scale: float = 1.0
    # Each load is run this many times per arm (interleaved, order alternating) and pooled:
    # on a shared host one noisy run then cannot decide a step alone.
    repeats: int = 1


class _Pooled:
    """The runs of one arm at one load, pooled into one step (conversation ids kept apart)."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.duration_s = 0.0
        self.hit_rates: list[float] = []
        self._sessions = 0

    def add(self, run: StepRun, hit: float | None) -> None:
        base = self._sessions
        self.samples.extend(
            msgspec.structs.replace(x, session=x.session + base) for x in run.samples
        )
        self._sessions += run.sessions_started
        self.duration_s += run.duration_s
        if hit is not None:
            self.hit_rates.append(hit)

    def step(self, load: int) -> StepData:
        hit = sum(self.hit_rates) / len(self.hit_rates) if self.hit_rates else None
        return StepData(
            load=load, duration_s=self.duration_s, samples=self.samples, prefix_cache_hit_rate=hit
        )


class SweepOutcome(msgspec.Struct, kw_only=True):
    candidate: list[StepData]
    reference: list[StepData]
    replays: int  # conversations started, both arms
    repeated: int  # conversations replayed again at a later load after the pool ran out


async def run_sweep(
    candidate: Arm,
    reference: Arm,
    pool: Sequence[CapturedSession],
    plan: SweepPlan,
    *,
    on_step: Callable[[str, StepData, bool], None] | None = None,
    on_sample: Callable[[], None] | None = None,
) -> SweepOutcome:
    """Drive both arms through `plan.loads`; see the module docstring."""
    steps: dict[str, list[StepData]] = {"candidate": [], "reference": []}
    broken: set[str] = set()
    offset = replays = 0
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        # One unmeasured request per arm first: connection set-up and an engine's first-request
        # costs (compilation, allocation) belong to no load.
        for arm in (candidate, reference):
            await send_turn(http, arm, pool[0].turns[0], -1, plan.timeout_s)
        for i, load in enumerate(plan.loads):
            active = [
                (role, arm)
                for role, arm in (("candidate", candidate), ("reference", reference))
                if role not in broken
            ]
            runs: dict[str, _Pooled] = {role: _Pooled() for role, _ in active}
            for rep in range(plan.repeats):
                order = list(reversed(active)) if (i + rep) % 2 else active
                started = 0
                for role, arm in order:
                    before = await scrape(http, arm.url)
                    run = await run_step(
                        http,
                        arm,
                        pool,
                        load=load,
                        step_s=plan.step_s,
                        timeout_s=plan.timeout_s,
                        think_scale=plan.think_scale,
                        offset=offset,
                        on_sample=on_sample,
                    )
                    runs[role].add(run, hit_rate(before, await scrape(http, arm.url)))
                    replays += run.sessions_started
                    started = max(started, run.sessions_started)
                offset += started
            for role, _ in active:
                data = runs[role].step(load)
                steps[role].append(data)
                stats = step_stats(
                    data.samples, load=load, duration_s=data.duration_s, slo=plan.slo
                )
                passed = stats.attainment >= plan.attainment
                if not passed:
                    broken.add(role)
                if on_step is not None:
                    on_step(role, data, passed)
            if len(broken) == 2:
                break
    return SweepOutcome(
        candidate=steps["candidate"],
        reference=steps["reference"],
        replays=replays,
        repeated=max(0, offset - len(pool)),
    )
