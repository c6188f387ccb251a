"""The OpenAPI 3.1 document of the admin API, generated from the msgspec Structs that the
handlers decode and encode (so the schema cannot drift from the validation), plus the report's
own Structs from `evaluators.report.model`. Built once when the admin app is built; no IO.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.endpoint import NAME_PATTERN, CandidatePatch
from gateway.config.load import settings_variables
from gateway.config.sections import CredentialsConfig
from gateway.control.admin.labels import LabelBody
from gateway.control.admin.labels import openapi_paths as label_paths
from gateway.control.admin.schema import (
    FINAL_FALSE,
    FINAL_TRUE,
    CandidateCreate,
    CandidateDetail,
    CandidateList,
    EndpointView,
    ErrorBody,
    PromoteRequest,
    PromotionResult,
    RollbackRequest,
    RolloutAction,
    RolloutStart,
    RolloutView,
    StatusView,
)

_REF = "#/components/schemas/{name}"
_COMPONENTS: tuple[Any, ...] = (
    CandidateCreate,
    CandidatePatch,
    PromoteRequest,
    RollbackRequest,
    RolloutStart,
    RolloutAction,
    RolloutView,
    EndpointView,
    CandidateDetail,
    CandidateList,
    PromotionResult,
    StatusView,
    ErrorBody,
    LabelBody,
)
_ERRORS = {
    400: "Malformed JSON body (not parseable as JSON)",
    401: "Missing or wrong bearer token",
    404: "Unknown endpoint name, or the admin API is disabled",
    409: "Conflicts with the current state (duplicate name, live endpoint, lost race, "
    "refused promote: `error.detail` holds the verdict and reasons)",
    413: "Body over 64 KiB",
    422: "Validation error: `error.field` names the field, `error.message` the reason; or "
    "`report_too_large`: the report's window holds more pairs than `[reports] max_pairs`",
    503: "Storage is unavailable, or no report can be had now (`reports_unavailable`)",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _op(
    op_id: str,
    summary: str,
    ok: dict[int, dict[str, Any]],
    errors: tuple[int, ...],
    body: tuple[str, bool] | None = None,
    name_param: bool = False,
) -> dict[str, Any]:
    responses: dict[str, Any] = {str(code): r for code, r in ok.items()}
    for code in (401, 404, 503, *errors):
        responses[str(code)] = _json(_ref("ErrorBody"), _ERRORS[code])
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    if name_param:
        op["parameters"] = [
            {
                "name": "name",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": NAME_PATTERN},
            }
        ]
    if body is not None:
        schema_name, required = body
        op["requestBody"] = {
            "required": required,
            "content": {"application/json": {"schema": _ref(schema_name)}},
        }
    return op


def _final(op: dict[str, Any]) -> dict[str, Any]:
    """Add the `final` query parameter (the planned final look) to a report operation."""
    op.setdefault("parameters", []).append(
        {
            "name": "final",
            "in": "query",
            "required": False,
            "description": "This is the planned final look: a guardrail beyond its margin "
            "rejects (Holm), and tail quantiles are bootstrapped.",
            "schema": {"type": "string", "enum": [*FINAL_TRUE, *FINAL_FALSE]},
        }
    )
    return op


def _narrow_credentials_env(components: dict[str, Any], settings: CredentialsConfig) -> None:
    """`credentials_env` as this gateway's policy accepts it (the prefix, the allow-list, never
    a variable of the gateway's own settings), so that what the document calls valid the
    handler does not refuse (found by schemathesis: a schema-valid name answered 422)."""
    prefix = settings.candidate_prefix
    options = [f"{prefix}[A-Z0-9_]{{1,{128 - len(prefix)}}}"] if prefix else []
    options += sorted(settings.candidate_allow)
    # The gateway's own settings variables are refused even when they carry the prefix.
    refused = sorted(v for v in settings_variables() if prefix and v.startswith(prefix))
    for body in ("CandidateCreate", "CandidatePatch"):
        branches = components[body]["properties"]["credentials_env"]["anyOf"]
        text = next(b for b in branches if b.get("type") == "string")
        if not options:  # neither a prefix nor an allow-list: no name is accepted
            branches.remove(text)
            continue
        text["pattern"] = "^(?:" + "|".join(options) + ")$"
        if refused:
            text["not"] = {"enum": refused}


def openapi_document(settings: CredentialsConfig | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 description of the admin API (served at `/admin/openapi.json`), with
    the credential policy `settings` when given."""
    from evaluators.judge.settings import VerdictSettings
    from evaluators.report.model import Report

    _, components = msgspec.json.schema_components((*_COMPONENTS, Report), ref_template=_REF)
    # The names a verdict override may use and each value's type (a whole number where the
    # setting is one: schemathesis found 1.5 for `min_pairs` "valid"); their ranges and
    # relations (delta <= critical) are VerdictSettings.validate's, checked by the handler
    # (422 naming `verdict`): JSON Schema cannot relate two values.
    _, settings_schema = msgspec.json.schema_components((VerdictSettings,), ref_template=_REF)
    per_key = settings_schema["VerdictSettings"]["properties"]
    for body in ("CandidateCreate", "CandidatePatch"):
        verdict = components[body]["properties"]["verdict"]
        verdict.pop("additionalProperties", None)
        verdict["properties"] = {
            name: {"type": per_key[name]["type"]} for name in VerdictSettings.__struct_fields__
        }
        verdict["additionalProperties"] = False
    if settings is not None:
        _narrow_credentials_env(components, settings)
    report = _json(_ref("Report"), "The report")
    gate_args = (
        "Rollout gate: 200 promote, 412 reject, 425 hold (body: the report). POST accepts "
        "and ignores a webhook's JSON body.",
        {
            200: _json(_ref("Report"), "Verdict is promote"),
            412: _json(_ref("Report"), "Verdict is reject"),
            425: _json(_ref("Report"), "Verdict is hold: not enough evidence yet"),
        },
    )
    endpoint = _json(_ref("EndpointView"), "The endpoint")
    rollout = _json(_ref("RolloutView"), "Committed; the rollout now")
    actions = {
        "pause": "Hold the weight where it is (the controller stops judging)",
        "resume": "Let a paused rollout run again",
        "advance": "Move a running rollout to the next step now (an operator's override of "
        "the dwell; a paused one answers 409 not_running: resume it first)",
        "abort": "Send every session back to production at once and close the rollout",
    }
    rollout_paths = {
        f"/rollout/{kind}": {
            "post": _op(
                f"{kind}Rollout",
                summary,
                {200: rollout},
                (400, 409, 413, 422),
                body=("RolloutAction", False),
            )
        }
        for kind, summary in actions.items()
    }
    promoted = _json(_ref("PromotionResult"), "Committed; the audit row and the new live")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "canary-gateway admin API",
            "version": "1",
            "description": (
                "Register, watch, promote and roll back candidate endpoints. Every change is "
                "committed to storage before a 2xx answer. Request bodies are JSON (whatever "
                "the Content-Type); a body that is not JSON is a 400, a JSON body that fails "
                "validation a 422 naming the field. Errors always have the shape "
                '{"error": {"message", "type", "code", "field"?, "detail"?}}.'
            ),
        },
        "servers": [{"url": "/admin"}],
        "security": [{"bearer": []}],
        "paths": {
            "/candidates": {
                "get": _op(
                    "listCandidates",
                    "List candidates and retired endpoints",
                    {200: _json(_ref("CandidateList"), "The list")},
                    (),
                ),
                "post": _op(
                    "createCandidate",
                    "Register a candidate",
                    {201: _json(_ref("EndpointView"), "Created and committed")},
                    (400, 409, 413, 422),
                    body=("CandidateCreate", True),
                ),
            },
            "/candidates/{name}": {
                "get": _op(
                    "getCandidate",
                    "One endpoint with this replica's counters and buffer fill",
                    {200: _json(_ref("CandidateDetail"), "The endpoint")},
                    (),
                    name_param=True,
                ),
                "patch": _op(
                    "updateCandidate",
                    "Change mutable fields (incl. state: paused|active)",
                    {200: endpoint},
                    (400, 409, 413, 422),
                    body=("CandidatePatch", True),
                    name_param=True,
                ),
                "delete": _op(
                    "deleteCandidate",
                    "Remove a candidate or retired endpoint (never the live one)",
                    {204: {"description": "Deleted and committed"}},
                    (409,),
                    name_param=True,
                ),
            },
            "/candidates/{name}/promote": {
                "post": _op(
                    "promoteCandidate",
                    "Make the candidate live; refused unless the verdict is promote or force",
                    {200: promoted},
                    (400, 409, 413, 422),
                    body=("PromoteRequest", False),
                    name_param=True,
                ),
            },
            "/candidates/{name}/report": {
                "get": _final(
                    _op(
                        "getReport",
                        "The promotion report",
                        {200: report},
                        (422,),
                        name_param=True,
                    )
                ),
            },
            "/candidates/{name}/gate": {
                "get": _final(_op("gateCandidate", *gate_args, (422,), name_param=True)),
                "post": _final(
                    _op("gateCandidateWebhook", *gate_args, (413, 422), name_param=True)
                ),
            },
            "/rollback": {
                "post": _op(
                    "rollback",
                    "Restore the previous live endpoint",
                    {200: promoted},
                    (400, 409, 413, 422),
                    body=("RollbackRequest", False),
                ),
            },
            "/candidates/{name}/rollout": {
                "post": _op(
                    "startRollout",
                    "Ramp the candidate on live traffic (needs a promote verdict, or force "
                    "and a reason); 409 while another rollout is open",
                    {201: _json(_ref("RolloutView"), "Started and committed")},
                    (400, 409, 413, 422),
                    body=("RolloutStart", False),
                    name_param=True,
                ),
            },
            "/rollout": {
                "get": _op(
                    "getRollout",
                    "The open rollout, else the most recent (state none before the first)",
                    {200: _json(_ref("RolloutView"), "The rollout")},
                    (),
                ),
            },
            **rollout_paths,
            **label_paths(_op, _json, _ref),
            "/status": {
                "get": _op(
                    "status",
                    "Live endpoint, candidates with counters, writer queue",
                    {200: _json(_ref("StatusView"), "This replica's status")},
                    (),
                ),
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document (no token needed)",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "404": _json(_ref("ErrorBody"), _ERRORS[404]),
                    },
                },
            },
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
