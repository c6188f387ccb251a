"""The live page's Ramp panel in a real browser (the system's chromium, driven by Playwright)
against a real `canary serve` (tests/browser/stack.py): a forced ramp started from the
candidate's page, advanced, paused and aborted from the panel, its buttons enabled exactly when
the admin API accepts each action, a step's stored evidence drawn, with no console error but the
refusal the test asks for. The panel's screenshot goes to docs/screenshots/rollout.png
(`docs/screenshots/regenerate.sh`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from evaluators.rollout.twosample import Comparison
from storage.rollouts import transition
from tests.browser.pages import signed_in_page
from tests.browser.stack import CANDIDATE, chromium, read_after, running_stack

# A real gateway and a browser on a shared host: longer than the suite's 120 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SHOTS = Path(os.environ.get("CANARY_SCREENSHOTS", Path(__file__).parents[2] / "docs/screenshots"))
VIEWPORT = {"width": 1280, "height": 900}
BUTTONS = ("pause", "resume", "advance", "abort")
# Two gating tests of a step, as the rollout controller stores them on an advance event.
TESTS = (
    Comparison("ttft_first", "ok", 0.0488, 410, 7800, 0.01, -0.03, 0.04),
    Comparison("failure", "undecided", 0.01, 410, 7800, 0.002, -0.004, 0.012, "share"),
)


async def enabled(page: Any) -> set[str]:
    """The panel's action buttons the page enables."""
    return {b for b in BUTTONS if await page.is_enabled(f"#ramp-{b}")}


async def give_reason(page: Any, reason: str) -> None:
    await page.wait_for_selector("#confirm[open]")
    await page.fill("#c-reason", reason)
    await page.click("#c-ok")
    await page.wait_for_selector("#confirm", state="hidden")


async def test_rollout_panel_starts_pauses_and_aborts_a_forced_rollout(tmp_path: Path) -> None:
    """Before any ramp the panel says "no ramp yet" with every action disabled; a ramp forced
    from the candidate's page (its verdict is hold: unforced, the API's 409 shows in the dialog)
    shows running at step 1 at 1 %; Advance moves it to 5 %, a stored advance with evidence has
    its tests' intervals drawn; Pause leaves Resume, Advance and Abort; Abort shows aborted at
    0 % with every action disabled and Start enabled again; the events list newest first."""
    async with running_stack(tmp_path) as stack, chromium() as browser:
        context, page, errors = await signed_in_page(browser, stack.ui, VIEWPORT)
        await page.wait_for_selector("#ramp-summary[data-state='none']")
        assert await page.inner_text("#ramp-summary") == "no ramp yet"
        assert await enabled(page) == set()

        await read_after(page, lambda: page.click(f"a[href='#/c/{CANDIDATE}']"))
        assert await page.get_attribute("#d-verdict", "data-verdict") == "hold"
        assert await page.is_enabled("#ramp-start")
        await page.click("#ramp-start")
        await page.wait_for_selector("#confirm[open]")
        assert await page.is_visible("#c-ramp-rows") and await page.is_visible("#c-force-row")
        await page.click("#c-ok")  # verdict hold, no force: the API refuses, in the dialog
        await page.wait_for_selector("#c-error:has-text('hold')")
        await page.check("#c-force")
        await page.fill("#c-reason", "browser test: forced ramp")
        await page.click("#c-ok")
        await page.wait_for_selector("#ramp-summary[data-state='running']")
        assert await page.inner_text("#ramp-step") == "step 1 of 5"
        assert await page.inner_text("#ramp-weight") == "1 %"
        assert await enabled(page) == {"pause", "advance", "abort"}
        assert await page.locator("#ramp-plot svg path.step").count() == 1
        start = page.locator("#ramp-evidence .evidence[data-kind='start']")
        assert "forced: true" in await start.inner_text()

        await page.click("#ramp-advance")
        await give_reason(page, "browser test: advance")
        await page.wait_for_selector("#ramp-step:has-text('step 2 of 5')")
        assert await page.inner_text("#ramp-weight") == "5 %"

        # The controller's advance, stored with its evidence, as the page reads it.
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}")
        try:
            evidence = {"because": [], "tests": [dataclasses.asdict(t) for t in TESTS]}
            await transition(
                engine, kind="advance", actor="controller", reason="ok", evidence=evidence
            )
        finally:
            await engine.dispose()
        await read_after(page)  # the page reads the stored ramp at once, not at its next poll
        assert await page.inner_text("#ramp-step") == "step 3 of 5"
        rows = page.locator("#ramp-evidence .evidence[data-kind='advance'] tbody tr")
        assert await rows.count() == 2
        first = await rows.nth(0).inner_text()
        assert "ttft_first" in first and "[×0.97, ×1.04]" in first and "7,800" in first
        # Each number in its unit, as the pairs report writes it: a log ratio as the ratio
        # candidate / production, a share difference in points, the margin in the same unit.
        assert await rows.nth(0).locator("td.estimate").inner_text() == "×1.01"
        assert await rows.nth(0).locator("td.margin").inner_text() == "×1.05"
        assert await rows.nth(1).locator("td.estimate").inner_text() == "+0.2 pp"
        assert "[−0.4 pp, +1.2 pp]" in await rows.nth(1).inner_text()
        assert await rows.nth(1).locator("td.margin").inner_text() == "+1.0 pp"
        assert await page.locator("#ramp-evidence svg rect").count() == 2
        labels = page.locator("#ramp-evidence svg text.margin-label")
        assert await labels.all_text_contents() == ["×1.05", "+1.0 pp"]
        await asyncio.to_thread(SHOTS.mkdir, parents=True, exist_ok=True)
        await page.locator("#ramp").screenshot(path=str(SHOTS / "rollout.png"))

        await page.click("#ramp-pause")
        await give_reason(page, "browser test: pause")
        await page.wait_for_selector("#ramp-summary[data-state='paused']")
        assert await enabled(page) == {"resume", "abort"}  # advance: resume it first (409)

        await page.click("#ramp-abort")
        await give_reason(page, "browser test: abort")
        await page.wait_for_selector("#ramp-summary[data-state='aborted']")
        assert await page.inner_text("#ramp-weight") == "0 %"
        assert await enabled(page) == set()
        kinds = await page.locator("#ramp-events tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.kind)"
        )
        assert kinds == ["abort", "pause", "advance", "advance", "start"]

        # Closed: a new ramp may start.
        await read_after(page, lambda: page.click(f"a[href='#/c/{CANDIDATE}']"))
        assert await page.is_enabled("#ramp-start")
        await context.close()
    assert len(errors) == 1 and "409" in errors[0], errors
