"""What the browser tests run against: the gateway, its engines and chromium of
bench/_shared/browser_stack.py (a benchmark starts them too), re-exported here, and how a test
waits for the page: for the read of the API the page says has ended (`read_after`), never for
its timer. Holds no tests.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench._shared.browser_stack import CANDIDATE as CANDIDATE
from bench._shared.browser_stack import COPY_TIMEOUT_S as COPY_TIMEOUT_S
from bench._shared.browser_stack import COUNTERS_FLUSH_S as COUNTERS_FLUSH_S
from bench._shared.browser_stack import READ_WITHIN_S as READ_WITHIN_S
from bench._shared.browser_stack import REPORT_TIMEOUT_S as REPORT_TIMEOUT_S
from bench._shared.browser_stack import TOKEN as TOKEN
from bench._shared.browser_stack import UPGRADE as UPGRADE
from bench._shared.browser_stack import VERDICT as VERDICT
from bench._shared.browser_stack import Stack as Stack
from bench._shared.browser_stack import chromium as chromium
from bench._shared.browser_stack import running_stack as running_stack

# Makes the tab hidden or visible as a browser does when the operator switches tabs; shown
# again, the page reads the API at once (app.js, the visibilitychange listener).
VISIBILITY = """hidden => {
    Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
    document.dispatchEvent(new Event("visibilitychange"));
}"""


async def new_page(browser: Any, viewport: dict[str, int]) -> tuple[Any, Any]:
    """A fresh context and page whose waits are bounded by one read of the page (a wait on
    the page that lasts longer is the product breaking its promise, not a slow host)."""
    context = await browser.new_context(viewport=viewport)
    context.set_default_timeout(READ_WITHIN_S * 1000)
    return context, await context.new_page()


async def read_after(page: Any, action: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Do `action` (by default: hide the tab and show it again, the page's own way to read at
    once) and wait until the page says a read of the API begun after it has ended well, for the
    view then shown (`#updated`'s data-read and data-outcome, app.js `markRead`). A read that
    failed (a 503 of a busy store or report process says "retry shortly") is made again at once,
    as the tab shown again would, within the one bound of a read."""
    deadline = time.monotonic() + READ_WITHIN_S
    outcome, said = None, ""
    while outcome != "ok":
        left = deadline - time.monotonic()
        assert left > 0, f"no read of the page ended well within {READ_WITHIN_S:g} s: {said}"
        begun = await page.evaluate("Number(document.getElementById('updated').dataset.begun || 0)")
        if action is None:
            await page.evaluate(VISIBILITY, True)
            await page.evaluate(VISIBILITY, False)
        else:
            await action()
            action = None  # a failed read is made again by showing the tab again
        await page.wait_for_function(
            "n => Number(document.getElementById('updated').dataset.read || 0) > n",
            arg=begun,
            polling=50,
            timeout=left * 1000,
        )
        outcome = await page.get_attribute("#updated", "data-outcome")
        said = f"{outcome}: {await page.inner_text('#updated')}"
