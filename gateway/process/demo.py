"""`canary demo`: the whole loop — mirror, measure, decide — on one machine, in about a minute.

Starts four engine simulators (production, a `control` with production's profile, a `bi-kv`
candidate that keeps each session's KV cache, and a `quantized` candidate whose answers sometimes
diverge), a gateway in front of production with SQLite in a temporary directory, and drives
agent-like multi-turn sessions through it a batch at a time, asking the gateway for each
candidate's verdict between batches, until every candidate is promoted or rejected (the
intervals are valid at any look, so looking as often as it likes costs nothing) or
`max_sessions` is reached, and says which ended it. A promoted bi-kv is then ramped on live
traffic (1, 5, 25, 50, 100 % of new sessions), the controller alone walking its steps (a short
`min_step_s`, each step's dwell sized by power at the demo's own measured noise and rate) while
it and the workers' guards watch for harm; `fail_at_step` kills its simulator at that step to
show the guard's rollback. Then it stops the gateway (which drains
the mirror and flushes storage), prints both candidates' reports (as they stood at the
verdicts) and writes their HTML forms.

Every process it starts is its own child; all are stopped on exit, on error and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

import aiohttp
import msgspec

from domain.errors import CanaryError
from gateway.control.admin.ui import PAGE_PATH
from gateway.lifecycle import die_with_parent
from gateway.sim.workload import WorkloadSpec, run_workload

# name, simulator profile, extra `canary sim` flags, candidate kind (None: production)
ARMS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("live", "baseline", (), None),
    ("control", "control", (), "control"),
    ("bi-kv", "bi-kv", (), "bi-kv"),
    ("quantized", "quantized", ("--divergence", "0.3", "--logprob-shift", "0.1"), "quantized"),
)

CONFIG_TEMPLATE = """\
# Written by `canary demo`: a gateway in front of a simulated production engine, with three
# simulated candidates mirrored whole sessions at a time.
[server]
listen = "127.0.0.1:{gateway_port}"
log_format = "json"

[live]
url = "{live_url}"
price_per_hour_usd = 2.0

[storage]
db_url = "sqlite+aiosqlite:///{db_path}"
registry_poll_interval_s = 1.0
counters_flush_interval_s = 1.0

[admin]
insecure = true

[reports]
# The demo asks for both candidates' verdicts between batches of sessions; beside four busy
# simulators an idle-priority report process would answer late (keep "idle" in production).
priority = "normal"

[mirror]
# Five processes share this machine's cores, so scheduling delays show up as event-loop lag
# and the gateway may use a whole core; production here is a simulator, so the demo's loop
# guard tolerates more lag and no CPU limit (in a real deployment keep the defaults).
shed_loop_lag_ms = 250.0
shed_cpu_busy = 0.0
# The mirror process meters the candidates' answers; at idle priority, beside four busy
# simulators, its wake-ups land late and every candidate TTFT carries that delay. The demo's
# production is a simulator, so the mirror runs at normal priority here (keep "idle" in a real
# deployment, where the engines are not on the gateway's cores).
priority = "normal"
# Scoring copies (the quantized candidate and the control score production's answers): a few
# at once per simulator, so scoring keeps up with the demo's traffic.
score_concurrency = 4

[rollout]
# The demo's ramp dwells a few seconds per step: the controller judges every second (default
# 2 s) so that the 100 % step completes soon after its dwell.
controller_interval_s = 1.0
{candidates}"""

CANDIDATE_TEMPLATE = """
[[candidates]]
name = "{name}"
url = "{url}"
kind = "{kind}"
sample_rate = 1.0
sampling = "session"
concurrency = 16
{scoring}price_per_hour_usd = {price}
# 100 sessions can show a rate within about 3.7/100 ≈ 4 pp at best (sessions are the unit of
# independence); the defaults (0.5 pp failures, 1 pp agreement) need ~750 / ~375 sessions.
# The demo accepts 5 pp so that it can decide within a minute; and its four simulators share
# this machine's cores with the gateway, so their timings carry scheduling noise that a real
# engine's would not (TPOT of the KV-keeping simulator moves with its batch): latency gets a
# 20 % margin, under the 25 % critical one.
[candidates.verdict]
latency_delta = 1.2
error_delta = 0.05
error_critical = 0.1
slo_exceedance_delta = 0.05
agreement_delta = 0.05
similarity_delta = 0.05
# The ramp (docs/ramp.md): at the demo's ~9 new sessions a second, a 5 % step would need 600
# sessions for its candidate arm to reach the 30 a test needs, so 1 % and 5 % are smoke steps
# of min_step_s and the dwells are sized from 25 % on; and its failure dwell is sized for a
# candidate failing half its sessions (a dead engine; the guards stop that at once anyway), not
# +3 pp, which at this demo's zero background failures needs ~900 sessions at 25 %.
ramp_ttft_from = 25.0
ramp_failure_harm = 0.5
"""


# The quantized candidate scores half its pairs (its default, 0.1, leaves a one-minute demo
# with too few scored pairs to decide `logprob_divergence`).
SCORING = {"quantized": "score_rate = 0.5\n"}


# Candidates whose verdicts the demo waits for (the control's is the noise floor, not a goal).
DECIDING = ("bi-kv", "quantized")
DECIDED = ("promote", "reject")
# The candidate the demo ramps once promoted, and its steps (percent of new sessions).
RAMPED = "bi-kv"
RAMP_STEPS = (1.0, 5.0, 25.0, 50.0, 100.0)
# The longest the demo watches its ramp before saying where it stands.
RAMP_TIMEOUT_S = 90.0
_SAMPLE = re.compile(r"^(canary_rollout_(?:requests|fallbacks)_total)\{([^}]*)\} ([0-9.e+]+)$")


class DemoOptions(msgspec.Struct, kw_only=True):
    sessions: int = 0  # > 0: exactly this many, no looking; 0: until every verdict is decided
    max_sessions: int = 600  # the cap when driving until decided
    batch: int = 20  # sessions between two looks
    turns: int = 6
    concurrency: int = 16
    time_scale: float = 0.25
    keep: bool = False
    out_dir: str = "canary-reports"
    seed: int = 0
    step_dwell_s: float = 3.0  # each ramp step's minimum dwell (the rollout's min_step_s)
    fail_at_step: int = 0  # > 0: kill bi-kv's simulator when the ramp reaches this step (1-based)


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # handed to the child process; closed right after the spawn


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:]


def _write_reports(out_dir: Path, name: str, html: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.html"
    path.write_text(html, encoding="utf-8")
    return path.resolve()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Processes:
    """The child processes of the demo; `stop_all` terminates them, then kills stragglers."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.children: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, *args: str) -> asyncio.subprocess.Process:
        log = _open_log(self.logdir / f"{name}.log")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli.main",
            *args,
            stdout=log,
            stderr=log,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops its children itself
            preexec_fn=functools.partial(die_with_parent, os.getpid()),  # ... or the kernel does
        )
        log.close()
        self.children.append((name, proc))
        return proc

    async def stop(self, name: str, timeout_s: float = 15.0) -> None:
        for child_name, proc in self.children:
            if child_name == name:
                await self._stop(proc, timeout_s)

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(p, 5.0) for _, p in reversed(self.children)))


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, what: str, log: Path) -> None:
    deadline = time.monotonic() + 30.0
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = _tail(log)
                raise CanaryError(f"{what} exited with code {proc.returncode}:\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise CanaryError(f"{what} did not become ready at {url} within 30 s (log: {log})")


@contextlib.asynccontextmanager
async def _workdir(keep: bool) -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="canary-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


class ProgressBar(Protocol):
    """What the demo needs of a progress bar (the CLI passes `gateway.cli.progress.Progress`)."""

    def advance(self, n: int = 1) -> None: ...
    def note(self, status: str) -> None: ...
    def __enter__(self) -> ProgressBar: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class _NoProgress:
    def advance(self, n: int = 1) -> None:
        pass

    def note(self, status: str) -> None:
        pass

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


async def run_demo(
    opts: DemoOptions, progress: Callable[[int, str], ProgressBar] = lambda n, label: _NoProgress()
) -> int:
    """Run the demo; returns the process exit code. `progress(total, label)`: the bar the
    workload advances (the CLI's; none by default)."""
    started = time.monotonic()
    # SIGTERM cancels the demo like Ctrl-C does, so the `finally` below stops every child.
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with _workdir(opts.keep) as work:
        procs = _Processes(work)
        try:
            return await _run(opts, work, procs, started, progress)
        finally:
            await procs.stop_all()


async def _run(
    opts: DemoOptions,
    work: Path,
    procs: _Processes,
    started: float,
    progress: Callable[[int, str], ProgressBar],
) -> int:
    say = print
    urls: dict[str, str] = {}
    prices = {"control": 2.0, "bi-kv": 2.0, "quantized": 1.2}
    say(f"canary demo: working directory {work}")
    for name, profile, extra, _kind in ARMS:
        port = _free_port()
        urls[name] = f"http://127.0.0.1:{port}"
        await procs.start(
            f"sim-{name}",
            "sim",
            "--port",
            str(port),
            "--profile",
            profile,
            "--time-scale",
            str(opts.time_scale),
            "--seed",
            str(opts.seed),
            *extra,
        )
    gateway_port = _free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    db_path = work / "canary.db"
    candidates = "".join(
        CANDIDATE_TEMPLATE.format(
            name=name, url=urls[name], kind=kind, price=prices[name], scoring=SCORING.get(kind, "")
        )
        for name, _p, _e, kind in ARMS
        if kind is not None
    )
    config_path = work / "demo.toml"
    config_path.write_text(
        CONFIG_TEMPLATE.format(
            gateway_port=gateway_port,
            live_url=urls["live"],
            db_path=db_path,
            candidates=candidates,
        )
    )
    for name, _p, _e, _k in ARMS:
        proc = next(p for n, p in procs.children if n == f"sim-{name}")
        await _wait_ready(
            f"{urls[name]}/health", proc, f"simulator {name}", work / f"sim-{name}.log"
        )
    gateway = await procs.start("gateway", "serve", "--config", str(config_path))
    await _wait_ready(f"{gateway_url}/readyz", gateway, "gateway", work / "gateway.log")
    say(f"gateway on {gateway_url} in front of {urls['live']} (SQLite: {db_path})")
    say("candidates: control (same profile as production), bi-kv (keeps session KV), quantized")

    summary, sent, verdicts = await _drive(gateway_url, opts, progress, say)
    say(summary)
    verdicts_at = time.time()
    ramp_line = None
    if verdicts.get(RAMPED) == "promote":
        ramp_line = await _ramp(gateway_url, opts, procs, sent, say)
    else:
        say(f"no ramp: {RAMPED}'s verdict is {verdicts.get(RAMPED, 'not asked')!r}, not 'promote'")
    if opts.keep:
        return await _keep_running(gateway_url, urls, config_path, db_path)

    say("stopping the gateway (drains the mirror, flushes storage)...")
    await procs.stop("gateway", timeout_s=30.0)
    await procs.stop_all()
    # The reports as they stood at the verdicts: the ramp's traffic is the rollout's evidence.
    until = verdicts_at if ramp_line is not None else None
    code = await _print_reports(f"sqlite+aiosqlite:///{db_path}", Path(opts.out_dir), until)
    if ramp_line is not None:
        say(ramp_line)
    say(f"demo finished in {time.monotonic() - started:.0f} s")
    return code


async def _drive(
    gateway_url: str,
    opts: DemoOptions,
    progress: Callable[[int, str], ProgressBar],
    say: Callable[[str], None],
) -> tuple[str, int, dict[str, str]]:
    """Send sessions a batch at a time until every deciding candidate is decided (or exactly
    `opts.sessions` when set, then look once); returns the line that says what ended it, the
    sessions sent and the last verdicts."""
    fixed = opts.sessions > 0
    total = opts.sessions if fixed else opts.max_sessions
    step = total if fixed else opts.batch
    sent = requests = errors = 0
    wall = 0.0
    verdicts: dict[str, str] = {}
    with progress(total * opts.turns, "agent sessions through the gateway") as bar:
        while sent < total:
            n = min(step, total - sent)
            spec = WorkloadSpec(
                sessions=n,
                first_session=sent,
                turns=opts.turns,
                concurrency=opts.concurrency,
                seed=opts.seed,
            )
            done = await run_workload(gateway_url, spec, progress=bar.advance)
            sent += n
            requests += done.requests
            errors += done.errors
            wall += done.wall_s
            if fixed:
                break
            verdicts = await _verdicts(gateway_url)
            bar.note(" ".join(f"{name}: {verdicts[name]}" for name in DECIDING))
            if all(verdicts[name] in DECIDED for name in DECIDING):
                break
    traffic = (
        f"sent {requests} requests ({sent} sessions) in {wall:.1f} s, {errors} production errors"
    )
    if fixed:
        # One look after the planned traffic, to know whether bi-kv may be ramped.
        return traffic, sent, await _verdicts(gateway_url)
    if all(verdicts.get(name) in DECIDED for name in DECIDING):
        return f"{traffic}; every candidate decided after {sent} sessions", sent, verdicts
    open_ = ", ".join(n for n in DECIDING if verdicts.get(n) not in DECIDED)
    return (
        f"{traffic}; stopped at the cap (--max-sessions {opts.max_sessions}), not by the "
        f"evidence: {open_} still undecided",
        sent,
        verdicts,
    )


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


async def _await_state(
    http: aiohttp.ClientSession, admin: str, states: tuple[str, ...], timeout_s: float
) -> dict[str, object]:
    """The rollout once its state is one of `states`, or as it is after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, view = await _admin(http, "GET", f"{admin}/rollout")
        if view.get("state") in states or time.monotonic() >= deadline:
            return view
        await asyncio.sleep(0.25)


async def _ramp(
    gateway_url: str,
    opts: DemoOptions,
    procs: _Processes,
    first_session: int,
    say: Callable[[str], None],
) -> str:
    """Ramp bi-kv on live traffic, the controller advancing each step (or kill its simulator at
    `opts.fail_at_step`); prints a line per step, returns the outcome's line."""
    admin = f"{gateway_url}/admin"
    steps, dwell = list(RAMP_STEPS), opts.step_dwell_s
    say("")
    say(f"ramp: {RAMPED} is promoted; ramping it on live traffic, steps {steps} % of new sessions")
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
            view = await _ramp_steps(http, admin, gateway_url, opts, procs, say)
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
        line = f"ramp: {RAMPED} completed at 100 % ({how}), it is the live endpoint; {errors}"
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


async def _ramp_steps(
    http: aiohttp.ClientSession,
    admin: str,
    gateway_url: str,
    opts: DemoOptions,
    procs: _Processes,
    say: Callable[[str], None],
) -> dict[str, object]:
    """Start the rollout and watch the controller walk its steps (no hand advance); returns the
    rollout as it ended (or as it stood after RAMP_TIMEOUT_S)."""
    steps, dwell = list(RAMP_STEPS), opts.step_dwell_s
    reason = f"canary demo: {RAMPED}'s report says promote"
    body = {"steps": steps, "min_step_s": dwell, "reason": reason}
    for _ in range(5):
        # The start asks the report process for a fresh report: an interim look taken a moment
        # after the demo's own may still read `hold` while the last rows are being stored.
        status, view = await _admin(http, "POST", f"{admin}/candidates/{RAMPED}/rollout", body)
        if status != 409 or "verdict_not_promote" not in str(view):
            break
        await asyncio.sleep(1.0)
    if status != 201:
        say(f"ramp: the gateway refused the start ({status}): {_message(view)}")
        return view
    before = await _rollout_metrics(http, gateway_url)
    deadline = time.monotonic() + RAMP_TIMEOUT_S
    shown, killed = 0, False  # steps printed so far; the simulator killed
    while True:
        state, step = view.get("state"), view.get("step")
        at = step if isinstance(step, int) else 0
        if opts.fail_at_step == at + 1 and not killed and state == "running":
            say(f"  step {at + 1}: killing {RAMPED}'s simulator; sessions keep flowing")
            await procs.stop(f"sim-{RAMPED}", timeout_s=5.0)
            killed = True
        done = state != "running" or time.monotonic() >= deadline
        # A step is printed once the controller has left it (or the ramp has ended in it).
        upto = at + 1 if done else at
        while shown < upto:
            now = await _rollout_metrics(http, gateway_url)
            served = {arm: now[arm] - before[arm] for arm in ("production", "candidate")}
            arms = "  ".join(
                f"{name} {served[arm]:>4.0f} req (~{served[arm] / opts.turns:.0f} sessions)"
                for name, arm in (("production", "production"), (RAMPED, "candidate"))
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


async def _verdicts(gateway_url: str) -> dict[str, str]:
    """Each deciding candidate's verdict now, from the gateway's report process (an interim
    look: valid whenever it is taken); "pending" when a report is not available yet."""
    out: dict[str, str] = {}
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for name in DECIDING:
            url = f"{gateway_url}/admin/candidates/{name}/report"
            try:
                async with http.get(url) as resp:
                    body = await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            out[name] = (
                str(msgspec.json.decode(body).get("verdict", "pending")) if ok else "pending"
            )
    return out


async def _print_reports(db_url: str, out_dir: Path, until: float | None) -> int:
    from evaluators.judge.settings import VerdictSettings
    from evaluators.report.build import evaluate
    from evaluators.report.render import render
    from storage.engine import make_engine

    engine = make_engine(db_url)
    try:
        for name in ("bi-kv", "quantized"):
            # The demo's traffic is over: this is its planned final look.
            report = await evaluate(
                engine, name, until=until, settings=VerdictSettings(), planned_look=True
            )
            print()
            print(render(report, "text"))
            html_path = _write_reports(out_dir, name, render(report, "html"))
            print(f"HTML report: {html_path}")
    finally:
        await engine.dispose()
    return 0


async def _keep_running(gateway: str, urls: dict[str, str], config: Path, db: Path) -> int:
    db_url = f"sqlite+aiosqlite:///{db}"
    print(
        f"""
Everything is still running (Ctrl-C stops it all):
  gateway      {gateway}   (metrics: {gateway}/metrics, admin: {gateway}/admin/status)
  live page    {gateway}/admin{PAGE_PATH}   (open it in a browser: no token on loopback)
  production   {urls["live"]}
  candidates   control {urls["control"]}, bi-kv {urls["bi-kv"]}, quantized {urls["quantized"]}
  config       {config}

Try:
  canary candidates list --admin-url {gateway}
  canary candidates show bi-kv --admin-url {gateway}
  canary report bi-kv --db {db_url}
  canary report quantized --db {db_url} --planned-look --format html --out quantized.html
  curl -s {gateway}/admin/candidates/bi-kv/gate
  canary promote bi-kv --admin-url {gateway} --reason "demo"
  canary rollback --admin-url {gateway}
""",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stopping...")
    return 0
