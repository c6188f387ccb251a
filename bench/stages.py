"""Where a proxied request's CPU goes: instructions per request split into the worker's stages.

    .venv/bin/python bench/stages.py [--requests 1000] [--keep DIR]

Two runs per proxy (the bare gateway app of bench/instructions.py, mirroring off and no
candidate; then the minimal aiohttp pass-through of bench/overhead.py), each in front of nginx
`return 200`, with the same client (200 requests of warm-up, then `--requests` over 8 keep-alive
connections):
1. alone under `valgrind --tool=callgrind`: the total instructions per request (independent of
   the machine's load), and the self cost of each function in the dump (kept with --keep; the sum
   `callgrind_annotate` prints without --inclusive=yes),
   grouped by object file (interpreter, aiohttp's C parser and writer, multidict/yarl, uvloop,
   libc and the kernel's syscalls);
2. without valgrind under cProfile (enabled after the warm-up): each Python function's self
   time, C functions charged to the Python function that called them, grouped by file into
   stages (`STAGES`). The instructions of a stage are the callgrind total times its share.
Callgrind sees the interpreter, not Python functions, hence the second run: its shares are CPU
time under a profiler (which weighs many small calls more than they cost unprofiled), so read
them as where to look, and the total as the measure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import (  # siblings, found through sys.path above
    _send,
    callgrind_dump,
    setup,
    total_per_request,
)
from overhead import ROOT, Procs, free_port, wait_port

PY = sys.executable
# (stage, path fragments of the files it covers), first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "proxy handler (proxy.py, headers.py)",
        ("gateway/server/proxy.py", "gateway/server/headers.py"),
    ),
    ("body read (body.py)", ("gateway/server/body.py",)),
    ("connection guards (connections.py)", ("gateway/server/connections.py",)),
    ("hand-off/tee (mirror/channel)", ("gateway/mirror/channel/",)),
    ("meter (meter.py)", ("gateway/server/meter.py",)),
    ("metrics (prometheus.py)", ("gateway/server/prometheus.py",)),
    ("uuid/ids", ("domain/ids.py", "/uuid.py", "/random.py")),
    (
        "upstream client (upstream.py, aiohttp client)",
        (
            "gateway/server/upstream.py",
            "aiohttp/client",
            "aiohttp/connector.py",
            "aiohttp/streams.py",
            "aiohttp/tracing.py",
            "aiohttp/cookiejar.py",
            "aiohttp/http_websocket",
            "aiohttp/multipart.py",
            "aiohttp/payload.py",
            "aiohttp/formdata.py",
        ),
    ),
    (
        "routing/middlewares (web_app, web_urldispatcher)",
        (
            "aiohttp/web_app.py",
            "aiohttp/web_urldispatcher.py",
            "aiohttp/web_middlewares.py",
        ),
    ),
    (
        "response write (web_response, http_writer)",
        (
            "aiohttp/web_response.py",
            "aiohttp/http_writer.py",
            "aiohttp/_http_writer",
        ),
    ),
    (
        "aiohttp server (accept, parse, request)",
        (
            "aiohttp/web_protocol.py",
            "aiohttp/http_parser.py",
            "aiohttp/_http_parser",
            "aiohttp/web_request.py",
            "aiohttp/web_server.py",
            "aiohttp/base_protocol.py",
            "aiohttp/web_runner.py",
            "aiohttp/helpers.py",
            "aiohttp/web_log.py",
        ),
    ),
    ("URLs and header maps (yarl, multidict)", ("/yarl/", "/multidict/", "/propcache/")),
)
OTHER = "event loop/other"

PROFILED = """
import cProfile, runpy, signal, sys
prof = cProfile.Profile()
out = sys.argv.pop(1)
def on(*_):
    prof.enable()
def dump(*_):
    prof.disable()
    prof.dump_stats(out)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, dump)
script = sys.argv.pop(1)
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


def stage_of(filename: str) -> str | None:
    for name, parts in STAGES:
        if any(p in filename for p in parts):
            return name
    return None


def _wait_dump(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.5)
            return
        time.sleep(0.1)
    raise RuntimeError(f"no profile written to {path}")


def stage_shares(stats: dict[Any, Any], stage_of: Callable[[str], str | None]) -> dict[str, float]:
    """Each stage's share of the profiled self time (`pstats.Stats.stats`): a C function
    ("~") is charged to its Python callers in proportion to their calls, up to 4 levels."""
    by_stage: dict[str, float] = defaultdict(float)

    def charge(func: tuple[str, int, str], tt: float, depth: int = 0) -> None:
        filename = func[0]
        if filename != "~" or depth > 4:
            by_stage[stage_of(filename) or OTHER] += tt
            return
        callers = stats[func][4]
        total = sum(edge[2] for edge in callers.values())
        if not callers or total <= 0:
            by_stage[OTHER] += tt
            return
        for caller, edge in callers.items():
            charge(caller, tt * edge[2] / total, depth + 1)

    for func, (_cc, _nc, tt, _ct, _callers) in stats.items():
        charge(func, tt)
    whole = sum(by_stage.values())
    return {name: t / whole for name, t in by_stage.items()}


def profile_shares(script: Path, up: str, requests: int, tmp: Path) -> dict[str, float]:
    """Each stage's share of the profiled self time (C callees charged to their caller)."""
    port, out = free_port(), tmp / f"prof.{free_port()}"
    wrapper = tmp / "profiled.py"
    wrapper.write_text(PROFILED)
    proc = subprocess.Popen(
        [PY, str(wrapper), str(out), str(script), str(port), up], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port, timeout=60)
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(_send(url, 200))
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        asyncio.run(_send(url, requests))
        proc.send_signal(signal.SIGUSR2)
        _wait_dump(out)
    finally:
        proc.terminate()
        proc.wait(60)
    return stage_shares(pstats.Stats(str(out)).stats, stage_of)  # type: ignore[attr-defined]


OBJECTS = (
    ("aiohttp C parser/writer", ("aiohttp/_http",)),
    ("multidict/yarl/propcache C", ("multidict", "yarl", "propcache")),
    ("uvloop", ("uvloop",)),
    ("msgspec/xxhash C", ("msgspec", "xxhash")),
    ("Python interpreter", ("python3", "libpython")),
    ("libc/ld", ("libc", "ld-linux", "libm")),
)


def self_cost_by_object(text: str) -> dict[str, int]:
    """Self cost (Ir) by object file from a callgrind dump: cost lines count, except the one
    after each `calls=` line (the inclusive cost of that call)."""
    names: dict[str, str] = {}
    out: dict[str, int] = defaultdict(int)
    obj, skip = "?", False
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("ob="):
            ref, _, name = line[3:].partition(" ")
            obj = names.setdefault(ref, name) if name else names.get(ref, ref)
        elif line.startswith(("cob=", "cfi=", "cfl=", "cfn=")):
            ref, _, name = line[4:].partition(" ")
            if line.startswith("cob=") and name:
                names.setdefault(ref, name)
        elif line.startswith("calls="):
            skip = True
        elif line[0].isdigit() or line[0] in "+-*":
            if skip:
                skip = False
                continue
            parts = line.split()
            if len(parts) > 1:
                out[obj] += int(parts[1])
    return out


def callgrind(script: Path, up: str, requests: int, tmp: Path, keep: Path | None, label: str
              ) -> tuple[float, dict[str, float]]:  # fmt: skip
    """Instructions per request, and per object-file group, from one callgrind run."""
    dump = callgrind_dump(script, ROOT, up, requests, tmp)
    text = dump.read_text(errors="replace")
    total = total_per_request(text, requests)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(dump, keep / f"callgrind.{label}.out")
    groups: dict[str, float] = defaultdict(float)
    for obj, n in self_cost_by_object(text).items():
        name = next((g for g, parts in OBJECTS if any(p in obj for p in parts)), "other")
        groups[name] += n / requests
    return total, groups


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--keep", type=Path, help="copy the callgrind dumps here")
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y valgrind nginx")
    tmp = Path(tempfile.mkdtemp(prefix="canary-stages-"))
    procs = Procs()
    results: dict[str, tuple[float, dict[str, float], dict[str, float]]] = {}
    try:
        live, gw_script, pt_script = setup(procs, tmp)
        for label, script in (("gateway", gw_script), ("passthrough", pt_script)):
            total, objects = callgrind(script, live, args.requests, tmp, args.keep, label)
            shares = profile_shares(script, live, args.requests, tmp)
            results[label] = (total, objects, shares)
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    gw, pt = results["gateway"], results["passthrough"]
    print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{args.requests} requests per proxy\n")  # fmt: skip
    print(f"Total: gateway {gw[0] / 1e3:,.1f}K, pass-through {pt[0] / 1e3:,.1f}K instructions "
          f"per request ({gw[0] / pt[0]:.3f}x)\n")  # fmt: skip
    names = [name for name, _ in STAGES] + [OTHER]
    print("| stage | gateway K instr/req | share | pass-through K instr/req | share |")
    print("|---|---:|---:|---:|---:|")
    for name in sorted(names, key=lambda n: -gw[2].get(n, 0.0)):
        g, p = gw[2].get(name, 0.0), pt[2].get(name, 0.0)
        print(f"| {name} | {g * gw[0] / 1e3:,.1f} | {g:.1%} | {p * pt[0] / 1e3:,.1f} | {p:.1%} |")
    print("\n| object (callgrind self cost) | gateway K instr/req | pass-through K instr/req |")
    print("|---|---:|---:|")
    for name in sorted(set(gw[1]) | set(pt[1]), key=lambda n: -gw[1].get(n, 0.0)):
        print(f"| {name} | {gw[1].get(name, 0.0) / 1e3:,.1f} | {pt[1].get(name, 0.0) / 1e3:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
