"""The live page's Ramp panel in a real browser (the system's chromium, driven by Playwright)
over real HTTP: the page's own files, served by `gateway.control.admin.ui`, in front of a small
aiohttp admin API written here that answers the ramp's JSON shapes (`GET /admin/rollout`,
`POST /admin/candidates/{name}/rollout`, `POST /admin/rollout/{action}`) and refuses what the
real API refuses in each state. Starting a forced ramp, advancing, pausing and aborting it from
the page; the buttons follow the state; the weight plot and the event list follow the events.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.control.admin import ui
from tests.browser.stack import chromium

pytestmark = pytest.mark.timeout(120)

CANDIDATE = "kv"
VIEWPORT = {"width": 1280, "height": 900}
BUTTONS = ("pause", "resume", "advance", "abort")
# Evidence as a step's judgement stores it: each gating test with its interval and arms.
EVIDENCE = {
    "tests": [
        {"name": "ttft_first", "decision": "ok", "estimate": 0.01, "lower": -0.03,
         "upper": 0.04, "margin": 0.0953, "n_candidate": 410, "n_production": 7800},
        {"name": "failure", "decision": "undecided", "estimate": 0.002, "lower": -0.01,
         "upper": 0.06, "margin": 0.05, "n_candidate": 410, "n_production": 7800},
    ]
}  # fmt: skip


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": "conflict", "message": message}}, status=status)


class RampApi:
    """The ramp's admin API in memory: one rollout at a time, the real transitions' rules."""

    def __init__(self) -> None:
        self.rollout: dict[str, Any] = {"state": "none"}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _event(self, kind: str, to: float, reason: str, evidence: object = None) -> None:
        r = self.rollout
        r["events"].append(
            {"at": time.time(), "kind": kind, "from_weight": r["weight"], "to_weight": to,
             "step": r["step"], "actor": "ops", "reason": reason, "evidence": evidence}
        )  # fmt: skip
        r["weight"] = to

    async def get(self, _request: web.Request) -> web.Response:
        return web.json_response(self.rollout)

    async def start(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("start", body))
        if self.rollout["state"] in ("running", "paused"):
            return _error(409, "a rollout is open")
        if not body.get("force"):
            return _error(409, f"refusing to ramp {CANDIDATE}: its verdict is hold")
        steps = body.get("steps", [1, 5, 25, 50, 100])
        self.rollout = {
            "candidate": request.match_info["name"], "state": "running", "weight": 0.0,
            "step": 0, "steps": steps, "min_step_s": body.get("min_step_s", 60.0),
            "started_at": time.time(), "events": [],
        }  # fmt: skip
        self._event("start", steps[0], body["reason"])
        return web.json_response(self.rollout, status=201)

    async def act(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        body = await request.json()
        self.calls.append((action, body))
        r, state = self.rollout, self.rollout["state"]
        if action == "pause" and state == "running":
            r["state"] = "paused"
            self._event("pause", r["weight"], body["reason"])
        elif action == "resume" and state == "paused":
            r["state"] = "running"
            self._event("resume", r["weight"], body["reason"])
        elif action == "advance" and state in ("running", "paused"):
            if r["step"] >= len(r["steps"]) - 1:
                return _error(409, "the rollout is at its last step")
            r["step"] += 1
            self._event("advance", r["steps"][r["step"]], body["reason"], EVIDENCE)
        elif action == "abort" and state in ("running", "paused"):
            r["state"] = "aborted"
            self._event("abort", 0.0, body["reason"])
        else:
            return _error(409, f"cannot {action} a rollout that is {state}")
        return web.json_response(r)


async def _candidates(_request: web.Request) -> web.Response:
    row = {"name": CANDIDATE, "kind": "bi-kv", "state": "active", "role": "candidate",
           "sample_rate": 1.0, "target_rps": None}  # fmt: skip
    return web.json_response({"candidates": [row], "rates": {}})


async def _status(_request: web.Request) -> web.Response:
    return web.json_response({"live": {"name": "live"}, "last_promotion": None})


async def _report(_request: web.Request) -> web.Response:
    pairs = {"n": 0, "used_latency": 0, "sessions": 0, "reference": "live", "coverage": None}
    return web.json_response(
        {"candidate": CANDIDATE, "verdict": "hold", "kind": "bi-kv", "pairs": pairs,
         "reasons": [], "metrics": {}, "ttft_by_turn": [], "accounting": {}, "caveats": [],
         "generated_at": time.time()}
    )  # fmt: skip


@contextlib.asynccontextmanager
async def serving(api: RampApi) -> AsyncIterator[str]:
    """The page and the API under /admin on a real port; yields the page's URL."""
    admin = web.Application()
    ui.add_routes(admin.router, token_required=False)
    admin.router.add_get("/candidates", _candidates)
    admin.router.add_get("/status", _status)
    admin.router.add_get("/candidates/{name}/report", _report)
    admin.router.add_post("/candidates/{name}/rollout", api.start)
    admin.router.add_get("/rollout", api.get)
    admin.router.add_post("/rollout/{action}", api.act)
    app = web.Application()
    app.add_subapp("/admin", admin)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}/admin/ui/"
    finally:
        await runner.cleanup()


async def enabled(page: Any) -> set[str]:
    """The ramp buttons the page enables."""
    return {b for b in BUTTONS if await page.is_enabled(f"#ramp-{b}")}


async def give_reason(page: Any, reason: str) -> None:
    await page.wait_for_selector("#confirm[open]")
    await page.fill("#c-reason", reason)
    await page.click("#c-ok")
    await page.wait_for_selector("#confirm", state="hidden")


async def test_ramp_panel_starts_pauses_and_aborts_a_forced_ramp() -> None:
    """Before any ramp the panel says so and every action is disabled; a ramp started by force
    from the candidate's page shows running at step 1 with its weight, Advance moves it to step
    2 with the step's evidence drawn, Pause leaves only Resume/Advance/Abort, Abort shows
    aborted with every action but Start disabled, the event list is newest first and the
    weight plot is drawn; the console stays clean but for the one refusal asked for."""
    api = RampApi()
    async with serving(api) as url, chromium() as browser:
        context = await browser.new_context(viewport=VIEWPORT)
        page = await context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        await page.goto(url)
        await page.wait_for_selector("#ramp-summary[data-state='none']")
        assert await page.inner_text("#ramp-summary") == "no ramp yet"
        assert await enabled(page) == set()

        await page.click(f"a[href='#/c/{CANDIDATE}']")
        await page.wait_for_selector("#ramp-start:not([disabled])")
        await page.click("#ramp-start")
        await page.wait_for_selector("#confirm[open]")
        assert await page.is_visible("#c-ramp-rows") and await page.is_visible("#c-force-row")
        await page.click("#c-ok")  # no force, verdict hold: the API refuses, in the dialog
        await page.wait_for_selector("#c-error:has-text('refusing to ramp')")
        await page.check("#c-force")
        await page.fill("#c-steps", "2, 10, 100")
        await page.fill("#c-min-step", "30")
        await page.fill("#c-reason", "browser test: forced ramp")
        await page.click("#c-ok")
        await page.wait_for_selector("#ramp-summary[data-state='running']")
        assert api.calls[-1] == (
            "start",
            {"reason": "browser test: forced ramp", "force": True, "steps": [2, 10, 100],
             "min_step_s": 30},
        )  # fmt: skip
        assert await page.inner_text("#ramp-step") == "step 1 of 3"
        assert await page.inner_text("#ramp-weight") == "2 %"
        assert await enabled(page) == {"pause", "advance", "abort"}
        assert await page.locator("#ramp-plot svg path.step").count() == 1

        await page.click("#ramp-advance")
        await give_reason(page, "browser test: advance")
        await page.wait_for_selector("#ramp-step:has-text('step 2 of 3')")
        assert await page.inner_text("#ramp-weight") == "10 %"
        tests = page.locator("#ramp-evidence .evidence[data-kind='advance'] tbody tr")
        assert await tests.count() == 2
        first = await tests.nth(0).inner_text()
        assert "ttft_first" in first and "[-0.03, 0.04]" in first and "7,800" in first
        assert await page.locator("#ramp-evidence svg rect").count() == 2

        await page.click("#ramp-pause")
        await give_reason(page, "browser test: pause")
        await page.wait_for_selector("#ramp-summary[data-state='paused']")
        assert await enabled(page) == {"resume", "advance", "abort"}

        await page.click("#ramp-abort")
        await give_reason(page, "browser test: abort")
        await page.wait_for_selector("#ramp-summary[data-state='aborted']")
        assert await page.inner_text("#ramp-weight") == "0 %"
        assert await enabled(page) == set()
        kinds = await page.locator("#ramp-events tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.kind)"
        )
        assert kinds == ["abort", "pause", "advance", "start"]
        assert [c[0] for c in api.calls] == ["start", "start", "advance", "pause", "abort"]

        await page.click(f"a[href='#/c/{CANDIDATE}']")  # closed: a new ramp may start
        await page.wait_for_selector("#ramp-start:not([disabled])")
        await context.close()
    assert len(errors) == 1 and "409" in errors[0], errors
