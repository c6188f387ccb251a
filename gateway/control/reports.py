"""Reports off production's process: the host's report process, and the workers' client of it.

Every report a running gateway computes — `GET /admin/candidates/{name}/report`, the rollout
gate, the report a promotion takes — is built by `LocalReports` in the host's *report process*
(started by the wiring, `gateway.process.children.ReportProcess`, at a low CPU priority,
restarted when it dies), never in a worker. A worker's admin handler asks it over a Unix socket
(`RemoteReports`): one small HTTP request, and the report's JSON bytes relayed as they are. The
worker never loads pairs, never imports the statistics stack and never decodes a report; what
it spends on a report is what it spends on proxying a small answer.

`LocalReports` is the one path to a report inside a gateway: `evaluators.report.build.evaluate`
with this gateway's verdict settings, bounded (`[reports] concurrency` at once, `queue_max`
waiting, beyond that refused and counted) and single-flight (identical requests arriving while
one is computed share its result). Between reports it keeps each active candidate's stored
report segments current (`refresh_interval_s`), so a report reads the candidate's
closed spans as columns and builds only the last minute or two from the rows.

Wire (HTTP/1.1 over the Unix socket, never exposed on a TCP port):

    GET /report/{name}?final=0|1  -> 200 report JSON, header X-Canary-Verdict
                                     else the admin API's error body and status, from its
                                     one map (`boundary.map_exception`): 404 not_found,
                                     422 validation_error (a bad verdict override) or
                                     report_too_large, 503 reports_unavailable (queue full,
                                     counted) or storage_unavailable, 500 a bug
    GET /stats                     -> 200 {"computed": n, "refused": n, "failed": n, ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import aiohttp
import msgspec
from aiohttp import web

from domain import errors as de
from domain.exposition import Family, Sample
from gateway.control.admin.boundary import error_response, map_exception
from gateway.control.admin.schema import ErrorBody

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from evaluators.judge.settings import VerdictSettings
    from evaluators.pairs.spill import Spill
    from gateway.config.sections import ReportsConfig, StorageConfig

log = logging.getLogger("canary.reports")

VERDICT_HEADER = "X-Canary-Verdict"
OUTCOMES = ("ok", "not_found", "invalid", "too_large", "unavailable")
REPORTS: Final = Family(
    "canary_reports_total",
    "counter",
    "Reports this worker asked of the host's report process, by outcome.",
    ("outcome",),
)


class ReportsUnavailable(de.CanaryError):
    """The report process is down, restarting, too busy (its queue is full) or too slow.
    The admin API answers 503 with this message; production is not concerned."""

    http_status = 503
    code = "reports_unavailable"


class _Reason(msgspec.Struct):
    metric: str
    verdict: str | None = None
    reason: str = ""


class _Head(msgspec.Struct):
    verdict: str
    reasons: list[_Reason] = msgspec.field(default_factory=list)


class ReportDoc(msgspec.Struct, frozen=True):
    """A computed report as its consumers need it: the verdict and the report's JSON bytes
    (`evaluators.report.model.report_to_json`), relayed and stored without decoding it."""

    verdict: str
    body: bytes

    def reasons(self) -> list[dict[str, Any]]:
        """The report's reasons (decoded from the JSON on demand: a refused promotion)."""
        head = msgspec.json.decode(self.body, type=_Head)
        return [msgspec.to_builtins(r) for r in head.reasons]

    def summary(self) -> str:
        """The verdict line's reason."""
        head = msgspec.json.decode(self.body, type=_Head)
        return next((r.reason for r in head.reasons if r.metric == "verdict"), "")


class Reports(Protocol):
    """What the admin API and the promotion use cases ask for a report."""

    async def report(self, name: str, *, final: bool = False) -> ReportDoc: ...


async def load_report_stack() -> None:
    """Import the report builder (and with it scipy) in a thread the first time a report is
    asked for: the import takes most of a second, which this process's loop must not wait for."""
    if "evaluators.report.build" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "evaluators.report.build")


class LocalReports:
    """Reports computed in this process: bounded, single-flight, counted."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: VerdictSettings,
        *,
        concurrency: int = 1,
        queue_max: int = 16,
        max_pairs: int | None = None,
        spill: Spill | None = None,
    ) -> None:
        self.engine = engine
        self._spill = spill  # where a large window's columns go (report_spill_*)
        self.settings = settings
        self._max_pairs = max_pairs  # a larger window: ReportTooLarge, counted `too_large`
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._queue_max = queue_max
        self._waiting = 0
        self._inflight: dict[tuple[str, bool], asyncio.Future[ReportDoc]] = {}
        self.stats: dict[str, float] = {
            "computed": 0,
            "shared": 0,
            "refused": 0,
            "too_large": 0,
            "failed": 0,
            "running": 0,
            "waiting": 0,
            "last_seconds": 0.0,
            "refreshes": 0,
            "refresh_failed": 0,
            "segments_built": 0,
            "last_refresh_seconds": 0.0,
        }

    async def report(self, name: str, *, final: bool = False) -> ReportDoc:
        """The candidate's report over all its pairs (`final`: a planned look).

        EndpointNotFound for an unknown name, InvalidSettings for a bad verdict override,
        ReportsUnavailable when `queue_max` reports already wait."""
        key = (name, final)
        shared = self._inflight.get(key)
        if shared is not None:  # the same look is being computed: its answer is this one's
            self.stats["shared"] += 1
            return await asyncio.shield(shared)
        if self._waiting >= self._queue_max + self._concurrency:
            self.stats["refused"] += 1
            raise ReportsUnavailable(
                f"{self._waiting} reports are being computed or wait (reports.concurrency "
                f"{self._concurrency}, reports.queue_max {self._queue_max}); retry later"
            )
        future: asyncio.Future[ReportDoc] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self._waiting += 1
        try:
            doc = await self._compute(name, final)
        except BaseException as exc:
            if isinstance(exc, de.ReportTooLarge):
                self.stats["too_large"] += 1
            elif not isinstance(exc, de.NotFound | de.UsageError | asyncio.CancelledError):
                self.stats["failed"] += 1
            future.set_exception(exc)
            future.exception()  # retrieved: sharers re-raise it, nobody logs it as lost
            raise
        else:
            future.set_result(doc)
            return doc
        finally:
            self._waiting -= 1
            del self._inflight[key]

    async def _compute(self, name: str, final: bool) -> ReportDoc:
        await load_report_stack()
        from evaluators.report.build import evaluate
        from evaluators.report.model import report_to_json

        async with self._slots:
            self.stats["running"] += 1
            started = time.perf_counter()
            try:
                # EndpointNotFound (unknown, or removed meanwhile); InvalidSettings (a bad override)
                report = await evaluate(
                    self.engine,
                    name,
                    settings=self.settings,
                    planned_look=final,
                    max_pairs=self._max_pairs,
                    spill=self._spill,
                )
                body = await asyncio.to_thread(report_to_json, report)
            finally:
                self.stats["running"] -= 1
                self.stats["last_seconds"] = time.perf_counter() - started
        self.stats["computed"] += 1
        return ReportDoc(report.verdict, body)

    async def refresh(self) -> None:
        """Bring every active candidate's report segments up to date, one candidate at a time
        and only while no report waits for the slot (a report always goes first)."""
        await load_report_stack()
        from evaluators.pairs.load import refresh_segments
        from storage import queries

        _, endpoints = await queries.load_endpoints(self.engine)
        started = time.perf_counter()
        for ep in endpoints:
            if ep.role != "candidate" or ep.state != "active":
                continue
            if self._waiting:
                break  # reports are waiting: they come first; the next round resumes
            settings = self.settings.with_overrides(ep.verdict)
            async with self._slots:
                try:
                    built = await refresh_segments(
                        self.engine,
                        ep.name,
                        similarity_max_pairs=settings.similarity_max_pairs,
                        max_chars=settings.similarity_max_chars,
                    )
                except de.EndpointNotFound:  # removed meanwhile
                    continue
            self.stats["segments_built"] += built
        self.stats["refreshes"] += 1
        self.stats["last_refresh_seconds"] = time.perf_counter() - started

    async def refresh_every(self, interval_s: float, stop: asyncio.Event) -> None:
        """`refresh` every `interval_s` until `stop`; a failure is counted and logged, and the
        next round tries again."""
        while not stop.is_set():
            try:
                await self.refresh()
            except de.StorageError as exc:  # the database busy or away: the next round retries
                self.stats["refresh_failed"] += 1
                log.warning("refreshing report segments: %s", exc)
            except Exception:
                self.stats["refresh_failed"] += 1
                log.exception("refreshing report segments failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns, swallowing a cancel,
            # when the awaited event is set in the same loop pass (close() would wait forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()

    def snapshot(self) -> dict[str, float]:
        return self.stats | {"waiting": float(self._waiting)}


def report_app(reports: LocalReports) -> web.Application:
    """The report process's HTTP application (served on its Unix socket only)."""

    async def get_report(request: web.Request) -> web.Response:
        final = request.query.get("final", "0") in ("1", "true")
        try:
            doc = await reports.report(request.match_info["name"], final=final)
        except Exception as exc:  # the admin API's one map; a bug is logged here, a 500
            return error_response(map_exception(exc))
        return web.Response(
            body=doc.body, content_type="application/json", headers={VERDICT_HEADER: doc.verdict}
        )

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(reports.snapshot())

    app = web.Application()
    app.router.add_get("/report/{name}", get_report)
    app.router.add_get("/stats", stats)
    return app


def report_spill(reports: ReportsConfig, storage: StorageConfig) -> Spill:
    """Where the configuration says a large report's columns go."""
    from evaluators.pairs.spill import Spill, default_dir

    directory = reports.spill_dir or default_dir(storage.db_url)
    return Spill(directory, reports.spill_over_bytes)


async def serve_reports(
    config: ReportsConfig,
    storage: StorageConfig,
    verdict: dict[str, float | str],
    socket_path: str,
    ready: Callable[[], None],
    stop: asyncio.Event,
    *,
    controller_interval_s: float = 2.0,
) -> None:
    """What the report process runs: its own storage engine, the report application on
    `socket_path` and the rollout controller (`gateway.rollout.controller`, every
    `controller_interval_s`), until `stop` is set. `verdict` overrides the verdict settings."""
    from evaluators.judge.settings import VerdictSettings
    from gateway.rollout.controller import RolloutController
    from storage.engine import make_engine

    engine = make_engine(storage.db_url)
    reports = LocalReports(
        engine,
        VerdictSettings().with_overrides(verdict),
        concurrency=config.concurrency,
        queue_max=config.queue_max,
        max_pairs=config.max_pairs,
        spill=report_spill(config, storage),
    )
    runner = web.AppRunner(report_app(reports), access_log=None, handle_signals=False)
    await runner.setup()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    site = web.UnixSite(runner, socket_path)
    await site.start()
    controller = RolloutController(engine, reports.settings)
    judging = asyncio.get_running_loop().create_task(
        controller.run(controller_interval_s, stop), name="rollout-controller"
    )
    try:
        ready()
        # Import the statistics stack now, in a thread: the first report need not wait for it.
        await load_report_stack()
        if config.refresh_interval_s > 0:
            await reports.refresh_every(config.refresh_interval_s, stop)
        else:
            await stop.wait()
    finally:
        judging.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await judging
        await runner.cleanup()
        await engine.dispose()


class RemoteReports:
    """A worker's client of the host's report process (one keep-alive Unix-socket session).

    The report's bytes are relayed untouched; the worker never builds or decodes a report."""

    def __init__(self, socket_path: str | None, timeout_s: float) -> None:
        self._path = socket_path  # None: this replica computes no reports ([reports] enabled)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.counts = dict.fromkeys(OUTCOMES, 0)

    def samples(self) -> list[Sample]:
        """`canary_reports_total` by outcome (a refusal of the report process is `unavailable`)."""
        return [REPORTS.sample(self.counts[o], o) for o in OUTCOMES]

    def _client(self) -> aiohttp.ClientSession:
        if self._path is None:
            raise ReportsUnavailable(
                "this replica computes no reports ([reports] enabled = false): ask a replica that "
                "does (on the same store), or run `canary report`"
            )
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._path, limit=64),
                timeout=self._timeout,
                auto_decompress=False,
            )
        return self._session

    async def report(self, name: str, *, final: bool = False) -> ReportDoc:
        outcome = "unavailable"
        try:
            doc = await self._ask(name, final)
            outcome = "ok"
            return doc
        except de.NotFound:
            outcome = "not_found"
            raise
        except de.UsageError:
            outcome = "invalid"
            raise
        except de.ReportTooLarge:
            outcome = "too_large"
            raise
        finally:
            self.counts[outcome] += 1

    async def _ask(self, name: str, final: bool) -> ReportDoc:
        url = f"http://reports/report/{name}"
        params = {"final": "1" if final else "0"}
        try:
            async with self._client().get(url, params=params) as resp:
                body = await resp.read()
                status = resp.status
                verdict = resp.headers.get(VERDICT_HEADER, "")
        except (aiohttp.ClientError, OSError) as exc:
            raise ReportsUnavailable(
                f"the report process is not reachable ({type(exc).__name__}); retry shortly"
            ) from exc
        except TimeoutError as exc:
            raise ReportsUnavailable(
                f"the report took longer than reports.timeout_s ({self._timeout.total:g} s)"
            ) from exc
        if status == 200:
            return ReportDoc(verdict, body)
        # The answer's `type` is the error's `code`: the worker raises the same domain error
        # (its own admin boundary then maps it as the report process did).
        code, message = _error(body)
        if code == de.EndpointNotFound.code:
            raise de.EndpointNotFound(name, message)
        if code == de.InvalidSettings.code:
            raise de.InvalidSettings(message)
        if code == de.ReportTooLarge.code:
            raise de.ReportTooLarge(message)
        raise ReportsUnavailable(message)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _error(body: bytes) -> tuple[str, str]:
    """(code, message) of the report process's error body (the admin API's shape)."""
    try:
        error = msgspec.json.decode(body, type=ErrorBody).error
    except msgspec.MsgspecError:
        return "", body[:200].decode("utf-8", "replace")
    return error.type, error.message
