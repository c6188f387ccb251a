"""The live page's LLM grader panel in a real browser (the system's chromium, driven by
Playwright) against a real `canary serve` (tests/browser/stack.py) mirroring agent sessions to a
simulated model upgrade whose pairs the simulator's LLM grader judges in both orders: once every
graded pair is stored, the candidate's page shows the panel with the graded count, the net
preference and the grader's position bias the report states, read after the page's own
`#updated[data-read]` marker; a candidate without a grader shows no panel.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.sim.workload import WorkloadSpec, run_workload
from tests.browser.pages import signed_in_page
from tests.browser.stack import (
    CANDIDATE,
    READ_WITHIN_S,
    UPGRADE,
    VERDICT,
    Stack,
    chromium,
    read_after,
    running_stack,
)
from tests.waiting import until

# A real gateway, five simulators and a browser on a shared host: longer than the default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VIEWPORT = {"width": 1280, "height": 900}
SESSIONS, TURNS = 24, 3
_COUNTER = re.compile(r'^canary_grading_(\w+)_total\{candidate="([^"]+)"\} ([0-9.e+]+)$', re.M)
# Every graded pair's verdicts reach the store: a grading is answered within the grader's
# timeout (`[mirror] grading_timeout_s`, 60 s), and the store's writer and counters flush
# within seconds of it; the report then reads them within one read of the page.
GRADED_WITHIN_S = 60.0 + READ_WITHIN_S


async def grading_counters(stack: Stack) -> dict[str, int]:
    """The upgrade's grading counters from the gateway's /metrics."""
    async with aiohttp.ClientSession() as http, http.get(f"{stack.url}/metrics") as resp:
        text = await resp.text()
    return {k: int(float(v)) for k, name, v in _COUNTER.findall(text) if name == UPGRADE}


def pct(x: float) -> str:
    """As the page's `pct` writes a share (app.js)."""
    return f"{100 * x:.1f} %"


async def panel_rows(page: Any) -> dict[str, str]:
    cells = await page.locator("#d-grader tbody tr").evaluate_all(
        "rows => rows.map(r => [r.cells[0].innerText, r.cells[1].innerText])"
    )
    return {k: v for k, v in cells}


async def test_grader_panel_shows_graded_pairs_net_preference_and_position_bias(
    tmp_path: Path,
) -> None:
    """Graded pairs flow through the mirror to the simulator's grader (planted position bias:
    it picks the answer shown first a quarter of the time); once every one is stored, the
    candidate's page shows the grader panel with the report's graded pairs, gradings, net
    preference with its interval and margin, and the position bias over its decisive verdicts
    (positive, as planted); the bi-KV candidate's page, without a grader, hides the panel."""
    async with running_stack(tmp_path, graded=True) as stack, chromium() as browser:
        spec = WorkloadSpec(sessions=SESSIONS, turns=TURNS, concurrency=8, seed=3)
        done = await run_workload(stack.url, spec)
        assert (done.requests, done.errors) == (SESSIONS * TURNS, 0)
        # A graded session counts once closed: `session_idle_s` after its last turn, plus
        # `grading_deadline_s` (by then every verdict it will hold is in).
        closed_at = (
            time.time() + float(VERDICT["session_idle_s"]) + float(VERDICT["grading_deadline_s"])
        )

        async def settled() -> tuple[dict[str, int], dict[str, Any]] | None:
            # Every selected pair ended (dropped, or graded in both orders), every session
            # closed, and the report counts every verdict the mirror counted: from then on the
            # page reads what the test read.
            c = await grading_counters(stack)
            ended = c.get("graded", 0) + c.get("unparseable", 0) + c.get("failed", 0)
            if not c.get("graded") or ended != 2 * (c["sampled"] - c.get("dropped", 0)):
                return None
            if time.time() < closed_at:
                return None
            report = await stack.report(UPGRADE)
            pref = report["metrics"].get("preference")
            if pref is None or pref["detail"].get("gradings_graded") != c["graded"]:
                return None
            return c, report

        counters, report = await until(
            settled, what="every graded pair stored and reported", within_s=GRADED_WITHIN_S
        )
        pref = report["metrics"]["preference"]
        bias = report["metrics"]["grader_position_bias"]
        d = pref["detail"]
        assert counters["unparseable"] == counters["failed"] == counters["over_cap"] == 0
        assert d["pairs_graded"] >= 10 and d["pairs_both_orders"] == d["pairs_graded"]
        assert bias["n"] > 0 and bias["estimate"] > 0  # the planted first-shown pick

        context, page, errors = await signed_in_page(browser, stack.ui, VIEWPORT)

        await read_after(page, lambda: page.click(f"a[href='#/c/{CANDIDATE}']"))
        assert await page.locator("#d-grader-panel").is_hidden()

        await read_after(page, lambda: page.click("h1 a[href='#/']"))  # back to the list
        await read_after(page, lambda: page.click(f"a[href='#/c/{UPGRADE}']"))
        assert await page.locator("#d-grader-panel").is_visible()
        rows = await panel_rows(page)
        assert rows["pairs graded"] == f"{d['pairs_graded']:,}"
        assert rows["graded / unparseable / failed / over cap"] == (
            f"{counters['graded']:,} / 0 / 0 / 0"
        )
        net = rows["net preference"]
        assert net.startswith(pct(pref["estimate"])), net
        assert f"[{pct(pref['ci_low'])}, {pct(pref['ci_high'])}]" in net, net
        assert f"(margin −{pct(pref['margin'])})" in net, net
        position = rows["position bias (first shown wins − ½)"]
        assert position.startswith(pct(bias["estimate"])), position
        assert f"[{pct(bias['ci_low'])}, {pct(bias['ci_high'])}]" in position, position
        assert position.endswith(f"over {bias['n']:,} decisive"), position
        await context.close()
    assert errors == [], errors
