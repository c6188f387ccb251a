"""The live page as an operator opens it in the browser tests: signed in with the admin token,
every console error and uncaught exception of the page collected. Holds no tests.
"""

from __future__ import annotations

from typing import Any

from tests.browser.stack import TOKEN, new_page, read_after


async def signed_in_page(
    browser: Any, ui: str, viewport: dict[str, int]
) -> tuple[Any, Any, list[str]]:
    """A fresh context and page (`new_page`) at the live page `ui`, signed in with the admin
    token once the page's first read has ended; and the list that collects the page's console
    errors and uncaught exceptions (`pageerror: ...`) from the start."""
    context, page = await new_page(browser, viewport)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    await page.goto(ui)
    await page.fill("#token", TOKEN)
    await read_after(page, lambda: page.click("#login-go"))
    return context, page, errors
