#!/usr/bin/env python3
"""Real engine check: canary-gateway in front of real vLLM servers (CPU build), run by hand.

Not a test and not run in CI. It shows the gateway on the real engine, not only on the
simulator, with an effect worth detecting: prefix caching (KV reuse) makes later turns of a
multi-turn conversation faster, because their prompt repeats the earlier turns.

What it does, each step printed as it goes:

1. starts two vLLM OpenAI servers (vLLM's CPU build, from ``.real-engine/venv``) serving a tiny
   Llama model built locally by ``bench/tiny_model.py``: ``live`` WITHOUT prefix caching and
   the candidate ``bi-kv`` WITH it (optionally a third, ``control``, configured like live);
2. direct check (``--direct-sessions``, skip with 0): the same multi-turn sessions sent straight
   to each server in turn, measuring TTFT per turn and the engine's ``cached_tokens``;
3. starts the gateway (``canary serve --live ... --insecure-admin`` on loopback, SQLite in a
   temporary folder), registers ``bi-kv`` (and ``control``) at 100 % with ``session`` sampling
   through the admin API, and drives ``--sessions`` multi-turn sessions through it (streaming,
   temperature 0, an ``X-Session-ID`` header per conversation; the context grows by about
   ``--turn-tokens`` prompt tokens per turn, ~1,400 tokens at turn 6 by default);
4. waits until every mirrored copy is answered and accounted for, stops the gateway (which
   drains its writer), then prints ``canary report bi-kv`` and saves it as text, JSON and HTML
   in ``--out``, with ``summary.json`` (every measurement made here, per-turn tables of what
   the gateway stored, engine-side counters) and the server logs.

Every process it starts is stopped on exit, on error and on Ctrl-C.

Setup (once, ~5 min on 2 cores, ~2.5 GB, everything under the git-ignored ``.real-engine/``)::

    .venv/bin/python bench/real_vllm.py --setup        # or: bash bench/real_engine_setup.sh

Run (~5-8 min on 2 cores; the command recorded in bench/RESULTS.md)::

    .venv/bin/python bench/real_vllm.py --control --nice -20 --engine-nice -15 \\
        --shed-lag-ms 250 --verdict error_delta=0.01 --verdict error_critical=0.05

Timing on a small shared machine: the engines' threads are left unpinned (``--bind``), vLLM's
one-second idle busy-polling is capped (``--spin-s``), and ``--nice`` keeps other work from
dominating the timings. Without a control arm the latency reference is production, which gets
each request a few milliseconds before the mirrored copy and so is favoured; ``--control``
starts a third engine configured like live, fed the same copies as ``bi-kv``.

This script runs in the project's own venv (it needs only aiohttp); vLLM runs in its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".real-engine"
MODEL_NAME = "tiny-llama"
CANDIDATE = "bi-kv"
CONTROL = "control"
SESSION_HEADER = "X-Session-ID"

# Plain words for the synthetic conversations (any text works; the model is a toy).
WORDS = (
    "the request returns a value when the file is opened and the stream is closed after each "
    "line of text the parser reads from the buffer with an optional argument that sets the "
    "default encoding for every object in the list of items this function calls on a new "
    "instance of the class which holds the name of the module and its path on disk so that "
    "the logger can write a message to the handler whenever an error is raised by the method "
    "under test while the server waits for a connection from the client on the given port"
).split()


def log(msg: str) -> None:
    print(f"[real-vllm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


class Processes:
    """Owns every child process; each gets its own process group so it can be stopped whole."""

    def __init__(self, nice: int = 0, engine_nice: int | None = None) -> None:
        self.procs: list[Proc] = []
        self.nice = nice
        self.engine_nice = nice if engine_nice is None else engine_nice

    def start(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str],
        *,
        engine: bool = False,
    ) -> Proc:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        nice = self.engine_nice if engine else self.nice
        if nice:
            argv = ["nice", "-n", str(nice), *argv]
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(REPO),
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        log(f"started {name} (pid {popen.pid}), log {log_path}")
        return proc

    def stop(self, proc: Proc, timeout: float = 20.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after `timeout`; returns the exit code."""
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{proc.name} did not stop in {timeout:.0f} s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
        # Engine helpers of a stopped server share its group: make sure none is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        if proc in self.procs:
            self.procs.remove(proc)
        return proc.popen.returncode

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)


def run_cmd(argv: Sequence[str], limit_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run a short command from the repository root, capturing its output (never raises on exit)."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=limit_s, check=False, cwd=str(REPO)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


async def wait_http_ok(
    http: aiohttp.ClientSession, url: str, proc: Proc, limit_s: float, what: str
) -> float:
    """Poll `url` until it answers 200; fail early if `proc` exits. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.popen.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {proc.popen.returncode}:\n{tail(proc.log_path)}"
            )
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {limit_s:.0f} s:\n{tail(proc.log_path)}")


# --------------------------------------------------------------------------- vLLM servers


@dataclass
class Engine:
    name: str
    port: int
    prefix_caching: bool
    proc: Proc | None = None
    ready_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def vllm_argv(root: Path, engine: Engine, args: argparse.Namespace) -> list[str]:
    argv = [
        str(root / "venv" / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(root / "tiny-llama"),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(engine.port),
        "--max-model-len",
        "2048",
        "--block-size",
        "32",
        "--dtype",
        "float32",
        "--kv-cache-memory-bytes",
        str(args.kv_cache_mib * 1024 * 1024),
        "--enable-prompt-tokens-details",
        "--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]
    if args.enforce_eager:
        argv.append("--enforce-eager")
    return argv


# vLLM's shared-memory message queue keeps a reader busy-polling (sched_yield) for 1 s after
# every read, so each engine burns about a core for a second after each request. With two or
# three engines on two shared cores that spinning, not the model, decides the timings. This hook,
# loaded by every Python process of an engine (PYTHONPATH), lowers that window for both arms alike.
_SPIN_HOOK = """\
import importlib.abc, importlib.util, sys

_NAME = "vllm.distributed.device_communicators.shm_broadcast"
_SPIN_S = {spin_s!r}


class _CapSpin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.SpinCondition.__init__.__defaults__ = (_SPIN_S,)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CapSpin())
"""


def write_spin_hook(workdir: Path, spin_s: float) -> Path:
    hook_dir = workdir / "vllm-hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(_SPIN_HOOK.format(spin_s=spin_s))
    return hook_dir


def vllm_env(bind: str | None, hook_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if hook_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("VIRTUAL_ENV", None)
    if bind == "float":
        # One unpinned model thread: the OS runs it on whichever core is free.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = "1"
    elif bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return env


def vllm_version(root: Path) -> str:
    py = root / "venv" / "bin" / "python"
    out = run_cmd([str(py), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"])
    return out.stdout.strip() or f"unknown ({out.stderr.strip()[-200:]})"


async def start_engines(
    procs: Processes, engines: list[Engine], root: Path, workdir: Path, args: argparse.Namespace
) -> None:
    if args.bind is None:
        args.bind = ",".join("float" for _ in engines)
    binds = [b.strip() or None for b in args.bind.split(",")]
    hook_dir = write_spin_hook(workdir, args.spin_s) if args.spin_s >= 0 else None
    for i, engine in enumerate(engines):
        bind = binds[i] if i < len(binds) else None
        engine.proc = procs.start(
            f"vllm-{engine.name}",
            vllm_argv(root, engine, args),
            workdir / f"vllm-{engine.name}.log",
            vllm_env(bind, hook_dir),
            engine=True,
        )
    async with aiohttp.ClientSession() as http:
        for engine in engines:
            assert engine.proc is not None
            engine.ready_s = await wait_http_ok(
                http,
                engine.url + "/health",
                engine.proc,
                args.start_timeout,
                f"vLLM {engine.name}",
            )
            log(
                f"vLLM {engine.name} ready on {engine.url} after {engine.ready_s:.0f} s "
                f"(prefix caching {'on' if engine.prefix_caching else 'off'})"
            )


_METRIC_RE = re.compile(r"^(vllm:[a-z_]+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+)$")
_LE_RE = re.compile(r'le="([^"]+)"')
ENGINE_TTFT = "vllm:time_to_first_token_seconds"


async def engine_counters(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """From the engine's /metrics: each `vllm:*_total` counter summed over its labels, and the
    engine's own TTFT histogram (`..._count`, `..._bucket|le=X`), to tell engine time from
    time spent on the way to it."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC_RE.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        key = None
        if name.endswith("_total") or name == ENGINE_TTFT + "_count":
            key = name
        elif name == ENGINE_TTFT + "_bucket" and (le := _LE_RE.search(labels)):
            key = f"{name}|le={le.group(1)}"
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


def engine_ttft_over(after: dict[str, float], before: dict[str, float], limit_s: float) -> float:
    """Requests whose engine-side TTFT exceeded the largest histogram bound <= `limit_s`."""
    bounds = sorted(
        float(k.split("le=")[1])
        for k in after
        if k.startswith(ENGINE_TTFT + "_bucket|") and k.split("le=")[1] != "+Inf"
    )
    le = max((b for b in bounds if b <= limit_s), default=None)
    if le is None:
        return float("nan")
    key = next(k for k in after if k.startswith(ENGINE_TTFT + "_bucket|") and
               k.split("le=")[1] != "+Inf" and float(k.split("le=")[1]) == le)  # fmt: skip
    total = counter_delta(after, before, ENGINE_TTFT + "_count")
    return total - counter_delta(after, before, key)


def counter_delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


# --------------------------------------------------------------------------- sessions


@dataclass
class TurnResult:
    session: int
    turn: int
    status: int = 0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None


def user_message(rng: random.Random, session: int, turn: int, n_words: int) -> str:
    head = f"Conversation {session}, question {turn}: "
    return head + " ".join(rng.choice(WORDS) for _ in range(n_words)) + "?"


async def chat_turn(
    http: aiohttp.ClientSession,
    base_url: str,
    messages: list[dict[str, str]],
    session_id: str,
    session: int,
    turn: int,
    max_tokens: int,
) -> TurnResult:
    """One streamed chat completion; TTFT = send -> first chunk carrying content."""
    body = {
        "model": MODEL_NAME,
        "messages": messages,
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    res = TurnResult(session=session, turn=turn)
    parts: list[str] = []
    t0 = time.perf_counter()
    try:
        async with http.post(
            base_url + "/v1/chat/completions", json=body, headers={SESSION_HEADER: session_id}
        ) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = (await resp.text())[:300]
                return res
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        obj = json.loads(data)
                        for choice in obj.get("choices") or []:
                            content = (choice.get("delta") or {}).get("content")
                            if content:
                                if res.ttft_ms is None:
                                    res.ttft_ms = (time.perf_counter() - t0) * 1000
                                parts.append(content)
                            if choice.get("finish_reason"):
                                res.finish_reason = choice["finish_reason"]
                        usage = obj.get("usage")
                        if usage:
                            res.prompt_tokens = usage.get("prompt_tokens")
                            res.completion_tokens = usage.get("completion_tokens")
                            details = usage.get("prompt_tokens_details") or {}
                            res.cached_tokens = details.get("cached_tokens")
            res.e2e_ms = (time.perf_counter() - t0) * 1000
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.text = "".join(parts)
    return res


async def run_session(
    http: aiohttp.ClientSession, base_url: str, session: int, args: argparse.Namespace, tag: str
) -> list[TurnResult]:
    # The tag is part of the seed: each phase (warm-up, direct, gateway) sends other text, so no
    # phase finds the previous one's prompts in the prefix cache.
    rng = random.Random(f"{args.seed}-{tag}-{session}")
    session_id = f"real-vllm-{tag}-{args.seed}-{session}"
    messages: list[dict[str, str]] = []
    out: list[TurnResult] = []
    for turn in range(1, args.turns + 1):
        messages.append(
            {"role": "user", "content": user_message(rng, session, turn, args.words_per_turn)}
        )
        res = await chat_turn(http, base_url, messages, session_id, session, turn, args.max_tokens)
        out.append(res)
        if res.error is not None:
            log(f"session {session} turn {turn}: {res.error}")
            break
        messages.append({"role": "assistant", "content": res.text})
        if args.think_ms:
            await asyncio.sleep(args.think_ms / 1000)
    return out


async def run_sessions(
    base_url: str, n: int, args: argparse.Namespace, tag: str
) -> list[TurnResult]:
    sem = asyncio.Semaphore(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def one(s: int) -> list[TurnResult]:
            async with sem:
                return await run_session(http, base_url, s, args, tag)

        results = await asyncio.gather(*(one(s) for s in range(n)))
    return [r for rs in results for r in rs]


async def calibrate_words(base_url: str, args: argparse.Namespace) -> int:
    """Pick words per user turn so that each turn adds about --turn-tokens prompt tokens."""
    rng = random.Random(args.seed)
    sample = " ".join(rng.choice(WORDS) for _ in range(400))
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            base_url + "/tokenize",
            json={"model": MODEL_NAME, "prompt": sample, "add_special_tokens": False},
        ) as resp,
    ):
        resp.raise_for_status()
        n_tokens = int((await resp.json())["count"])
    per_word = n_tokens / 400
    words = max(8, round(int(args.turn_tokens) / per_word))
    log(f"tokenizer: {per_word:.2f} tokens/word -> {words} words per user turn")
    return words


# --------------------------------------------------------------------------- summaries


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def by_turn(results: list[TurnResult]) -> dict[int, dict[str, Any]]:
    table: dict[int, dict[str, Any]] = {}
    for turn in sorted({r.turn for r in results}):
        rows = [r for r in results if r.turn == turn and r.error is None and r.ttft_ms is not None]
        ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None]
        prompt = [r.prompt_tokens for r in rows if r.prompt_tokens is not None]
        cached = [r.cached_tokens for r in rows if r.cached_tokens is not None]
        table[turn] = {
            "n": len(ttft),
            "ttft_ms_median": statistics.median(ttft) if ttft else None,
            "ttft_ms_p90": pct(ttft, 0.9) if ttft else None,
            "prompt_tokens_mean": statistics.fmean(prompt) if prompt else None,
            "cached_tokens_mean": statistics.fmean(cached) if cached else None,
        }
    return table


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def print_turn_table(title: str, arms: dict[str, dict[int, dict[str, Any]]]) -> None:
    print(f"\n{title}")
    names = list(arms)
    head = f"{'turn':>4} " + " ".join(
        f"| {n + ' n':>10} {'TTFT p50':>9} {'p90':>7} {'prompt':>7} {'cached':>7}" for n in names
    )
    print(head)
    print("-" * len(head))
    for turn in sorted({t for table in arms.values() for t in table}):
        cells = []
        for n in names:
            row = arms[n].get(turn, {})
            cells.append(
                f"| {row.get('n', 0):>10} {fmt(row.get('ttft_ms_median')):>9} "
                f"{fmt(row.get('ttft_ms_p90')):>7} {fmt(row.get('prompt_tokens_mean'), '.0f'):>7} "
                f"{fmt(row.get('cached_tokens_mean'), '.0f'):>7}"
            )
        print(f"{turn:>4} " + " ".join(cells))


def agreement(a: list[TurnResult], b: list[TurnResult]) -> dict[str, int]:
    """Exact-match agreement of the texts of the same (session, turn) on two arms."""
    other = {(r.session, r.turn): r.text for r in b if r.error is None}
    pairs = [(r.text, other[(r.session, r.turn)]) for r in a if (r.session, r.turn) in other]
    return {"pairs": len(pairs), "identical": sum(x == y for x, y in pairs)}


# --------------------------------------------------------------------------- gateway


def canary_bin() -> Path:
    here = Path(sys.executable).parent / "canary"
    return here if here.exists() else REPO / ".venv" / "bin" / "canary"


def canary_help(*sub: str) -> str:
    out = run_cmd([str(canary_bin()), *sub, "--help"], 60.0)
    return out.stdout + out.stderr if out.returncode == 0 else ""


def gateway_available() -> tuple[bool, str]:
    """Whether `canary serve` and `canary report` are the real commands, not placeholders."""
    serve, report = canary_help("serve"), canary_help("report")
    missing = [
        name
        for name, text, flag in (("serve", serve, "--live"), ("report", report, "--format"))
        if flag not in text
    ]
    if missing:
        return False, "not yet available: canary " + ", canary ".join(missing)
    return True, ""


async def register_candidate(
    http: aiohttp.ClientSession,
    gw_url: str,
    name: str,
    kind: str,
    url: str,
    verdict: dict[str, float],
) -> str:
    """Register through POST /admin/candidates; fall back to `canary candidates add`."""
    body: dict[str, Any] = {
        "name": name,
        "url": url,
        "kind": kind,
        "sample_rate": 1.0,
        "sampling": "session",
        "concurrency": 4,
        "timeout_s": 120.0,
    }
    if verdict:
        body["verdict"] = verdict
    async with http.post(gw_url + "/admin/candidates", json=body) as resp:
        text = await resp.text()
        if resp.status in (200, 201):
            return f"POST /admin/candidates -> {resp.status}"
        first_error = f"POST /admin/candidates -> {resp.status}: {text[:300]}"
    argv = [str(canary_bin()), "candidates", "add", name, url, "--admin-url", gw_url,
            "--kind", kind, "--sample-rate", "1.0", "--sampling", "session"]  # fmt: skip
    for key, value in verdict.items():
        argv += ["--verdict", f"{key}={value}"]
    out = await asyncio.to_thread(run_cmd, argv, 60.0)
    if out.returncode == 0:
        return f"`canary candidates add` (after {first_error})"
    raise RuntimeError(
        f"could not register {name}: {first_error}; `{' '.join(argv)}` -> {out.returncode}: "
        f"{(out.stdout + out.stderr)[-300:]}"
    )


async def gateway_counters(
    http: aiohttp.ClientSession, gw_url: str, name: str
) -> dict[str, int] | None:
    """The gateway's copy accounting for one candidate (GET /admin/candidates/NAME), if any."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
        async with http.get(f"{gw_url}/admin/candidates/{name}") as resp:
            if resp.status == 200:
                counters = (await resp.json()).get("counters")
                if isinstance(counters, dict):
                    return {k: int(v) for k, v in counters.items()}
    return None


async def wait_mirror_drained(
    http: aiohttp.ClientSession,
    gw_url: str,
    name: str,
    engine: Engine,
    before: dict[str, float],
    expected: int,
    limit_s: float,
) -> tuple[dict[str, float], dict[str, int] | None]:
    """Wait until every mirrored copy to `name` is answered and accounted for.

    Done when the gateway's counters show nothing pending and every sent copy observed
    (sampled copies of all `expected` requests), or, without those counters, when the candidate
    engine has finished `expected` requests since `before`.
    """
    t0 = time.monotonic()
    last = ""
    while True:
        now = await engine_counters(http, engine.url)
        answered = counter_delta(now, before, "vllm:request_success_total")
        gw = await gateway_counters(http, gw_url, name)
        if gw is not None:
            observed = gw.get("observed_ok", 0) + gw.get("observed_error", 0)
            observed += gw.get("timed_out", 0)
            done = (
                gw.get("sampled", 0) >= expected
                and gw.get("pending", 0) == 0
                and gw.get("sent", 0) == observed
            )
            state = f"gateway counters {gw}"
        else:
            done = answered >= expected
            state = f"{answered:.0f}/{expected} copies answered by the engine"
        if done:
            log(f"{name}: mirror drained: {state}")
            return now, gw
        if time.monotonic() - t0 > limit_s:
            log(f"{name}: not drained after {limit_s:.0f} s ({state}); reporting what is stored")
            return now, gw
        if state != last:
            log(f"{name}: {state}")
            last = state
        await asyncio.sleep(2)


def run_report(db_url: str, name: str, out_dir: Path) -> dict[str, Any]:
    """`canary report NAME` as text (printed), JSON and HTML; returns what it could read."""
    result: dict[str, Any] = {}
    for fmt_name, suffix in (("text", "txt"), ("json", "json"), ("html", "html")):
        argv = [str(canary_bin()), "report", name, "--db", db_url, "--format", fmt_name]
        out = run_cmd(argv, 600.0)
        path = out_dir / f"report-{name}.{suffix}"
        path.write_text(out.stdout)
        result[f"{fmt_name}_exit"] = out.returncode
        if out.returncode not in (0,) and not out.stdout:
            log(f"canary report --format {fmt_name} -> {out.returncode}: {out.stderr[-500:]}")
        if fmt_name == "text":
            print("\n" + "=" * 30 + f" canary report {name} " + "=" * 30)
            print(out.stdout or out.stderr)
            result["text"] = out.stdout
        elif fmt_name == "json":
            with contextlib.suppress(json.JSONDecodeError):
                result["json"] = json.loads(out.stdout)
    return result


async def stored_by_turn(db_url: str, name: str) -> dict[str, dict[int, dict[str, Any]]] | None:
    """Per-turn medians of what the gateway stored, per arm, from its own pair loader."""
    try:
        import numpy as np

        from evaluators.pairs.load import load_pairs
        from storage.engine import make_engine
    except ImportError as exc:
        log(f"cannot load the stored pairs ({exc}); per-turn table from the report only")
        return None
    engine = make_engine(db_url)
    try:
        ps = await load_pairs(engine, name)
    except Exception as exc:  # a bench must still print the report when this table fails
        log(f"cannot load the stored pairs ({type(exc).__name__}: {exc})")
        return None
    finally:
        await engine.dispose()
    n = ps.n
    turn = ps.turn[:n].astype(int) + 1
    tables: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in (
        ("production", "candidate", "control") if ps.has_control else ("production", "candidate")
    ):
        cols = ps.arm(arm)
        ok = cols.present[:n] & cols.ok[:n]
        tables[arm] = {}
        for t in sorted(set(turn.tolist())):
            use = ok & (turn == t) & np.isfinite(cols.ttft_s[:n])
            ttft_ms = (cols.ttft_s[:n][use] * 1000).tolist()
            prompt = cols.prompt_tokens[:n][use]
            cached = cols.cached_tokens[:n][use]
            tables[arm][t] = {
                "n": len(ttft_ms),
                "ttft_ms_median": statistics.median(ttft_ms) if ttft_ms else None,
                "ttft_ms_p90": pct(ttft_ms, 0.9) if ttft_ms else None,
                "ttft_over_1s": sum(v > 1000 for v in ttft_ms),
                "prompt_tokens_mean": float(np.nanmean(prompt)) if np.isfinite(prompt).any()
                else None,
                "cached_tokens_mean": float(np.nanmean(cached)) if np.isfinite(cached).any()
                else None,
            }  # fmt: skip
    return tables


def find_keys(obj: Any, pred: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Walk a JSON document; yield (path, value) for every key matching `pred`."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if pred(str(k)):
                yield p, v
            yield from find_keys(v, pred, p)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from find_keys(v, pred, f"{path}[{i}]")


async def gateway_phase(
    procs: Processes,
    engines: dict[str, Engine],
    workdir: Path,
    out_dir: Path,
    args: argparse.Namespace,
    summary: dict[str, Any],
) -> None:
    live, cand = engines["live"], engines[CANDIDATE]
    db_url = f"sqlite+aiosqlite:///{workdir / 'canary.db'}"
    gw_port = free_port()
    gw_url = f"http://127.0.0.1:{gw_port}"
    env = dict(os.environ)
    env.pop("CANARY_ADMIN_TOKEN", None)
    if args.shed_lag_ms is not None:
        env["CANARY_MIRROR_SHED_LOOP_LAG_MS"] = str(args.shed_lag_ms)
    db_help = await asyncio.to_thread(canary_help, "db")
    if "upgrade" in db_help:
        out = await asyncio.to_thread(run_cmd, [str(canary_bin()), "db", "upgrade", "--db", db_url])
        log(f"canary db upgrade -> {out.returncode} {(out.stdout + out.stderr).strip()[-200:]}")
    argv = [
        str(canary_bin()),
        "serve",
        "--live",
        live.url,
        "--db",
        db_url,
        "--listen",
        f"127.0.0.1:{gw_port}",
        "--insecure-admin",
    ]
    gw = procs.start("gateway", argv, workdir / "gateway.log", env)
    summary["gateway"] = {"command": " ".join(argv), "db": db_url}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        ready = await wait_http_ok(http, gw_url + "/healthz", gw, 60, "canary serve")
        log(f"gateway ready on {gw_url} after {ready:.1f} s")
        arms = [(CANDIDATE, "bi-kv", cand)]
        if CONTROL in engines:
            arms.append((CONTROL, "control", engines[CONTROL]))
        for name, kind, engine in arms:
            overrides = args.verdict if name == CANDIDATE else {}
            how = await register_candidate(http, gw_url, name, kind, engine.url, overrides)
            log(f"registered {name} ({kind}, session sampling, 100 %): {how}")
        await asyncio.sleep(args.settle_s)
        before = {name: await engine_counters(http, eng.url) for name, _, eng in arms}
        before["live"] = await engine_counters(http, live.url)
    t0 = time.monotonic()
    results = await run_sessions(gw_url, args.sessions, args, "gw")
    drive_s = time.monotonic() - t0
    errors = [r for r in results if r.error is not None]
    log(
        f"drove {args.sessions} sessions x {args.turns} turns through the gateway in "
        f"{drive_s:.1f} s ({len(errors)} errors)"
    )
    expected = sum(1 for r in results if r.error is None)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        after: dict[str, dict[str, float]] = {}
        copies: dict[str, dict[str, int] | None] = {}
        for name, _, eng in arms:
            after[name], copies[name] = await wait_mirror_drained(
                http, gw_url, name, eng, before[name], expected, args.drain_s
            )
        after["live"] = await engine_counters(http, live.url)
    await asyncio.sleep(2)  # let the writer's last batch go (flush interval 0.5 s)
    code = await asyncio.to_thread(procs.stop, gw, 30.0)
    log(f"gateway stopped (exit {code})")
    engine_side = {}
    for name in ["live", *(a[0] for a in arms)]:
        hits = counter_delta(after[name], before[name], "vllm:prefix_cache_hits_total")
        queries = counter_delta(after[name], before[name], "vllm:prefix_cache_queries_total")
        engine_side[name] = {
            "requests": counter_delta(after[name], before[name], "vllm:request_success_total"),
            "prompt_tokens": counter_delta(after[name], before[name], "vllm:prompt_tokens_total"),
            "prefix_cache_queries_tokens": queries,
            "prefix_cache_hits_tokens": hits,
            "engine_ttft_over_1s": engine_ttft_over(after[name], before[name], 1.0),
        }
        log(
            f"{name} engine: {engine_side[name]['requests']:.0f} requests, prefix cache hits "
            f"{hits:.0f}/{queries:.0f} tokens, engine-side TTFT > 1 s: "
            f"{engine_side[name]['engine_ttft_over_1s']:.0f}"
        )
    summary["gateway"].update(
        drive_s=drive_s,
        client_errors=len(errors),
        expected_copies=expected,
        client_by_turn=by_turn(results),
        engines=engine_side,
        copies=copies,
        results=[asdict(r) for r in results],
    )
    report = await asyncio.to_thread(run_report, db_url, CANDIDATE, out_dir)
    stored = await stored_by_turn(db_url, CANDIDATE)
    summary["gateway"]["stored_by_turn"] = stored
    summary["report"] = {k: v for k, v in report.items() if k != "text"}
    doc = report.get("json")
    if isinstance(doc, dict):
        summary["verdict"] = doc.get("verdict")
        summary["reasons"] = doc.get("reasons")
        summary["ttft_by_turn"] = doc.get("ttft_by_turn")
    if stored:
        print_turn_table(
            "Stored by the gateway (TTFT ms as the gateway measured it; tokens are means):",
            {"production(live)": stored["production"], "bi-kv": stored["candidate"]}
            | ({"control": stored["control"]} if "control" in stored else {}),
        )
    print_turn_table(
        "Client-side, through the gateway (production's answers; ms):",
        {"client": summary["gateway"]["client_by_turn"]},
    )
    for name, side in engine_side.items():
        print(
            f"{name} engine over the run: {side['requests']:.0f} requests, prefix-cache hits "
            f"{side['prefix_cache_hits_tokens']:.0f} of {side['prefix_cache_queries_tokens']:.0f} "
            f"prompt tokens; engine-side TTFT > 1 s: {side['engine_ttft_over_1s']:.0f}"
        )


# --------------------------------------------------------------------------- main


async def direct_phase(
    engines: dict[str, Engine], args: argparse.Namespace, summary: dict[str, Any]
) -> None:
    """The same sessions straight to each engine in turn (not at the same time)."""
    per_arm: dict[str, list[TurnResult]] = {}
    tables: dict[str, dict[int, dict[str, Any]]] = {}
    for name in ("live", CANDIDATE):
        eng = engines[name]
        # Warm-up session (not counted): first requests pay one-off costs.
        await run_sessions(eng.url, 1, argparse.Namespace(**{**vars(args), "turns": 2}), "warm")
        t0 = time.monotonic()
        per_arm[name] = await run_sessions(eng.url, args.direct_sessions, args, "direct")
        tables[name] = by_turn(per_arm[name])
        log(
            f"direct: {args.direct_sessions} sessions against {name} in "
            f"{time.monotonic() - t0:.1f} s"
        )
    print_turn_table(
        f"Direct to each engine, {args.direct_sessions} sessions (TTFT ms; tokens are means):",
        {"live(no-pc)": tables["live"], "bi-kv(pc)": tables[CANDIDATE]},
    )
    agree = agreement(per_arm["live"], per_arm[CANDIDATE])
    print(f"identical text, same (session, turn): {agree['identical']}/{agree['pairs']}")
    summary["direct"] = {
        "by_turn": tables,
        "agreement": agree,
        "results": {k: [asdict(r) for r in v] for k, v in per_arm.items()},
    }


async def main_async(
    args: argparse.Namespace,
    procs: Processes,
    root: Path,
    out_dir: Path,
    workdir: Path,
    summary: dict[str, Any],
) -> None:
    ok, why = (True, "") if args.direct_only else await asyncio.to_thread(gateway_available)
    if not ok:
        log(f"gateway phase will be skipped: {why}")
    engines = {
        "live": Engine("live", free_port(), prefix_caching=False),
        CANDIDATE: Engine(CANDIDATE, free_port(), prefix_caching=True),
    }
    if args.control:
        engines[CONTROL] = Engine(CONTROL, free_port(), prefix_caching=False)
    await start_engines(procs, list(engines.values()), root, workdir, args)
    summary["engines"] = {
        n: {"url": e.url, "prefix_caching": e.prefix_caching, "ready_s": e.ready_s}
        for n, e in engines.items()
    }
    if args.words_per_turn is None:
        args.words_per_turn = await calibrate_words(engines["live"].url, args)
    summary["workload"] = {
        k: getattr(args, k)
        for k in (
            "sessions",
            "turns",
            "turn_tokens",
            "words_per_turn",
            "max_tokens",
            "concurrency",
            "think_ms",
            "direct_sessions",
            "seed",
            "bind",
            "verdict",
            "spin_s",
            "shed_lag_ms",
        )
    }
    if args.direct_sessions > 0:
        await direct_phase(engines, args, summary)
    if not args.direct_only and ok:
        await gateway_phase(procs, engines, workdir, out_dir, args, summary)
    elif not args.direct_only:
        summary["gateway_skipped"] = why


def verdict_override(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--setup",
        action="store_true",
        help="create ROOT/venv (vLLM CPU build) and build the tiny model, then exit",
    )
    ap.add_argument(
        "--root", default=str(DEFAULT_ROOT), help="real-engine folder (default: %(default)s)"
    )
    ap.add_argument("--sessions", type=int, default=70, help="sessions through the gateway")
    ap.add_argument("--turns", type=int, default=6, help="turns per session")
    ap.add_argument(
        "--turn-tokens", type=int, default=170, help="prompt tokens added by each user turn (about)"
    )
    ap.add_argument(
        "--words-per-turn",
        type=int,
        default=None,
        help="override --turn-tokens with a fixed word count",
    )
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each reply")
    ap.add_argument("--concurrency", type=int, default=1, help="sessions in flight at once")
    ap.add_argument(
        "--think-ms",
        type=float,
        default=300.0,
        help="pause between the turns of one session (a user reading)",
    )
    ap.add_argument(
        "--direct-sessions",
        type=int,
        default=8,
        help="sessions sent straight to each engine first (0: skip)",
    )
    ap.add_argument("--direct-only", action="store_true", help="no gateway: direct check only")
    ap.add_argument(
        "--control",
        action="store_true",
        help="also start a third vLLM without prefix caching as candidate 'control'",
    )
    ap.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache per engine (MiB)")
    ap.add_argument(
        "--bind",
        default=None,
        help="where each engine's model thread runs, comma-separated in the order "
        "live,bi-kv[,control]: 'float' (default: one unpinned thread, the OS picks a free core, "
        "so a production request and its mirrored copy run side by side and see the same "
        "machine), a core list such as '0' or '1' (VLLM_CPU_OMP_THREADS_BIND), or 'auto' "
        "(vLLM's choice: on 2 cores every engine pins to core 0)",
    )
    ap.add_argument(
        "--spin-s",
        type=float,
        default=0.01,
        help="cap on how long an idle vLLM process busy-polls its message queue after a read "
        "(vLLM's own: 1 s, a core per engine for a second after each request); negative: "
        "leave vLLM as it is",
    )
    ap.add_argument(
        "--enforce-eager",
        action="store_true",
        help="start vLLM without torch.compile (faster start, slower steps)",
    )
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds per engine")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="pause after registering candidates (registry poll)",
    )
    ap.add_argument(
        "--drain-s",
        type=float,
        default=300.0,
        help="longest wait for the mirror to answer every copy",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of this script, the engines and the gateway (e.g. -10 as root, so that "
        "other work on a small shared machine adds less scheduling noise to the timings)",
    )
    ap.add_argument(
        "--engine-nice",
        type=int,
        default=None,
        help="niceness of the engines (default: --nice); above --nice, the gateway's clock and "
        "event loop are not starved when all engines compute at once",
    )
    ap.add_argument(
        "--verdict",
        type=verdict_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="verdict setting override for bi-kv, sent with its registration (repeatable), "
        "e.g. error_delta=0.01; default: none (the gateway's defaults)",
    )
    ap.add_argument(
        "--shed-lag-ms",
        type=float,
        default=None,
        help="the gateway's mirror_shed_loop_lag_ms (default: the gateway's own, 20 ms): on a "
        "small shared machine the event loop lags now and then and copies are shed",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        default=str(REPO / "canary-reports" / "real-vllm"),
        help="output folder (default: %(default)s)",
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the temporary work folder (SQLite DB, logs)"
    )
    args = ap.parse_args(argv)
    args.verdict = dict(args.verdict)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.setup:
        env = dict(os.environ, ROOT=str(Path(args.root).resolve()))
        return subprocess.call(["bash", str(REPO / "bench" / "real_engine_setup.sh")], env=env)
    root = Path(args.root).resolve()
    if not (root / "venv" / "bin" / "python").exists() or not (root / "tiny-llama").exists():
        log(f"no vLLM venv or model under {root}: run  {sys.argv[0]} --setup  first")
        return 2
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="canary-real-vllm-"))
    summary: dict[str, Any] = {
        "argv": sys.argv,
        "machine": {"cores": os.cpu_count()},
        "vllm_torch": vllm_version(root),
        "workdir": str(workdir),
    }
    meta = root / "tiny-llama" / "canary-tiny-model.json"
    if meta.exists():
        summary["model"] = json.loads(meta.read_text())
    log(f"vLLM/torch: {summary['vllm_torch']}; model: {summary.get('model')}; work dir {workdir}")
    procs = Processes(nice=args.nice, engine_nice=args.engine_nice)
    if args.nice or args.engine_nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except PermissionError:
            log("a negative --nice needs root (or CAP_SYS_NICE): running at the default priority")
            procs.nice = procs.engine_nice = 0
    summary["nice"] = {"script_and_gateway": procs.nice, "engines": procs.engine_nice}
    summary["loadavg_start"] = os.getloadavg()

    def on_term(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Also SIGINT: a shell that starts this in the background may hand it SIGINT ignored.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)
    t_start = time.monotonic()
    code = 0
    try:
        asyncio.run(main_async(args, procs, root, out_dir, workdir, summary))
    except KeyboardInterrupt:
        log("interrupted: stopping every process started here")
        code = 130
    except RuntimeError as exc:
        log(f"failed: {exc}")
        summary["error"] = str(exc)
        code = 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not skip the cleanup
            signal.signal(sig, signal.SIG_IGN)
        procs.stop_all()
        summary["elapsed_s"] = time.monotonic() - t_start
        summary["loadavg_end"] = os.getloadavg()
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for name in [p.name for p in workdir.glob("*.log")]:
                shutil.copy(workdir / name, out_dir / name)
            text = json.dumps(summary, indent=2, default=str) + "\n"
            (out_dir / "summary.json").write_text(text)
        except OSError as exc:
            log(f"could not save the outputs in {out_dir}: {exc}")
        if args.keep:
            log(f"kept {workdir} (SQLite DB and logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nverdict: {summary.get('verdict')}  elapsed {summary['elapsed_s']:.0f} s  "
        f"outputs in {out_dir}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
