"""The demo's ramp: once bi-kv is promoted, it is ramped on live traffic (1, 5, 25, 50, 100 % of
new sessions) while new sessions keep flowing, the controller alone walking its steps (no hand
advance) and the workers' guards watching; `fail_at_step` kills its simulator at that step to
show the guard's rollback. One terminal line per step: requests on each arm, fallbacks, and why
the controller left the step.

It reads the gateway only through its admin API and /metrics, as an operator would.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import aiohttp
import msgspec

from gateway.control.admin.ui import PAGE_PATH
from gateway.process.demo.arms import DemoOptions
from gateway.process.demo.children import Processes
from gateway.sim.workload import WorkloadSpec, run_workload

# The candidate the demo ramps once promoted, and its steps (percent of new sessions).
ROLLED_OUT = "bi-kv"
ROLLOUT_STEPS = (1.0, 5.0, 25.0, 50.0, 100.0)
# The longest the demo watches its ramp before saying where it stands (a quiet two-core host
# completes it in about 75 s; a busy one needs longer).
ROLLOUT_TIMEOUT_S = 150.0
_SAMPLE = re.compile(r"^(canary_rollout_(?:requests|fallbacks)_total)\{([^}]*)\} ([0-9.e+]+)$")


class _Traffic:
    """New sessions through the gateway, a batch after another, until `stop` (the ramp's live
    traffic: a weight change applies to new sessions only)."""

    def __init__(self, gateway_url: str, opts: DemoOptions, first_session: int) -> None:
        self.url, self.opts, self.next = gateway_url, opts, first_session
        self.requests = self.errors = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        n = 2 * self.opts.concurrency  # two batches' worth in flight would only add a tail
        while not self._stop.is_set():
            spec = WorkloadSpec(
                sessions=n,
                first_session=self.next,
                turns=self.opts.turns,
                concurrency=self.opts.concurrency,
                seed=self.opts.seed,
            )
            self.next += n
            done = await run_workload(self.url, spec)
            self.requests += done.requests
            self.errors += done.errors


async def _rollout_metrics(http: aiohttp.ClientSession, gateway_url: str) -> dict[str, float]:
    """Requests per arm and fallbacks so far, summed over the gateway's series."""
    out = {"production": 0.0, "candidate": 0.0, "fallbacks": 0.0}
    async with http.get(f"{gateway_url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if (m := _SAMPLE.match(line)) is None:
            continue
        if m[1] == "canary_rollout_fallbacks_total":
            out["fallbacks"] += float(m[3])
        elif (arm := re.search(r'arm="(\w+)"', m[2])) is not None and arm[1] in out:
            out[arm[1]] += float(m[3])
    return out


async def _admin(
    http: aiohttp.ClientSession, method: str, url: str, body: dict[str, object] | None = None
) -> tuple[int, dict[str, object]]:
    try:
        async with http.request(method, url, json=body) as resp:
            raw, status = await resp.read(), resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, {"error": {"message": repr(exc)}}
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return status, {"error": {"message": raw[:200].decode(errors="replace")}}
    return status, doc if isinstance(doc, dict) else {}


def _message(view: dict[str, object]) -> object:
    error = view.get("error")
    return error.get("message") if isinstance(error, dict) else view


async def run_rollout(
    gateway_url: str,
    opts: DemoOptions,
    procs: Processes,
    first_session: int,
    say: Callable[[str], None],
) -> str:
    """Ramp bi-kv on live traffic, the controller advancing each step (or kill its simulator at
    `opts.fail_at_step`); prints a line per step, returns the outcome's line."""
    admin = f"{gateway_url}/admin"
    steps, dwell = list(ROLLOUT_STEPS), opts.step_dwell_s
    say("")
    say(
        f"ramp: {ROLLED_OUT} is promoted; ramping it on live traffic, steps {steps} % of new "
        "sessions"
    )
    say(f"ramp: watch it live at {admin}{PAGE_PATH} (the Ramp panel)")
    say(
        "ramp: the controller walks the steps by itself: every look tests each arm for harm, "
        f"each step dwells at least {dwell:g} s and until a planted harm would have been "
        "caught at this demo's measured noise and rate, and 50 % asks for bi-kv's margins once; "
        "the workers' guards watch every candidate request"
    )
    traffic = _Traffic(gateway_url, opts, first_session)
    began = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with aiohttp.ClientSession(timeout=timeout) as http, asyncio.TaskGroup() as group:
        flowing = group.create_task(traffic.run(), name="demo-ramp-traffic")
        try:
            view = await _rollout_steps(http, admin, gateway_url, opts, procs, say)
        finally:
            traffic.stop()
        await flowing
        seen = await _rollout_metrics(http, gateway_url)
    errors = (
        f"{traffic.errors} client errors in {traffic.requests} requests during the ramp "
        f"({time.monotonic() - began:.0f} s)"
    )
    state = str(view.get("state"))
    events = view.get("events")
    last: dict[str, object] = events[-1] if isinstance(events, list) and events else {}
    how = f"by {last.get('actor')}: {last.get('reason')}"
    fallbacks = f"{seen['fallbacks']:.0f} fallbacks to production"
    if state == "completed":
        line = f"ramp: {ROLLED_OUT} completed at 100 % ({how}), it is the live endpoint; {errors}"
    elif state == "rolled_back":
        line = (
            f"ramp: rolled back automatically at {last.get('from_weight')} % ({how}; evidence "
            f"{last.get('evidence')}); {fallbacks}, {errors}"
        )
    elif state == "running":
        line = f"ramp: still running at {view.get('weight')} % when the demo stopped; {errors}"
    else:
        line = f"ramp: not started; {errors}"
    say(line)
    return line


async def _rollout_steps(
    http: aiohttp.ClientSession,
    admin: str,
    gateway_url: str,
    opts: DemoOptions,
    procs: Processes,
    say: Callable[[str], None],
) -> dict[str, object]:
    """Start the rollout and watch the controller walk its steps (no hand advance); returns the
    rollout as it ended (or as it stood after ROLLOUT_TIMEOUT_S)."""
    steps, dwell = list(ROLLOUT_STEPS), opts.step_dwell_s
    reason = f"canary demo: {ROLLED_OUT}'s report says promote"
    body = {"steps": steps, "min_step_s": dwell, "reason": reason}
    for _ in range(5):
        # The start asks the report process for a fresh report: an interim look taken a moment
        # after the demo's own may still read `hold` while the last rows are being stored.
        status, view = await _admin(http, "POST", f"{admin}/candidates/{ROLLED_OUT}/rollout", body)
        if status != 409 or "verdict_not_promote" not in str(view):
            break
        await asyncio.sleep(1.0)
    if status != 201:
        say(f"ramp: the gateway refused the start ({status}): {_message(view)}")
        return view
    # Its evaluation is over: mirror copies on top of the live sessions it now serves would
    # load its engine beyond production's (every copy of production's arm) and the ramp's
    # latency tests would see that load as the candidate's harm.
    patched, _ = await _admin(
        http, "PATCH", f"{admin}/candidates/{ROLLED_OUT}", {"sample_rate": 0.0}
    )
    if patched == 200:
        say(f"ramp: {ROLLED_OUT}'s mirror copies stopped (sample_rate 0): it serves live sessions")
    before = await _rollout_metrics(http, gateway_url)
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    shown, killed = 0, False  # steps printed so far; the simulator killed
    while True:
        state, step = view.get("state"), view.get("step")
        at = step if isinstance(step, int) else 0
        if opts.fail_at_step == at + 1 and not killed and state == "running":
            say(f"  step {at + 1}: killing {ROLLED_OUT}'s simulator; sessions keep flowing")
            await procs.stop(f"sim-{ROLLED_OUT}", timeout_s=5.0)
            killed = True
        done = state != "running" or time.monotonic() >= deadline
        # A step is printed once the controller has left it (or the ramp has ended in it).
        upto = at + 1 if done else at
        while shown < upto:
            now = await _rollout_metrics(http, gateway_url)
            served = {arm: now[arm] - before[arm] for arm in ("production", "candidate")}
            arms = "  ".join(
                f"{name} {served[arm]:>4.0f} req (~{served[arm] / opts.turns:.0f} sessions)"
                for name, arm in (("production", "production"), (ROLLED_OUT, "candidate"))
            )
            fell = now["fallbacks"] - before["fallbacks"]
            weight = steps[shown]
            why = _step_reason(view, weight)
            say(f"  step {shown + 1}/{len(steps)} {weight:>5g} %  {arms}  fallbacks {fell:.0f}")
            if why:
                say(f"    {why.strip()}")
            before = now
            shown += 1
        if done:
            return view
        await asyncio.sleep(0.25)
        _, view = await _admin(http, "GET", f"{admin}/rollout")


def _step_reason(view: dict[str, object], weight: float) -> str:
    """How the ramp left the step at `weight`: its event's kind, actor and reason, or ""."""
    events = view.get("events")
    for e in events if isinstance(events, list) else []:
        if isinstance(e, dict) and e.get("from_weight") == weight and e.get("kind") != "start":
            return f"  ({e.get('kind')} by {e.get('actor')}: {e.get('reason')})"
    return ""
