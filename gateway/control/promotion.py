"""The promotion use cases: report, promote, rollback; what the admin API (and any other
front end) calls. Storage and the evaluators are reached from here, never from a handler.

Every decision is taken against the state of one moment and committed in one audited
transaction: a promote whose live endpoint changed before it committed is refused, never applied
blindly. Raises only the errors of `domain.errors`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors as de
from domain.endpoint import Endpoint
from domain.records import PromotionRecord
from storage import queries as q

if TYPE_CHECKING:
    from evaluators.judge.settings import VerdictSettings
    from evaluators.report.model import Report

log = logging.getLogger("canary.admin")


async def load_report_stack() -> None:
    """Import the report builder (and with it scipy) in a thread the first time a report is
    asked for: the import takes most of a second, which the proxy's loop must not wait for."""
    if "evaluators.report.build" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "evaluators.report.build")


class PromotionRefused(de.PromotionConflict):
    """The verdict is not `promote` and the promote was not forced; `report` says why."""

    def __init__(self, name: str, report: Report) -> None:
        summary = next((r.reason for r in report.reasons if r.metric == "verdict"), "")
        super().__init__(
            f"refusing to promote {name!r}: the verdict is {report.verdict!r}, not 'promote' "
            f"({summary or report.verdict}); force=true promotes anyway",
            reason="promotion_refused",
        )
        self.report = report

    @property
    def detail(self) -> dict[str, object]:
        return {"verdict": self.report.verdict, "reasons": msgspec.to_builtins(self.report.reasons)}


class Promotions:
    """The use cases over one storage engine, with the verdict settings of this gateway and a
    bound on concurrent evaluations (they are CPU-heavy; the proxy must not starve)."""

    def __init__(self, engine: AsyncEngine, settings: VerdictSettings, max_reports: int) -> None:
        self.engine = engine
        self.settings = settings
        self._slots = asyncio.Semaphore(max_reports)

    async def report(self, ep: Endpoint, *, final: bool = False) -> Report:
        """The candidate's report over all its pairs (`final`: a planned look)."""
        await load_report_stack()
        from evaluators.report.build import evaluate

        settings = self.settings.with_overrides(ep.verdict)
        async with self._slots:
            try:
                return await evaluate(self.engine, ep.name, settings=settings, planned_look=final)
            except LookupError as exc:  # removed while we were evaluating it
                raise de.EndpointNotFound(ep.name) from exc

    async def report_by_name(self, name: str, *, final: bool = False) -> Report:
        return await self.report(await q.get_endpoint(self.engine, name), final=final)

    async def promote(self, name: str, *, actor: str, reason: str, force: bool) -> PromotionRecord:
        """Make `name` the live endpoint if its verdict is `promote` (or `force`)."""
        await load_report_stack()
        from evaluators.report.model import report_to_json

        _, endpoints = await q.load_endpoints(self.engine)
        ep = next((e for e in endpoints if e.name == name), None)
        if ep is None:
            raise de.EndpointNotFound(name)
        if ep.role == "live":
            raise de.PromotionConflict(f"{name!r} is already live", reason="already_live")
        live = next((e.name for e in endpoints if e.role == "live"), None)
        report: Report | None = None
        try:
            report = await self.report(ep)
        except Exception as exc:
            if not force:
                raise
            # An emergency promote (the live endpoint is down) must not fail on its report.
            log.warning("admin: forced promote of %s without a report (%r)", name, exc)
        verdict = report.verdict if report is not None else None
        if report is not None and verdict != "promote" and not force:
            raise PromotionRefused(name, report)
        rec = await q.promote(
            self.engine,
            name,
            actor=actor,
            reason=reason,
            forced=verdict != "promote",
            verdict=verdict,
            report_snapshot=report_to_json(report).decode() if report is not None else None,
            expect_live=live,
        )
        log.info(
            "admin: %s promoted %s (verdict %s, forced %s)",
            rec.actor,
            name,
            rec.verdict,
            rec.forced,
        )
        return rec

    async def rollback(self, *, actor: str, reason: str) -> PromotionRecord:
        """Make the previous live endpoint live again (one audited transaction)."""
        rec = await q.rollback(self.engine, actor=actor, reason=reason)
        log.info("admin: %s rolled back %s -> %s", rec.actor, rec.from_endpoint, rec.to_endpoint)
        return rec
