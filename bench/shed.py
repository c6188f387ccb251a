"""Shedding that keeps capacity (issue 44): an open-loop sweep on one worker.

    .venv/bin/python bench/shed.py [--start 100] [--seconds 10] [--settle 4]
        [--delay-ms 20] [--concurrency 4] [--workers 1] [--rounds 2] [--priority normal]
        [--candidate-nice 0] [--capacity RPS] [--token-counter off|auto] [--grading]

Two `canary serve --workers N` run side by side in front of a live endpoint that answers at
once: one with a candidate at `sample_rate` 1.0 that answers after `--delay-ms`,
`--concurrency` copies at once (its capacity is set by the candidate, about concurrency / delay
copies a second, so a Python load generator on a shared 2-core host can offer twice it), the
other with no candidate (mirroring off). Only one of them has load at a time. Both upstreams
run in a child process of their own (uvloop); the load runs here, open loop (requests on a
fixed schedule over 32 keep-alive connections, whatever the answers take). The loop guard is
left at its defaults; the mirror process runs at `--priority` (normal by default: on a shared
host SCHED_IDLE measures the others).

1. Sweep: offered requests (= copies) per second from `--start` up in steps of 10 %, each for
   `--seconds`, measured after `--settle`: the copies the candidate received per second against
   the copies offered. The capacity is the highest offered rate that keeps >= 99 % (a step
   that does not is run once more before the sweep ends: a busy host stalls for seconds).
2. Overload, `--rounds` times: 1.5x and 2x that capacity, each with mirroring on then off
   (alternate steps, so the host's drifting load lands on both): copies kept per second against
   those kept at capacity (target >= 90 %), and production's p99 over every round's latencies,
   on against off (target <= 1.3x); the worker's shed and overflow counts.

Whole sessions (issue 56), `--sessions`: the load is three-turn conversations with their
history, `X-Session-ID` and the candidate at session sampling 1.0 (`--think-ms` between a turn's
answer and the next turn), offered at 1x and 2x `--capacity` (mirroring on only, `--rounds`
times). The candidate logs the (session, turn) of every copy it answers; of the sessions whose
three production turns all ran in the measured window and that the candidate answered at all,
a session is **headless** when the candidate answered a turn without every earlier one. Printed
per load: copies kept per second (and against 1x), headless sessions and their share, and the
copy accounting (every copy accounted for: `identity`).

Token counting and grading are off by default (the targets are stated with them off). Both
upstreams answer every request with a few words of its own, so each pair's text is distinct, as
in real traffic: `--token-counter auto` counts every answer with the candidate's `/tokenize`
(one request a pair: production and candidate say the same), `--grading` makes the candidate a
model upgrade graded on every pair, both orders, by the simulator's grader (`canary sim
--profile grader`, answering at once). The mirror process's cores in the overload table then
say what each costs.

A benchmark, not a test: it asserts nothing. It prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from overhead import host_series  # noqa: E402  (a sibling)

from bench._shared.ports import free_port  # noqa: E402
from domain.accounting import IDENTITY_FIELDS  # noqa: E402

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
CLIENTS = 32


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request: a few words of its own (every pair's text distinct, so a token
    counter or a grader does the work of real traffic), the same from both upstreams."""
    words = str(request["messages"][-1]["content"]).split()
    message = {"role": "assistant", "content": "ok " + " ".join(words[-2:])}
    return {**ANSWER, "choices": [{**ANSWER["choices"][0], "message": message}]}


def _upstream(port: int, delay_s: float | None, nice: int) -> None:
    """A child process: the live endpoint (`delay_s` None: answers at once) or the candidate
    (answers after `delay_s`, counts its copies). Each has a process of its own, so the copies
    never slow production's upstream (a real candidate is another engine); the candidate runs
    at `nice` (it stands for an engine that is not on the gateway's cores)."""
    import uvloop

    os.nice(nice)
    count = [0]
    answered: list[tuple[str, int]] = []  # (session, turn) of each copy answered

    async def live(request: web.Request) -> web.Response:
        return web.json_response(_answer(await request.json()))

    async def candidate(request: web.Request) -> web.Response:
        doc = await request.json()
        await asyncio.sleep(delay_s or 0.0)
        count[0] += 1
        if session := request.headers.get("X-Session-ID"):
            turn = sum(1 for m in doc["messages"] if m["role"] == "assistant")
            answered.append((session, turn))
        return web.json_response(_answer(doc))

    async def answers(request: web.Request) -> web.Response:
        return web.json_response(answered)

    async def tokenize(request: web.Request) -> web.Response:
        """vLLM's /tokenize, a word a token: what the mirror's token counter asks."""
        doc = await request.json()
        words = len(str(doc.get("prompt", "")).split())
        return web.json_response({"count": words, "max_model_len": 4096, "tokens": [1] * words})

    async def counted(request: web.Request) -> web.Response:
        return web.json_response({"copies": count[0]})

    async def main() -> None:
        app = web.Application()
        if delay_s is None:
            app.add_routes([web.post("/v1/chat/completions", live)])
        else:
            app.add_routes([
                web.post("/v1/chat/completions", candidate), web.get("/count", counted),
                web.post("/tokenize", tokenize), web.get("/answered", answers),
            ])  # fmt: skip
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(main())


_HZ = os.sysconf("SC_CLK_TCK")


_SCHED_IDLE = 5
_CORES = ("production_cores", "mirror_cores", "report_cores")


def _stat(pid: int) -> tuple[float, bool]:
    """CPU seconds (user + system) of one process so far (0 once it is gone), and whether it
    runs at SCHED_IDLE (the report process does)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, False
    return (int(fields[11]) + int(fields[12])) / _HZ, int(fields[38]) == _SCHED_IDLE


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


class _Cpu:
    """CPU of a gateway's production processes (the serve process tree but the mirror process
    and the SCHED_IDLE report process), of its mirror process and of its report process."""

    def __init__(self, serve_pid: int, mirror_pid: int | None) -> None:
        self.serve_pid, self.mirror_pid = serve_pid, mirror_pid

    def read(self) -> tuple[float, float, float]:
        production = mirror = idle = 0.0
        for pid in _tree(self.serve_pid):
            cpu, sched_idle = _stat(pid)
            if pid == self.mirror_pid:
                mirror += cpu
            elif sched_idle:
                idle += cpu
            else:
                production += cpu
        return production, mirror, idle


async def _serve(tmp: Path, config: Path, live_port: int, workers: int) -> tuple[object, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli.main", "serve",
        "--listen", f"127.0.0.1:{port}", "--db", f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
        "--workers", str(workers), "--config", str(config), "--insecure-admin",
        "--live", f"http://127.0.0.1:{live_port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):
            try:
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return proc, url
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("canary serve did not become ready")


async def _mirror_pid(url: str) -> int | None:
    """The gateway's mirror process (from its `canary_mirror_process_info` metric)."""
    for key in await _metrics(url):
        if key.startswith("canary_mirror_process_info{"):
            return int(key.split('pid="', 1)[1].split('"', 1)[0])
    return None


async def _copies(cand_url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(cand_url + "/count") as resp:
        return int((await resp.json())["copies"])


async def _metrics(url: str) -> dict[str, float]:
    """The host's series from one scrape, summed over the workers (`host_series`)."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        return host_series(await resp.text())


async def _step(
    url: str,
    cand_url: str | None,
    rps: float,
    seconds: float,
    settle: float,
    cpu: _Cpu | None = None,
) -> dict[str, Any]:
    """Offer `rps` for `seconds`; copies kept per second, production latencies and (with
    `cpu`) the cores production and the mirror process used, measured over [settle, seconds]."""
    start = time.monotonic()
    sent_in_window = [0]
    lat: list[float] = []
    n = int(rps * seconds)
    marks: dict[str, int] = {}
    cores: dict[str, tuple[float, float, float]] = {}

    async def client(idx: int) -> None:
        async with aiohttp.ClientSession() as http:
            for i in range(idx, n, CLIENTS):
                due = start + i / rps
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                t0 = time.monotonic()
                async with http.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"{start} {i}"}]},
                    headers={"X-Request-ID": f"{start}-{i}"},
                ) as resp:
                    await resp.read()
                if due - start >= settle:
                    sent_in_window[0] += 1
                    lat.append(time.monotonic() - t0)

    async def mark() -> None:
        for key, at in (("a", settle), ("b", seconds)):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            if cpu is not None:
                cores[key] = cpu.read()
            if cand_url is not None:
                marks[key] = await _copies(cand_url)

    await asyncio.gather(mark(), *(client(c) for c in range(CLIENTS)))
    window = seconds - settle
    lat.sort()
    kept = (marks["b"] - marks["a"]) / window if cand_url else 0.0
    offered = sent_in_window[0] / window
    if cores:
        pairs = zip(_CORES, cores["a"], cores["b"], strict=True)
        cores_used = {name: (b - a) / window for name, a, b in pairs}
    else:
        cores_used = {}
    return {
        **cores_used,
        "target": rps,
        "offered": offered,
        "kept": kept,
        "ratio": kept / offered if offered else 0.0,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
        "lat": lat,
    }


TURNS = 3


async def _session_step(
    url: str, cand_url: str, rps: float, seconds: float, settle: float, think_s: float
) -> dict[str, Any]:
    """Offer `rps` requests/s as three-turn conversations (rps / 3 new ones a second, each turn
    after the previous answer and `think_s`) for `seconds`; copies kept per second over
    [settle, seconds] and the headless share among the sessions begun in that window."""
    start = time.monotonic()
    n = int(rps / TURNS * seconds)
    done: dict[str, int] = {}  # session -> production turns answered 200

    async def conversation(http: aiohttp.ClientSession, i: int) -> None:
        await asyncio.sleep(max(0.0, start + i * TURNS / rps - time.monotonic()))
        sid = f"{start:.0f}-{i}"
        messages: list[dict[str, str]] = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"{sid} turn {turn} words"})
            async with http.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": messages},
                headers={"X-Session-ID": sid, "X-Request-ID": f"{sid}-{turn}"},
            ) as resp:
                doc = await resp.json()
                if resp.status != 200:
                    return
            done[sid] = turn + 1
            messages.append(doc["choices"][0]["message"])
            await asyncio.sleep(think_s)

    marks: dict[str, int] = {}

    async def mark() -> None:
        for key, at in (("a", settle), ("b", seconds)):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            marks[key] = await _copies(cand_url)

    connector = aiohttp.TCPConnector(limit=CLIENTS * 2)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(mark(), *(conversation(http, i) for i in range(n)))
    await asyncio.sleep(2.0)  # the mirror's queue drains (what it kept is answered by now)
    async with aiohttp.ClientSession() as http, http.get(cand_url + "/answered") as resp:
        answered = await resp.json()
    got: dict[str, set[int]] = {}
    for sid, turn in answered:
        got.setdefault(sid, set()).add(turn)
    first = int(settle * rps / TURNS)  # sessions begun in the measured window
    window = {f"{start:.0f}-{i}" for i in range(first, n)}
    whole = [sid for sid in window if done.get(sid) == TURNS]
    answered_any = [sid for sid in whole if got.get(sid)]
    headless = [sid for sid in answered_any if got[sid] != set(range(len(got[sid])))]
    kept = (marks["b"] - marks["a"]) / (seconds - settle)
    return {
        "target": rps,
        "kept": kept,
        "sessions": len(whole),
        "answered": len(answered_any),
        "headless": len(headless),
        "share": len(headless) / max(1, len(answered_any)),
    }


async def _sessions(args: argparse.Namespace, on_url: str, cand_url: str) -> None:
    """The whole-sessions run: 1x and 2x `--capacity`, `--rounds` times, mirroring on."""
    before = await _metrics(on_url)
    rows: list[tuple[float, dict[str, Any]]] = []
    for _ in range(args.rounds):
        for factor in (1.0, 2.0):
            row = await _session_step(
                on_url, cand_url, args.capacity * factor, args.overload_seconds, args.settle,
                args.think_ms / 1000,
            )  # fmt: skip
            rows.append((factor, row))
            print(f"{factor}x {row}", file=sys.stderr, flush=True)
    after = await _metrics(on_url)
    print(
        f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, workers {args.workers}, "
        f"candidate {args.concurrency} at once, {args.delay_ms:g} ms each, "
        f"--capacity {args.capacity:g}, think {args.think_ms:g} ms"
    )
    at_1x = statistics.mean(r["kept"] for f, r in rows if f == 1.0)
    print("| load | offered req/s | kept copies/s | kept vs 1x | sessions (3 turns) "
          "| answered at all | headless | headless share |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for factor, row in rows:
        print(
            f"| {factor:g}x | {row['target']:.0f} | {row['kept']:.1f} | "
            f"{row['kept'] / at_1x:.0%} | {row['sessions']} | {row['answered']} | "
            f"{row['headless']} | {row['share']:.2%} |"
        )
    counts = {}
    for k in [k for k in after if k.startswith("canary_mirror_copies_total")]:
        counts[k.split('outcome="', 1)[1].split('"', 1)[0]] = after[k] - before.get(k, 0.0)
        print(f"{k}: {after[k] - before.get(k, 0.0):.0f}")
    key = 'canary_mirror_handoff_dropped_total{candidate="c",reason="%s"}'
    for reason in ("shed_capacity", "dropped_overflow"):
        got = after.get(key % reason, 0.0) - before.get(key % reason, 0.0)
        print(f"worker {reason}: {got:.0f}")
    out = sum(counts.get(k, 0.0) for k in IDENTITY_FIELDS[1:7])  # every way out of `sampled`
    ended = sum(counts.get(k, 0.0) for k in ("observed_ok", "observed_error", "timed_out"))
    pending = after.get('canary_mirror_pending{candidate="c"}', 0.0)
    print(
        f"identity: sampled {counts.get('sampled', 0):.0f} = out {out:.0f} + sent "
        f"{counts.get('sent', 0):.0f} + pending {pending:.0f}; sent = ended {ended:.0f}"
    )


def _config(
    path: Path, cand_port: int | None, args: argparse.Namespace, grader: str | None = None
) -> None:
    text = "counters_flush_interval_s = 1.0\nregistry_poll_interval_s = 1.0\n"
    text += f'mirror_priority = "{args.priority}"\ntoken_counter = "{args.token_counter}"\n'
    if cand_port is not None:
        text += (
            f"[[candidates]]\nname = 'c'\nurl = 'http://127.0.0.1:{cand_port}'\n"
            f"sample_rate = 1.0\nconcurrency = {args.concurrency}\n"
            f"buffer_max_items = {args.buffer_items}\n"
        )
        if args.sessions:
            text += "sampling = 'session'\n"
        if grader is not None:  # a model upgrade graded on every pair, both orders
            text += (
                "kind = 'model-upgrade'\n[candidates.grader]\n"
                f"url = '{grader}'\nmodel = 'sim-model'\nrate = 1.0\n"
                "max_per_minute = 1000000\n"
            )
    path.write_text(text)


def _grader(nice: int) -> tuple[subprocess.Popen[bytes], str]:
    """The simulator's LLM grader (`canary sim --profile grader`), answering at once, at `nice`
    (it stands for a remote LLM: on a 2-core host it otherwise takes production's cores)."""
    port = free_port()
    proc = subprocess.Popen(
        ["nice", "-n", str(nice), sys.executable, "-m", "gateway.cli.main", "sim",
         "--port", str(port),
         "--profile", "grader", "--time-scale", "0.02"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _p(lat: list[float], q: float) -> float:
    lat = sorted(lat)
    return 1000 * lat[int(q * (len(lat) - 1))]


async def main(args: argparse.Namespace) -> None:
    live_port, cand_port = free_port(), free_port()
    ups = [
        multiprocessing.Process(target=_upstream, args=(live_port, None, 0), daemon=True),
        multiprocessing.Process(
            target=_upstream, args=(cand_port, args.delay_ms / 1000, args.candidate_nice),
            daemon=True,
        ),
    ]  # fmt: skip
    for up in ups:
        up.start()
    cand_url = f"http://127.0.0.1:{cand_port}"
    rows: list[tuple[str, dict[str, float]]] = []
    pooled: dict[str, dict[str, list[Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        on_dir, off_dir = tmp / "on", tmp / "off"
        on_dir.mkdir()
        off_dir.mkdir()
        grader, grader_url = _grader(args.grader_nice) if args.grading else (None, None)
        _config(on_dir / "on.toml", cand_port, args, grader_url)
        _config(off_dir / "off.toml", None, args)
        # Both gateways run all along, the idle one idle: mirroring on and off are measured in
        # alternate steps of one run, so a shared host's drifting load lands on both alike.
        on_proc, on_url = await _serve(on_dir, on_dir / "on.toml", live_port, args.workers)
        off_proc, off_url = await _serve(off_dir, off_dir / "off.toml", live_port, args.workers)
        on_cpu = _Cpu(on_proc.pid, await _mirror_pid(on_url))  # type: ignore[attr-defined]
        off_cpu = _Cpu(off_proc.pid, await _mirror_pid(off_url))  # type: ignore[attr-defined]
        try:
            if args.sessions:
                if args.capacity is None:
                    raise SystemExit("--sessions needs --capacity (the sweep's finding)")
                await _sessions(args, on_url, cand_url)
                return
            rps, capacity = args.start, None
            while args.capacity is None:
                row = await _step(on_url, cand_url, rps, args.seconds, args.settle)
                rows.append(("sweep", row))
                print(f"sweep {_short(row)}", file=sys.stderr, flush=True)
                if row["ratio"] < 0.99:  # once more: a shared host's stall is not the capacity
                    row = await _step(on_url, cand_url, rps, args.seconds, args.settle)
                    rows.append(("sweep (again)", row))
                    print(f"sweep again {_short(row)}", file=sys.stderr, flush=True)
                if row["ratio"] < 0.99:
                    break
                capacity = row
                rps *= 1.1
            if args.capacity is not None:  # known from an earlier sweep: one step there
                capacity = await _step(on_url, cand_url, args.capacity, args.seconds, args.settle)
                rows.append(("at --capacity", capacity))
            if capacity is None:
                raise SystemExit("not even the first step kept 99 %: lower --start")
            before = await _metrics(on_url)
            for r in range(args.rounds):
                for factor in (1.5, 2.0):
                    target = capacity["target"] * factor
                    for name, url, cand, cpu in (
                        ("on", on_url, cand_url, on_cpu),
                        ("off", off_url, None, off_cpu),
                    ):
                        row = await _step(
                            url, cand, target, args.overload_seconds, args.settle, cpu
                        )
                        cell = pooled.setdefault(f"{factor}x {name}", {"lat": [], "kept": []})
                        cell["lat"].extend(row["lat"])
                        for key in ("kept", "p99_ms", *_CORES):
                            cell.setdefault(key, []).append(row[key])
                        rows.append((f"{factor}x {name} (round {r + 1})", row))
                        print(f"{factor}x {name} {_short(row)}", file=sys.stderr, flush=True)
            after = await _metrics(on_url)
        finally:
            for proc in (on_proc, off_proc):
                proc.terminate()  # type: ignore[attr-defined]
                await proc.wait()  # type: ignore[attr-defined]
            if grader is not None:
                grader.terminate()
                grader.wait()
    for up in ups:
        up.terminate()

    key = 'canary_mirror_handoff_dropped_total{candidate="c",reason="%s"}'
    print(
        f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, workers {args.workers}, "
        f"mirror priority {args.priority}, token_counter {args.token_counter}, "
        f"grading {'on (rate 1.0)' if args.grading else 'off'}"
    )
    print("| step | offered copies/s | kept copies/s | kept | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, row in rows:
        print(
            f"| {name} | {row['offered']:.0f} | {row['kept']:.0f} | {row['ratio']:.1%} | "
            f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    print(f"\ncapacity: {capacity['target']:.0f} offered/s, {capacity['kept']:.0f} kept/s")
    print(
        "| load | kept copies/s | kept vs at capacity | p99 ms on | p99 ms off | p99 on/off "
        "| median of the rounds' p99 on/off | production cores on / off | mirror cores "
        "| report process cores on / off |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for factor in (1.5, 2.0):
        on, off = pooled[f"{factor}x on"], pooled[f"{factor}x off"]
        kept = statistics.mean(on["kept"])
        p_on, p_off = _p(on["lat"], 0.99), _p(off["lat"], 0.99)
        pairs = zip(on["p99_ms"], off["p99_ms"], strict=True)
        per_round = statistics.median(a / b for a, b in pairs)
        print(
            f"| {factor}x | {kept:.0f} | {kept / capacity['kept']:.0%} | {p_on:.1f} | "
            f"{p_off:.1f} | {p_on / p_off:.2f}x | {per_round:.2f}x | "
            f"{statistics.mean(on['production_cores']):.3f} / "
            f"{statistics.mean(off['production_cores']):.3f} | "
            f"{statistics.mean(on['mirror_cores']):.3f} | "
            f"{statistics.mean(on['report_cores']):.3f} / "
            f"{statistics.mean(off['report_cores']):.3f} |"
        )
    for reason in ("shed_capacity", "dropped_overflow"):
        got = after.get(key % reason, 0.0) - before.get(key % reason, 0.0)
        print(f"worker {reason} during the overload steps: {got:.0f}")
    for k in [k for k in after if k.startswith("canary_mirror_copies_total")]:
        print(f"{k}: {after[k] - before.get(k, 0.0):.0f}")
    for k in [k for k in after if k.startswith(_ALSO)]:
        print(f"{k}: {after[k] - before.get(k, 0.0):.0f}")


_ALSO = (
    "canary_mirror_capacity_cuts_total", "canary_mirror_token_counts_total",
    "canary_grading_",
)  # fmt: skip


def _short(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "lat"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--overload-seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    # SCHED_IDLE ("idle", the default in production) on a shared host measures the others.
    parser.add_argument("--priority", default="normal", choices=("idle", "nice", "normal"))
    parser.add_argument("--candidate-nice", type=int, default=0)
    parser.add_argument(
        "--capacity", type=float, default=None, help="skip the sweep: the capacity it found"
    )
    parser.add_argument(
        "--token-counter", default="off", choices=("off", "auto"),
        help="[mirror] token_counter: off, or auto (the candidate's /tokenize, every pair's "
        "text distinct: one request a pair)",
    )  # fmt: skip
    parser.add_argument(
        "--grading", action="store_true",
        help="the candidate a model upgrade with the simulator's grader at rate 1.0",
    )  # fmt: skip
    parser.add_argument("--grader-nice", type=int, default=0, help="the grader's nice value")
    parser.add_argument(
        "--sessions", action="store_true",
        help="three-turn conversations at session sampling: 1x and 2x --capacity, headless share",
    )  # fmt: skip
    parser.add_argument("--buffer-items", type=int, default=1000, help="the candidate's ring")
    parser.add_argument(
        "--think-ms", type=float, default=100.0, help="between a conversation's turns"
    )
    asyncio.run(main(parser.parse_args()))
