"""The live page's labelling view (`#/label/NAME`, static/label.js) in a real browser (the
system's chromium, driven by Playwright) against a real gateway on 127.0.0.1:0 over a SQLite
file, with a labeller token and the keys A, B, T, S and U: labels are stored as the shown order
says, a pair is never offered twice to one labeller, neither the order nor the verdict reaches
the page, undo shows the undone pair again, an answer's markup is shown as text and never runs,
and with `store_text = false` the view shows the API's error.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from domain.endpoint import Endpoint, GraderSpec
from domain.records import LabelItem
from storage import labels as lb
from storage import queries
from tests.browser.stack import chromium, new_page
from tests.control.test_admin_harness import real_gateway
from tests.graded_store import kept_pair, write_records

pytestmark = pytest.mark.timeout(90)

NAME = "upgrade"
LABELLER_TOKEN = "tok-labeller-8c41d0e2f7"
VIEWPORT = {"width": 1100, "height": 900}
# An answer that would run script if the page wrote it as HTML.
PLANT = '<img src=x onerror="window.__pwned = 1"><script>window.__pwned = 2</script> <b>bold</b>'
KEYS = ["a", "b", "t", "s", "a"]  # one per pair; undo and a relabel come in between
CHOICE = {"t": "tie", "s": "skip"}
# Words that would tell the labeller which answer is whose, or what the grader said.
TELLS = ("candidate", "reference", "winner", "verdict", "grader said", "data-order")


def _items(n: int) -> list[LabelItem]:
    """Pairs as the grading lane keeps them; their answers do not say whose they are."""
    return [
        kept_pair(
            i,
            NAME,
            f"user: question number {i}?",
            f"one way to say {i}" + (f" {PLANT}" if i == 0 else ""),
            f"another way to say {i}",
        )
        for i in range(n)
    ]


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, **settings: Any) -> AsyncIterator[Any]:
    """The gateway, with a labeller token `ann`, and a model upgrade to label."""
    labellers = f"ann:{LABELLER_TOKEN}"
    async with real_gateway(tmp_path, admin_labeller_token=labellers, **settings) as gw:
        grader = GraderSpec(url="http://127.0.0.1:9/v1", model="judge", label_rate=1.0)
        upgrade = Endpoint(
            name=NAME, url="http://127.0.0.1:9/", kind="model-upgrade", grader=grader
        )
        await queries.create_endpoint(gw.engine, upgrade)
        yield gw


SHOWN = "Number(document.getElementById('label-view').dataset.shown || 0)"


async def _shown(page: Any) -> int:
    return int(await page.evaluate(SHOWN))


async def _press(page: Any, key: str) -> None:
    """Press `key` and wait until the view has shown what the API answered."""
    before = await _shown(page)
    await page.keyboard.press(key)
    await page.wait_for_function(
        f"n => {SHOWN} > n",
        arg=before,
        polling=20,
    )


async def _pair(page: Any) -> dict[str, str]:
    """What the view shows of the pair, and checks that nothing tells whose answer is whose."""
    view = (await page.inner_html("#label-view")).lower()
    for tell in TELLS:
        assert tell not in view, tell
    assert await page.locator("#label-view img, #label-view script, #label-view b").count() == 0
    assert await page.evaluate("window.__pwned") is None
    return {
        "conversation": await page.text_content("#l-conversation") or "",
        "a": await page.text_content("#l-answer-a") or "",
        "b": await page.text_content("#l-answer-b") or "",
    }


def _expected(key: str, shown: dict[str, str], item: LabelItem) -> str:
    """The choice a key means for the pair as shown: A is whichever answer the page put first."""
    if key in CHOICE:
        return CHOICE[key]
    text = shown["a"] if key == "a" else shown["b"]
    return "candidate" if text == item.candidate_answer else "reference"


async def test_labelling_with_keys(tmp_path: Path) -> None:
    """A labeller logs in with a labeller token on `#/label/upgrade`, labels every pair with
    keys (A, B, tie, skip), undoes one and labels it again: each label is stored under `ann`
    with the choice the shown order means, no pair is offered twice, the page only ever calls
    the labelling API and shows no arm nor verdict, the planted markup is text, and the view
    ends on "no pair" with the progress against the target and the rubric."""
    items = _items(len(KEYS))
    by_text = {it.conversation: it for it in items}
    async with _gateway(tmp_path) as gw, chromium() as browser:
        await write_records(gw.engine, label_items=items)
        context, page = await new_page(browser, VIEWPORT)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        calls: list[str] = []
        page.on("request", lambda r: calls.append(r.url))
        try:
            await page.goto(f"{gw.url}/admin/ui/#/label/{NAME}")
            await page.fill("#token", LABELLER_TOKEN)
            await page.press("#token", "Enter")
            await page.wait_for_selector("#label-view[data-state='pair']")
            await page.click("#l-name")  # the keys go to the page, not to the token field
            rubric = await page.text_content("#l-rubric") or ""
            assert "Judge which answer serves the user better" in rubric
            assert "of the target 50" in (await page.text_content("#l-progress") or "")

            offered: list[str] = []
            stored: dict[str, str] = {}  # conversation -> expected choice
            for i, key in enumerate(KEYS):
                shown = await _pair(page)
                item = by_text[shown["conversation"]]
                if item.exchange_id == "ex-0":  # the plant, shown as the text it is
                    assert any(text.endswith(PLANT) for text in (shown["a"], shown["b"]))
                offered.append(shown["conversation"])
                await _press(page, key)
                stored[shown["conversation"]] = _expected(key, shown, item)
                if i == 1:  # undo it: the same pair, in the same order, comes back
                    assert len(await lb.labels_of(gw.engine, NAME)) == 2
                    await _press(page, "u")
                    assert await _pair(page) == shown
                    assert "undone" in (await page.text_content("#l-message") or "")
                    assert len(await lb.labels_of(gw.engine, NAME)) == 1
                    del stored[shown["conversation"]]
                    await _press(page, "t")  # labelled again: a tie this time
                    stored[shown["conversation"]] = "tie"
            await page.wait_for_selector("#label-view[data-state='done']")
            assert await page.is_visible("#l-none")
            progress = await page.text_content("#l-progress") or ""
            assert "4 pairs labelled of the target 50" in progress and "1 skipped" in progress
        finally:
            await context.close()

        assert sorted(offered) == sorted(by_text)  # each pair offered once
        labels = await lb.labels_of(gw.engine, NAME)
        assert {r.labeller for r in labels} == {"ann"}
        got = {by_id.conversation: r.choice for r in labels for by_id in items
               if by_id.exchange_id == r.exchange_id}  # fmt: skip
        assert got == stored
    api = [u.split("/admin/", 1)[1] for u in calls if "/admin/" in u and "/admin/ui/" not in u]
    assert api and all(u.startswith(f"labels/{NAME}") for u in api), api
    assert errors == []


async def test_store_text_off_shows_the_api_error(tmp_path: Path) -> None:
    """With `store_text = false` the view shows the API's error naming the setting, and no pair."""
    async with _gateway(tmp_path, store_text=False) as gw, chromium() as browser:
        context, page = await new_page(browser, VIEWPORT)
        try:
            await page.goto(f"{gw.url}/admin/ui/#/label/{NAME}")
            await page.fill("#token", LABELLER_TOKEN)
            await page.press("#token", "Enter")
            await page.wait_for_selector("#label-view[data-state='refused']")
            error = await page.text_content("#l-error") or ""
            assert "storage.store_text is false" in error
            assert await page.is_hidden("#l-pair")
            assert await page.is_disabled("#l-a")
        finally:
            await context.close()
