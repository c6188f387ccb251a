"""The promotion use cases: report, promote, rollback; what the admin API (and any other
front end) calls. Storage is reached from here, never from a handler; reports come from a
`gateway.control.reports.Reports` (in a gateway, the host's report process).

Every decision is taken against the state of one moment and committed in one audited
transaction: a promote whose live endpoint changed before it committed is refused, never applied
blindly. Raises the errors of `domain.errors`, and `ReportsUnavailable` when no report can be had.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors as de
from domain.records import PromotionRecord
from gateway.control.reports import ReportDoc, Reports
from storage import queries as q
from storage import rollouts as store

log = logging.getLogger("canary.admin")


class PromotionRefused(de.PromotionConflict):
    """The verdict is not `promote` and the promote was not forced; `report` says why."""

    def __init__(self, name: str, report: ReportDoc) -> None:
        summary = report.summary()
        super().__init__(
            f"refusing to promote {name!r}: the verdict is {report.verdict!r}, not 'promote' "
            f"({summary or report.verdict}); force=true promotes anyway",
            reason="promotion_refused",
        )
        self.report = report

    code = "promotion_refused"

    @property
    def detail(self) -> dict[str, object]:
        return {"verdict": self.report.verdict, "reasons": self.report.reasons()}

    def http_detail(self) -> dict[str, object]:
        return self.detail


class Promotions:
    """The use cases over one storage engine; reports come from `reports` (in a gateway, the
    host's report process: a promotion's report never runs in a worker)."""

    def __init__(self, engine: AsyncEngine, reports: Reports) -> None:
        self.engine = engine
        self.reports = reports

    async def report(self, name: str, *, final: bool = False) -> ReportDoc:
        """The candidate's report over all its pairs (`final`: a planned look)."""
        return await self.reports.report(name, final=final)

    async def _refuse_while_rolling_out(self, action: str) -> None:
        """PromotionConflict ('rollout_open') before any report is asked for; storage refuses
        again in the transaction, for a rollout opened meanwhile."""
        rollout = await store.current_rollout(self.engine)
        if rollout is not None and rollout.is_open:
            raise de.PromotionConflict(
                f"cannot {action}: the rollout of {rollout.candidate!r} is {rollout.state}; "
                "complete or abort it first (`canary rollout abort`)",
                reason="rollout_open",
            )

    async def promote(self, name: str, *, actor: str, reason: str, force: bool) -> PromotionRecord:
        """Make `name` the live endpoint if its verdict is `promote` (or `force`)."""
        await self._refuse_while_rolling_out(f"promote {name!r}")
        _, endpoints = await q.load_endpoints(self.engine)
        ep = next((e for e in endpoints if e.name == name), None)
        if ep is None:
            raise de.EndpointNotFound(name)
        if ep.role == "live":
            raise de.PromotionConflict(f"{name!r} is already live", reason="already_live")
        live = next((e.name for e in endpoints if e.role == "live"), None)
        report: ReportDoc | None = None
        try:
            report = await self.report(name)
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
            report_snapshot=report.body.decode() if report is not None else None,
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
        await self._refuse_while_rolling_out("roll back")
        rec = await q.rollback(self.engine, actor=actor, reason=reason)
        log.info("admin: %s rolled back %s -> %s", rec.actor, rec.from_endpoint, rec.to_endpoint)
        return rec
