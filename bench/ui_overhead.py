"""Production latency with the admin page open and refreshing vs closed.

A real `canary serve` (SQLite) in front of a simulated live engine, mirroring to a simulated
control and bi-KV candidate at 100 % (the browser tests' stack, bench/_shared/browser_stack.py); a
warm-up fills storage with pairs; then rounds alternate: page closed (the tab on about:blank) and
page open on the bi-KV candidate's view (polling its report, as an operator watching would),
each round the same agent workload through the proxy. Prints production's client-side TTFT and
E2E p50/p99 per condition, pooled over the rounds, with the ratio open / closed, and how many
API calls the page made.

    PYTHONPATH=. python bench/ui_overhead.py [--rounds 4] [--sessions 24] [--warmup 96]

Needs /usr/bin/chromium and Playwright (the dev extra). The engines run in this process, the
gateway in its own: on a shared 2-core host the numbers carry that host's noise; alternate
rounds so drift hits both conditions alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._shared.browser_stack import CANDIDATE, TOKEN, chromium, running_stack
from gateway.sim.workload import WorkloadSpec, run_workload


def _q(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def main(rounds: int, sessions: int, warmup: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with running_stack(Path(tmp)) as stack, chromium() as browser:
            await run_workload(stack.url, WorkloadSpec(sessions=warmup, concurrency=12, seed=1))
            page = await browser.new_page()
            calls: list[str] = []
            page.on("request", lambda r: calls.append(r.url) if "/admin/" in r.url else None)
            await page.goto(stack.ui)
            await page.fill("#token", TOKEN)
            await page.click("#login-go")
            await page.wait_for_selector("#list-view:not([hidden])")
            ttft: dict[str, list[float]] = {"closed": [], "open": []}
            e2e: dict[str, list[float]] = {"closed": [], "open": []}
            report_calls = 0
            for r in range(2 * rounds):
                cond = ("closed", "open")[(r + r // 2) % 2]  # closed, open, open, closed, ...
                if cond == "open":
                    await page.goto(f"{stack.ui}#/c/{CANDIDATE}")
                    await page.wait_for_selector("#d-verdict[data-verdict]")
                else:
                    await page.goto("about:blank")
                before = len(calls)
                spec = WorkloadSpec(sessions=sessions, concurrency=12, seed=100 + r)
                summary = await run_workload(stack.url, spec)
                reports = sum(1 for u in calls[before:] if u.endswith("/report"))
                report_calls += reports
                ok = [t for t in summary.turns if t.status == 200 and t.ttft_s is not None]
                ttft[cond].extend(t.ttft_s for t in ok if t.ttft_s is not None)
                e2e[cond].extend(t.e2e_s for t in ok)
                p50 = 1000 * _q([t.ttft_s for t in ok if t.ttft_s is not None], 0.5)
                print(
                    f"round {r + 1}: page {cond:6} {len(ok)} turns, TTFT p50 {p50:.1f} ms, "
                    f"{reports} reports read",
                    flush=True,
                )
    print(f"\nreports the page read while open: {report_calls}; admin calls in all: {len(calls)}")
    print(f"{'':14}{'closed':>10}{'open':>10}{'open/closed':>13}")
    for name, series in (("TTFT", ttft), ("E2E", e2e)):
        for label, p in (("p50", 0.5), ("p99", 0.99)):
            closed, opened = _q(series["closed"], p), _q(series["open"], p)
            print(
                f"{name + ' ' + label:14}{1000 * closed:>8.1f}ms{1000 * opened:>8.1f}ms"
                f"{opened / closed:>13.3f}"
            )
    n = {k: len(v) for k, v in ttft.items()}
    print(f"turns: {n}; mean TTFT closed {1000 * statistics.fmean(ttft['closed']):.1f} ms, "
          f"open {1000 * statistics.fmean(ttft['open']):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds per condition")
    ap.add_argument("--sessions", type=int, default=24, help="six-turn sessions per round")
    ap.add_argument("--warmup", type=int, default=96, help="sessions stored before measuring")
    args = ap.parse_args()
    asyncio.run(main(args.rounds, args.sessions, args.warmup))
