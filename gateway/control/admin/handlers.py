"""The admin REST API: an aiohttp sub-application mounted at `/admin`.

Operators and CD pipelines register, change, pause and remove candidates, read reports, gate
rollouts, promote and roll back. Every change is committed to storage before the API answers
2xx, then this replica's registry is refreshed at once (others follow within their poll
interval). Bodies are validated by the Structs of `gateway.control.admin.schema`; errors leave
through `gateway.control.admin.boundary.boundary` in one JSON shape;
`gateway.control.admin.openapi` describes it all. Handlers raise the exception tree's classes
and never choose an error status or re-map an error: `boundary.map_exception` is the one map.

Never: store, return or log a secret (only the name of the env var that holds a candidate's
credential), log a request body, or answer 2xx before the commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors as se
from domain.endpoint import CandidatePatch, Endpoint, GraderSpec
from domain.records import PromotionRecord
from gateway.config.load import check_http_url, credential_env_refusal
from gateway.config.sections import AdminConfig, CredentialsConfig, LimitsConfig
from gateway.control.admin import schema as s
from gateway.control.admin import ui
from gateway.control.admin.auth import INSECURE_ACTOR, TokenChecker, admin_mode, is_loopback
from gateway.control.admin.boundary import (
    ACTOR,
    Forbidden,
    InvalidField,
    NotAuthenticated,
    RateLimited,
    boundary,
    decode,
    json_response,
    read_body,
)
from gateway.control.admin.guard import AuthGuard
from gateway.control.admin.labels import LABELLER_PREFIX, LabelSettings
from gateway.control.admin.labels import add_routes as add_label_routes
from gateway.control.promotion import Promotions
from gateway.control.reports import ReportDoc, Reports
from gateway.rollout.state import OPERATOR_KINDS, Rollouts
from gateway.server.app import ADMIN_COLLECTORS, ADMIN_READY_CHECKS, ReadyCheck
from gateway.server.prometheus import Collector
from storage import queries as q
from storage.engine import DatabaseFileGuard

if TYPE_CHECKING:
    from evaluators.judge.settings import VerdictSettings

log = logging.getLogger("canary.admin")

_GATE_STATUS = {"promote": 200, "reject": 412, "hold": 425}


class RegistrySnapshot(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def live(self) -> Endpoint: ...
    @property
    def candidates(self) -> tuple[Endpoint, ...]: ...


class RegistryLike(Protocol):
    """What the admin API needs of `gateway.control.registry.Registry`."""

    @property
    def snapshot(self) -> RegistrySnapshot: ...
    async def refresh(self) -> Any: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminContext:
    """Everything the admin handlers use; built by the app factory from the config.

    `tokens` is `config.parse_admin_tokens(config.admin.token)` (token -> label); `listen_host`
    is the gateway's listener host, checked when `insecure` is set and no token is configured.
    `reports` computes reports: in a gateway, the client of the host's report process
    (`gateway.control.reports.RemoteReports`), so no report runs in a worker.
    """

    engine: AsyncEngine
    registry: RegistryLike
    reports: Reports
    tokens: Mapping[str, str]
    insecure: bool
    counters: Callable[[], Mapping[str, Mapping[str, int]]]
    writer_stats: Callable[[], Mapping[str, int]]
    verdict_settings: VerdictSettings
    listen_host: str | None = None
    # The host's realized sampling rates by candidate, and this worker's replica name.
    rates: Callable[[], Mapping[str, Mapping[str, float | None]]] = dict
    replica: str = ""
    # A rollout's dwell per step when its start does not say (`[rollout] default_min_step_s`).
    default_min_step_s: float = 60.0
    # Labeller tokens (token -> label): they reach the labelling routes only (admin.labels).
    labellers: Mapping[str, str] = field(default_factory=dict)
    labels: LabelSettings = field(default_factory=LabelSettings)
    promotions: Promotions = field(init=False)
    rollouts: Rollouts = field(init=False)

    def __post_init__(self) -> None:
        uses = Promotions(self.engine, self.reports)
        object.__setattr__(self, "promotions", uses)
        rollout_cases = Rollouts(
            self.engine, self.reports, default_min_step_s=self.default_min_step_s
        )
        object.__setattr__(self, "rollouts", rollout_cases)


CTX = web.AppKey("canary_admin_ctx", AdminContext)
CREDENTIALS = web.AppKey("canary_admin_credentials", CredentialsConfig)
DB_FILE = web.AppKey("canary_admin_db_file", DatabaseFileGuard)
_WRITES = frozenset(("POST", "PATCH", "PUT", "DELETE"))


def _check_credentials_env(
    request: web.Request, name: str | None, where: str = "credentials_env"
) -> None:
    if name and (reason := credential_env_refusal(request.app[CREDENTIALS], name)):
        raise InvalidField(f"{where}: {reason}", where)


def _check_url(url: str, where: str = "url") -> None:
    if reason := check_http_url(url):
        raise InvalidField(f"{where}: {reason}", where)


def _check_grader(request: web.Request, grader: GraderSpec | None) -> None:
    """The grader's URL and credentials pass the candidate's own checks (its credentials are
    confined the same way: a variable meant for candidates, never a client's header)."""
    if grader is not None:
        _check_url(grader.url, "grader.url")
        _check_credentials_env(request, grader.credentials_env, "grader.credentials_env")


def _check_verdict(ctx: AdminContext, overrides: Mapping[str, float | str]) -> None:
    """Raises InvalidSettings (422, field `verdict`) naming the setting and the rule."""
    ctx.verdict_settings.with_overrides(overrides)


async def _refresh(ctx: AdminContext) -> None:
    """Apply a committed change on this replica now (Registry.refresh never raises: on a
    storage error it keeps the old snapshot and the poll catches up)."""
    await ctx.registry.refresh()


# --- candidates -------------------------------------------------------------------------------


async def list_candidates(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    version, endpoints = await q.load_endpoints(ctx.engine)
    rates = ctx.rates()
    listed = [ep for ep in endpoints if ep.role != "live"]
    body = s.CandidateList(
        registry_version=version,
        candidates=[s.view(ep) for ep in listed],
        rates={
            ep.name: s.rate_view(ep, rates[ep.name], ctx.replica)
            for ep in listed
            if ep.name in rates
        },
    )
    return json_response(body)


async def create_candidate(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await decode(request, s.CandidateCreate)
    _check_url(body.url)
    _check_credentials_env(request, body.credentials_env)
    _check_verdict(ctx, body.verdict)
    _check_grader(request, body.grader)
    created = await q.create_endpoint(ctx.engine, body.to_endpoint())
    await _refresh(ctx)
    log.info("admin: %s registered candidate %s", request[ACTOR], body.name)
    location = {"Location": f"{request.app.router['candidates'].url_for()}/{body.name}"}
    return json_response(s.view(created), 201, location)


async def get_candidate(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    ep = await q.get_endpoint(ctx.engine, request.match_info["name"])
    rate = ctx.rates().get(ep.name, {})
    return json_response(s.detail(ep, ctx.counters().get(ep.name, {}), rate, ctx.replica))


async def update_candidate(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    name = request.match_info["name"]
    current = await q.get_endpoint(ctx.engine, name)
    changes = (await decode(request, CandidatePatch)).changes()
    if "url" in changes:
        _check_url(changes["url"])
    if "credentials_env" in changes:
        _check_credentials_env(request, changes["credentials_env"])
    if "verdict" in changes:
        _check_verdict(ctx, changes["verdict"])
    if "grader" in changes:
        _check_grader(request, changes["grader"])
    if current.role == "live":
        raise se.PromotionConflict(
            f"{name!r} is live: it changes only by promote/rollback", reason="is_live"
        )
    if not changes:
        return json_response(s.view(current))
    updated = await q.update_endpoint(ctx.engine, name, changes)
    await _refresh(ctx)
    log.info("admin: %s changed %s: %s", request[ACTOR], name, ", ".join(sorted(changes)))
    return json_response(s.view(updated))


async def delete_candidate(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    name = request.match_info["name"]
    await q.delete_endpoint(ctx.engine, name)
    await _refresh(ctx)
    log.info("admin: %s removed %s", request[ACTOR], name)
    return web.Response(status=204)


# --- reports, gate, promote, rollback ---------------------------------------------------------


def _final_look(request: web.Request) -> bool:
    """`?final=true`: this is the planned final look (a guardrail beyond its margin rejects).
    Exactly the values the OpenAPI document lists: `True` is refused like any other value."""
    value = request.query.get("final", "false")
    if value in s.FINAL_TRUE:
        return True
    if value in s.FINAL_FALSE:
        return False
    choices = ", ".join(s.FINAL_TRUE + s.FINAL_FALSE)
    raise InvalidField(f"final must be one of {choices}", "final")


async def _evaluate(ctx: AdminContext, ep: Endpoint, *, final: bool = False) -> ReportDoc:
    """The report, computed by the host's report process (never on this worker's loop)."""
    return await ctx.promotions.report(ep.name, final=final)


async def get_report(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    final = _final_look(request)
    ep = await q.get_endpoint(ctx.engine, request.match_info["name"])
    report = await _evaluate(ctx, ep, final=final)
    return web.Response(body=report.body, content_type="application/json")


async def gate(request: web.Request) -> web.Response:
    """GET, or POST as rollout webhooks send it (Flagger: the body describes the canary and
    is not needed here, so it is read, bounded, and ignored)."""
    ctx = request.app[CTX]
    final = _final_look(request)
    if request.method == "POST":
        await read_body(request)
    ep = await q.get_endpoint(ctx.engine, request.match_info["name"])
    report = await _evaluate(ctx, ep, final=final)
    status = _GATE_STATUS.get(report.verdict, 425)
    return web.Response(body=report.body, status=status, content_type="application/json")


async def _promotion_result(ctx: AdminContext, rec: PromotionRecord) -> web.Response:
    await _refresh(ctx)
    live = ctx.registry.snapshot.live  # committed; a storage blip now must not turn it into 503
    if live.name != rec.to_endpoint:  # the refresh failed or another change already landed
        live = await q.get_endpoint(ctx.engine, rec.to_endpoint)
    return json_response(s.PromotionResult(promotion=s.promotion_view(rec), live=s.view(live)))


async def promote(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await decode(request, s.PromoteRequest, optional=True)
    rec = await ctx.promotions.promote(
        request.match_info["name"], actor=request[ACTOR], reason=body.reason, force=body.force
    )
    return await _promotion_result(ctx, rec)


async def rollback(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await decode(request, s.RollbackRequest, optional=True)
    rec = await ctx.promotions.rollback(actor=request[ACTOR], reason=body.reason)
    return await _promotion_result(ctx, rec)


# --- the ramp ----------------------------------------------------------------------------------


async def start_rollout(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await decode(request, s.RolloutStart, optional=True)
    rollout = await ctx.rollouts.start(
        request.match_info["name"],
        steps=body.steps,
        min_step_s=body.min_step_s,
        force=body.force,
        reason=body.reason,
        actor=request[ACTOR],
    )
    await _refresh(ctx)
    return json_response(s.rollout_view(rollout), 201)


async def get_rollout(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    return json_response(s.rollout_view(await ctx.rollouts.current()))


def rollout_action(kind: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of `POST /admin/rollout/{kind}` (pause, resume, advance, abort)."""

    async def handle(request: web.Request) -> web.Response:
        ctx = request.app[CTX]
        body = await decode(request, s.RolloutAction, optional=True)
        rollout = await ctx.rollouts.apply(kind, actor=request[ACTOR], reason=body.reason)
        await _refresh(ctx)
        return json_response(s.rollout_view(rollout))

    return handle


async def status(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    snap = ctx.registry.snapshot
    counters, rates = ctx.counters(), ctx.rates()
    try:
        await q.registry_version(ctx.engine)
        last = await q.list_promotions(ctx.engine, 1)
        storage_ok = True
    except se.StorageError:  # status must answer during an outage: it says so instead
        last, storage_ok = [], False
    body = s.StatusView(
        storage_ok=storage_ok,
        registry_version=snap.version,
        live=s.view(snap.live),
        candidates=[
            s.detail(ep, counters.get(ep.name, {}), rates.get(ep.name, {}), ctx.replica)
            for ep in snap.candidates
        ],
        writer=dict(ctx.writer_stats()),
        last_promotion=s.promotion_view(last[0]) if last else None,
    )
    return json_response(body)


# --- the sub-app ------------------------------------------------------------------------------


def _authenticator(
    ctx: AdminContext, guard: AuthGuard, db_file: DatabaseFileGuard
) -> Callable[[web.Request], str]:
    checker = TokenChecker(ctx.tokens)
    labellers = TokenChecker(ctx.labellers)

    def authenticate(request: web.Request) -> str:
        actor = _who(request)
        # A gate POST changes nothing (webhooks send POST): it stays a read.
        writes = request.method in _WRITES and not request.path.endswith("/gate")
        if writes and (problem := db_file.problem()):
            # SQLite would keep writing to the unlinked file and lose it all at exit.
            log.error("admin: write refused: %s", problem)
            refused = se.StorageUnavailable(f"{problem}; restart the gateway")
            # Said without the file's path, as storage errors are; the log line names it.
            refused.http_message = (
                "the database file was replaced or deleted while the gateway runs; "
                "restart the gateway"
            )
            raise refused
        return actor

    def _who(request: web.Request) -> str:
        if not ctx.tokens and not ctx.labellers:  # --insecure-admin: loopback peers only
            if not is_loopback(request.remote):
                raise se.NotFound("admin API is disabled")
            return INSECURE_ACTOR
        peer = request.remote or "unknown"
        wait = guard.retry_after(peer)
        if wait > 0:
            raise RateLimited(
                "too many failed authentications from this address", retry_after_s=round(wait)
            )
        presented = request.headers.get("Authorization")
        label = checker.label_for(presented)
        labeller = labellers.label_for(presented) if label is None else None
        if label is None and labeller is None:
            guard.failed(peer)
            raise NotAuthenticated("missing or invalid bearer token")
        guard.succeeded(peer)
        if labeller is not None and not request.path.startswith(LABELLER_PREFIX):
            raise Forbidden(
                "this token has the labeller role: it may label (/admin/labels/) and nothing else"
            )
        return label or f"{labeller}"

    return authenticate


def build_admin_app(
    ctx: AdminContext,
    admin: AdminConfig | None = None,
    credentials: CredentialsConfig | None = None,
    limits: LimitsConfig | None = None,
) -> web.Application:
    """The `/admin` sub-application (mount it with `gateway.server.app.mount_admin`). `admin`
    supplies the auth back-off, `credentials` the credential policy, `limits` the interval of
    malformed requests' log lines (defaults when None). Raises ConfigError for `insecure` on a
    public listener."""
    from gateway.control.admin.openapi import openapi_document

    mode = admin_mode({**ctx.tokens, **ctx.labellers}, ctx.insecure, ctx.listen_host)
    enabled = mode != "disabled"
    admin = admin if admin is not None else AdminConfig()
    credentials = credentials if credentials is not None else CredentialsConfig()
    guard = AuthGuard(
        admin.auth_failures_allowed,
        admin.auth_backoff_max_s,
        (limits or LimitsConfig()).bad_request_log_interval_s,
    )
    db_file = DatabaseFileGuard(str(ctx.engine.url))
    app = web.Application(middlewares=[boundary(enabled, _authenticator(ctx, guard, db_file))])
    app[CTX] = ctx
    app[CREDENTIALS] = credentials
    app[DB_FILE] = db_file

    async def database_file() -> tuple[bool, str]:
        problem = db_file.problem()
        return problem is None, problem or (f"{db_file.path} in place" if db_file.path else "-")

    checks: dict[str, ReadyCheck] = {"database_file": database_file}
    app[ADMIN_READY_CHECKS] = checks
    collectors: list[Collector] = [guard.prometheus_lines]
    app[ADMIN_COLLECTORS] = collectors
    # Built on first request, in a thread: the document is derived from the report model, whose
    # import pulls in the statistics stack (scipy, ~0.7 s and tens of MiB). A worker that is
    # never asked for it never loads it, and the proxy's loop never waits for the import.
    openapi: list[bytes] = []
    building = asyncio.Lock()

    async def openapi_json(_request: web.Request) -> web.Response:
        async with building:
            if not openapi:
                doc = await asyncio.to_thread(openapi_document, credentials)
                openapi.append(msgspec.json.encode(doc))
        return web.Response(body=openapi[0], content_type="application/json")

    r = app.router
    r.add_get("/candidates", list_candidates, name="candidates")
    r.add_post("/candidates", create_candidate)
    r.add_get("/candidates/{name}", get_candidate)
    r.add_patch("/candidates/{name}", update_candidate)
    r.add_delete("/candidates/{name}", delete_candidate)
    r.add_post("/candidates/{name}/promote", promote)
    r.add_get("/candidates/{name}/report", get_report)
    r.add_get("/candidates/{name}/gate", gate)
    r.add_post("/candidates/{name}/gate", gate)
    r.add_post("/rollback", rollback)
    r.add_post("/candidates/{name}/rollout", start_rollout)
    r.add_get("/rollout", get_rollout)
    for kind in OPERATOR_KINDS:
        r.add_post(f"/rollout/{kind}", rollout_action(kind))
    r.add_get("/status", status)
    r.add_get("/openapi.json", openapi_json, name="openapi")
    add_label_routes(app, ctx.engine, ctx.labels, ctx.verdict_settings)
    ui.add_routes(r, token_required=mode == "tokens")  # the live page: calls the routes above
    return app
