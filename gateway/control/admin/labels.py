"""The labelling API: people label graded pairs blind (docs/grading.md, People check the grader).

`/admin/labels/{name}/…` is all a labeller token may reach (`LABELLER_PREFIX`): the next pair
(the conversation and two answers as A and B in a random order, never the grader's verdict nor
which is the candidate's), a label (A, B, tie or skip; committed before the 2xx), undo, and
progress against the candidate's `min_labels` (the plan's target), with the rubric its grader
was given, so that people answer the grader's question. An admin token may label too. Export
and import of the labels (JSONL) are admin-only, under `/admin/candidates/{name}/labels`.
With `store_text = false` no pair is kept, and every labelling call is refused with 409 naming
`storage.store_text`.

Never: return or log a pair's verdict or arms, or a request body.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import InvalidSettings
from gateway.control.admin.boundary import ACTOR, ApiError, decode, json_response
from gateway.mirror.grading.request import DEFAULT_PROMPT
from storage import labels as lb
from storage import queries as q

if TYPE_CHECKING:
    from evaluators.judge.settings import VerdictSettings

__all__ = ["LABELLER_PREFIX", "LabelBody", "add_routes", "openapi_paths", "rubric_of"]

LABELLER_PREFIX: Final = "/admin/labels/"
# An import is one JSONL file of labels (about 150 bytes a label): 16 MiB holds 100,000.
MAX_IMPORT_BYTES: Final = 16 * 1024 * 1024


class LabelBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A label of the pair the API offered: its `exchange_id` and `order`, and the answer."""

    exchange_id: str
    order: Literal["ca", "rc"]
    answer: Literal["A", "B", "tie", "skip"]


class LabelSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the labelling routes need of the config (`[admin]` and `[storage]`)."""

    store_text: bool = True
    double_rate: float = 0.1
    retention_s: float = 30 * 86400.0


SETTINGS = web.AppKey("canary_admin_label_settings", LabelSettings)
ENGINE = web.AppKey("canary_admin_label_engine", AsyncEngine)
_PURGED_AT = web.AppKey("canary_admin_label_purged_at", list[float])
_PURGE_EVERY_S: Final = 60.0  # the kept text past retention is deleted at most this often
VERDICT: web.AppKey[VerdictSettings] = web.AppKey("canary_admin_label_verdict")
# Where a grading prompt's instructions end: the first placeholder, or the heading before it.
_PLACEHOLDERS: Final = ("{conversation}", "{answer_a}", "{answer_b}")
_HEADING: Final = "[Conversation]"


def rubric_of(prompt: str | None) -> str:
    """What a grading prompt asks, for people: its text before the pair (the default rubric
    without its conversation, answers and reply format)."""
    text = DEFAULT_PROMPT if prompt is None else prompt
    cut = min((i for p in _PLACEHOLDERS if (i := text.find(p)) >= 0), default=len(text))
    head = text[:cut]
    if (h := head.rfind(_HEADING)) >= 0 and not head[h + len(_HEADING) :].strip():
        head = head[:h]
    return head.strip().replace("{{", "{").replace("}}", "}")


def _target(request: web.Request, endpoint: Endpoint) -> int:
    """The candidate's `min_labels`: the labels its plan asks for before people may gate."""
    verdict = request.app[VERDICT]
    try:
        return verdict.with_overrides(endpoint.verdict).min_labels
    except InvalidSettings:
        return verdict.min_labels  # a stored override the verdict refuses: the report says why


def _settings(request: web.Request) -> LabelSettings:
    settings = request.app[SETTINGS]
    if not settings.store_text:
        raise ApiError(
            409, "conflict",
            "labelling needs the answers' text: storage.store_text is false, so no pair is kept",
            field="storage.store_text",
        )  # fmt: skip
    return settings


async def _purge(request: web.Request, settings: LabelSettings) -> None:
    now, last = time.monotonic(), request.app[_PURGED_AT]
    if not last or now - last[0] >= _PURGE_EVERY_S:
        last[:] = [now]
        await lb.purge(request.app[ENGINE], settings.retention_s)


async def next_pair(request: web.Request) -> web.Response:
    settings = _settings(request)
    await _purge(request, settings)
    name, who = request.match_info["name"], request[ACTOR]
    engine = request.app[ENGINE]
    offer = await lb.next_pair(engine, name, who, double_rate=settings.double_rate)
    progress = await lb.progress(engine, name, who)
    endpoint = await q.get_endpoint(engine, name)
    grader = endpoint.grader
    return json_response(
        {
            "pair": offer,
            "progress": progress,
            "target": _target(request, endpoint),
            "rubric": rubric_of(grader.prompt if grader is not None else None),
        }
    )


async def post_label(request: web.Request) -> web.Response:
    _settings(request)
    body = await decode(request, LabelBody)
    name = request.match_info["name"]
    record = lb.record_of(
        name, request[ACTOR], body.exchange_id, body.order, body.answer, time.time()
    )
    await lb.add_label(request.app[ENGINE], record)
    return json_response({"stored": True, "exchange_id": record.exchange_id}, 201)


async def undo(request: web.Request) -> web.Response:
    _settings(request)
    undone = await lb.undo_last(request.app[ENGINE], request.match_info["name"], request[ACTOR])
    if undone is None:
        raise ApiError(404, "not_found", "nothing to undo: no label of yours", field="name")
    return json_response({"undone": undone.exchange_id})


async def export_labels(request: web.Request) -> web.Response:
    await q.get_endpoint(request.app[ENGINE], request.match_info["name"])  # 404 when unknown
    records = await lb.labels_of(request.app[ENGINE], request.match_info["name"])
    return web.Response(body=lb.export_jsonl(records), content_type="application/x-ndjson")


async def import_labels(request: web.Request) -> web.Response:
    await q.get_endpoint(request.app[ENGINE], request.match_info["name"])  # 404 when unknown
    buf = bytearray()
    async for chunk in request.content.iter_any():
        buf += chunk
        if len(buf) > MAX_IMPORT_BYTES:
            raise ApiError(413, "payload_too_large", f"body over {MAX_IMPORT_BYTES} bytes")
    records = lb.parse_jsonl(bytes(buf))
    name = request.match_info["name"]
    for i, r in enumerate(records, 1):
        if r.endpoint != name:
            raise ApiError(
                422, "validation_error",
                f"line {i}: endpoint {r.endpoint!r} is not {name!r}", field=f"line {i}",
            )  # fmt: skip
    stored, same = await lb.import_jsonl(request.app[ENGINE], records)
    return json_response({"stored": stored, "already": same})


def add_routes(
    app: web.Application,
    engine: AsyncEngine,
    settings: LabelSettings,
    verdict: VerdictSettings | None = None,
) -> None:
    """Register the labelling routes on the admin sub-app; `verdict`: the gateway's verdict
    settings, under each candidate's own (its `min_labels` is the progress's target)."""
    if verdict is None:
        from evaluators.judge.settings import VerdictSettings

        verdict = VerdictSettings()
    app[ENGINE] = engine
    app[SETTINGS] = settings
    app[VERDICT] = verdict
    app[_PURGED_AT] = []
    r = app.router
    r.add_get("/labels/{name}/next", next_pair)
    r.add_post("/labels/{name}", post_label)
    r.add_post("/labels/{name}/undo", undo)
    r.add_get("/candidates/{name}/labels", export_labels)
    r.add_post("/candidates/{name}/labels", import_labels)


def openapi_paths(op: Any, json: Any, ref: Any) -> dict[str, Any]:
    """The routes above in the OpenAPI document (`op`, `json`, `ref`: its builders)."""
    ndjson = {"description": "One label a line", "content": {"application/x-ndjson": {}}}
    return {
        "/labels/{name}/next": {
            "get": op(
                "nextLabelPair",
                "The next pair to label (blind, random order), the caller's progress against the "
                "target (the candidate's `min_labels`) and the rubric its grader was given",
                {200: json({"type": "object"}, "The pair (null: none left), progress, rubric")},
                (409,),
                name_param=True,
            )
        },
        "/labels/{name}": {
            "post": op(
                "postLabel",
                "Store a label of the offered pair (durable before the 201)",
                {201: json({"type": "object"}, "Stored")},
                (400, 409, 413, 422),
                body=("LabelBody", True),
                name_param=True,
            )
        },
        "/labels/{name}/undo": {
            "post": op(
                "undoLabel",
                "Delete the caller's latest label of this candidate",
                {200: json({"type": "object"}, "Undone")},
                (409,),
                name_param=True,
            )
        },
        "/candidates/{name}/labels": {
            "get": op(
                "exportLabels",
                "Every label of the candidate as JSONL",
                {200: ndjson},
                (),
                name_param=True,
            ),
            "post": op(
                "importLabels",
                "Import labels from JSONL (all or nothing)",
                {200: json({"type": "object"}, "Counts stored and already there")},
                (409, 413, 422),
                name_param=True,
            ),
        },
    }
