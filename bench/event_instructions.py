"""Instructions per streamed SSE event under valgrind's callgrind: the load-proof per-token cost.

    .venv/bin/python bench/event_instructions.py [--answers 40] [--short 20] [--long 200]
        [--before-root DIR]

What a proxy spends per event of a streamed answer, independent of the machine's load
(instructions, not seconds; bench/instructions.py does the same per request). Each proxy runs
alone under `valgrind --tool=callgrind` in front of a paced engine (bench/scale.py's: one event
every `--gap-ms`, one write each, so the proxy reads one event per read, as from a live engine):
the bare gateway app of bench/instructions.py (mirroring off: streams go through the watch and,
after the first read, the direct relay), the same from `--before-root` (e.g. a `git archive` of an
earlier commit), and the minimal aiohttp pass-through of bench/overhead.py. With `--stored` the
gateway also runs with one candidate at 100 % (every answer fully metered and teed to a socket
that discards it: the cost of an answer that is mirrored).

For each proxy, `--answers` answers of `--short` content events and as many of `--long` are
streamed by `--streams` concurrent clients, each batch after a warm-up and between zeroed and
dumped counters. The marginal cost of one event is
(instructions(long) - instructions(short)) / (answers x (long - short)): the per-request work
(headers, connection, the first read) cancels out. The client checks that every answer arrived
whole; the paced engine's gap keeps each read one event even under valgrind (the script says so
if reads were coalesced: its events per read, from the gateway's relay counter).
It prints a markdown table. It is a benchmark, not a test: it asserts nothing about the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import (  # siblings, via sys.path
    BARE_GATEWAY,
    start_drain,
    total_per_request,
    under_callgrind,
)
from overhead import PASSTHROUGH, PY, ROOT, Procs, free_port
from scale import PACED, sse_events

# The paced engine answering any method and path (the gateway mirrors POST chat requests only).
ENGINE = PACED.replace('app.router.add_get("/paced", paced)',
                       'app.router.add_route("*", "/{tail:.*}", paced)')  # fmt: skip
assert ENGINE != PACED
CHAT = b'{"model":"m","messages":[{"role":"user","content":"Tell me a story"}],"stream":true}'


JSON = {"Content-Type": "application/json"}


async def _stream(url: str, answers: int, streams: int, expect: bytes) -> None:
    import aiohttp

    left = answers
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as http:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with http.post(url, data=CHAT, headers=JSON) as resp:
                    body = await resp.read()
                    assert resp.status == 200 and body == expect, (resp.status, len(body))

        await asyncio.gather(*(worker() for _ in range(streams)))


def engines(procs: Procs, tmp: Path, events: dict[str, int], gap_ms: float) -> dict[str, str]:
    """One paced engine per answer length: name -> base URL."""
    urls = {}
    for name, n in events.items():
        path = tmp / f"sse-{name}"
        path.write_bytes(b"".join(sse_events(n)))
        port = free_port()
        procs.start(PY, "-c", ENGINE, str(port), str(path), str(gap_ms / 1000), port=port)
        urls[name] = f"http://127.0.0.1:{port}"
    return urls


def measure(script: Path, root: Path, ups: dict[str, str], tmp: Path, args: argparse.Namespace,
            *extra: str) -> dict[str, float]:  # fmt: skip
    """Instructions per answer for each answer length, one proxy process per length."""
    out = {}
    for name, up in ups.items():
        expect = (tmp / f"sse-{name}").read_bytes()
        with under_callgrind(script, root, up, tmp, *extra) as (port, zero, dump):
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            asyncio.run(_stream(url, max(4, args.answers // 4), args.streams, expect))
            zero()
            asyncio.run(_stream(url, args.answers, args.streams, expect))
            text = dump().read_text(errors="replace")
        out[name] = total_per_request(text, args.answers)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", type=int, default=40, help="answers per length and proxy")
    ap.add_argument("--short", type=int, default=20, help="content events of a short answer")
    ap.add_argument("--long", type=int, default=200, help="content events of a long answer")
    ap.add_argument("--streams", type=int, default=4, help="concurrent clients")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="engine: ms between events")
    ap.add_argument("--before-root", type=Path, help="also the gateway from this tree")
    ap.add_argument("--stored", action="store_true", help="also the gateway mirroring every answer")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is missing: apt-get install -y valgrind")
    tmp = Path(tempfile.mkdtemp(prefix="canary-evt-"))
    procs = Procs()
    rows: dict[str, dict[str, float]] = {}
    try:
        ups = engines(procs, tmp, {"short": args.short, "long": args.long}, args.gap_ms)
        gw, pt = tmp / "bare_gateway.py", tmp / "passthrough.py"
        gw.write_text(BARE_GATEWAY)
        pt.write_text(PASSTHROUGH)
        rows["minimal aiohttp pass-through"] = measure(pt, ROOT, ups, tmp, args)
        rows["gateway, mirroring off (this tree)"] = measure(gw, ROOT, ups, tmp, args)
        if args.before_root is not None:
            rows["gateway, mirroring off (before)"] = measure(
                gw, args.before_root.resolve(), ups, tmp, args
            )
        if args.stored:
            sock = start_drain(procs, tmp)
            rows["gateway, every answer mirrored (this tree)"] = measure(
                gw, ROOT, ups, tmp, args, f"candidate={sock}"
            )
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    events = args.long - args.short
    base = rows["minimal aiohttp pass-through"]
    base_event = (base["long"] - base["short"]) / events
    print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (instruction "
          f"counts do not depend on it); {args.answers} answers of {args.short} and of "
          f"{args.long} content events per proxy, {args.streams} streams, one event every "
          f"{args.gap_ms:g} ms\n")  # fmt: skip
    print("| proxy | per answer, short | per answer, long | per event | per event vs "
          "pass-through |\n|---|---:|---:|---:|---:|")  # fmt: skip
    for name, row in rows.items():
        per_event = (row["long"] - row["short"]) / events
        print(f"| {name} | {row['short'] / 1e3:,.1f}K | {row['long'] / 1e3:,.1f}K | "
              f"{per_event / 1e3:,.2f}K | {per_event / base_event:.3f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
