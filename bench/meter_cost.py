"""The meter's CPU per SSE event, alone: the full meter (stored answers) and the stream watch
(answers nobody stores), against the meter of another tree.

    .venv/bin/python bench/meter_cost.py [--events 300] [--before-root DIR]

A vLLM-shaped chat answer (bench/scale.py's: the role chunk, `--events` content chunks, the
finish chunk, `[DONE]`) is fed as the proxy feeds it, k events per read for k in 1, 4, 30 and
the whole answer (every read at its own `now`, `final_event_seen()` after each, `finish()` at the
end for the full meter), again and again for at least `--min-s` of CPU; CPU per event from
`time.process_time`. Single-threaded CPU time: on a busy host it is charged only for the time the
process ran, so it compares across runs better than wall-clock rates. `--before-root` loads
`gateway/server/meter.py` of that tree (e.g. a `git archive` of main) beside this one's.
It prints a markdown table. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from scale import sse_events  # noqa: E402 - a sibling, through sys.path above

from gateway.server.meter import ResponseMeter  # noqa: E402
from gateway.server.stream.watch import StreamWatch  # noqa: E402


def _load_meter(root: Path) -> Any:
    spec = importlib.util.spec_from_file_location(
        "before_meter", root / "gateway" / "server" / "meter.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the Structs' annotations through it
    spec.loader.exec_module(module)
    return module.ResponseMeter


def _reads(events: list[bytes], k: int) -> list[bytes]:
    return [b"".join(events[i : i + k]) for i in range(0, len(events), k)]


def cost(make: Callable[[], Any], reads: list[bytes], events: int, min_s: float) -> float:
    """CPU µs per event of feeding `reads` to a fresh meter (or watch), repeated."""
    runs = 0
    start = time.process_time()
    while True:
        meter = make()
        now = 0.0
        for chunk in reads:
            now += 0.001
            meter.feed(chunk, now)
            meter.final_event_seen()
        finish = getattr(meter, "finish", None)
        if finish is not None:
            finish(now, 200)
        runs += 1
        spent = time.process_time() - start
        if spent >= min_s:
            return spent * 1e6 / (runs * events)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=300, help="content events per answer")
    p.add_argument("--min-s", type=float, default=0.5, help="CPU seconds per cell at least")
    p.add_argument("--before-root", type=Path, help="also time this tree's meter")
    args = p.parse_args()
    events = sse_events(args.events)
    makers: dict[str, Callable[[], Any]] = {
        "full meter (stored answers)": lambda: ResponseMeter(0.0, is_sse=True, text_max_chars=8192),
        "stream watch (answers nobody stores)": lambda: StreamWatch(0.0),
    }
    if args.before_root is not None:
        before = _load_meter(args.before_root.resolve())
        makers["meter of --before-root (every answer)"] = lambda: before(
            0.0, is_sse=True, text_max_chars=8192
        )
    ks = [1, 4, 30, len(events)]
    print(f"{len(events)} events per answer (text limit 8192 chars); CPU µs per event")
    print()
    print("| meter | " + " | ".join(f"{k} per read" for k in ks) + " |")
    print("|---|" + "---:|" * len(ks))
    for name, make in makers.items():
        cells = [cost(make, _reads(events, k), len(events), args.min_s) for k in ks]
        print(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
