"""The admin API's HTTP boundary: bounded body reading, msgspec decoding into the request
Structs, the one error shape, and the one place where domain and storage errors become HTTP
statuses (`map_exception`, called by `boundary`, the sub-app's middleware).

Handlers never pick a status: they raise the tree's classes (domain/errors.py, and the admin's
own refusals declared here: `InvalidField`, `NotAuthenticated`, `Forbidden`, `RateLimited`),
whose class attributes are their mapping. `ApiError` (a status per instance) is for this
module's own protocol answers: a body too large, not JSON, or not the request's shape.

Never echo a request value in an error message (it may be a secret sent by mistake): messages
name the field and the rule, which is all msgspec's own messages do too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from domain import errors as se
from domain.endpoint import PATTERN_REASONS
from domain.errors import CanaryError
from gateway.control.admin import schema as s
from gateway.control.admin.ui import is_public
from storage.sql import is_transient

log = logging.getLogger("canary.admin")

MAX_BODY_BYTES = 64 * 1024  # an admin body is a few hundred bytes; refuse anything absurd
# Unknown body fields whose name suggests a credential get a message pointing at credentials_env.
SECRET_LIKE = ("key", "token", "secret", "password", "passwd", "credential", "authorization")
_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="canary-admin"'}
_encode = msgspec.json.Encoder().encode
# Fields whose max_length (the column's) repeats their pattern's length bound.
_LENGTH_IN_PATTERN = frozenset({"name", "credentials_env"})
ACTOR = web.RequestKey("canary_admin_actor", str)  # the token's label, for the audit log

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InvalidField(se.UsageError):
    """A field or query parameter of an admin request that passed its type but not its rule (a
    URL's scheme, a forbidden credential variable, a value outside its choices)."""

    code = "validation_error"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.http_field = field


class NotAuthenticated(CanaryError):
    """No bearer token, or not one of the configured ones; answered with a Bearer challenge."""

    exit_code = se.EXIT_USAGE
    http_status = 401
    code = "authentication_error"

    def http_headers(self) -> dict[str, str] | None:
        return dict(_CHALLENGE)


class Forbidden(CanaryError):
    """A valid token whose role may not use the route (a labeller's outside the labels)."""

    exit_code = se.EXIT_USAGE
    http_status = 403
    code = "forbidden"
    http_field = "Authorization"


class RateLimited(CanaryError):
    """Too many failed authentications from one address: try again after `retry_after_s`."""

    exit_code = se.EXIT_USAGE
    http_status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)

    def http_headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)}


class ApiError(CanaryError):
    """An answer other than 2xx, raised by a handler and rendered by `boundary`."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        field: str | None = None,
        detail: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.field, self.detail = status, type_, field, detail
        self.http_status, self.code = status, type_
        self.headers = headers

    def http_headers(self) -> dict[str, str] | None:
        return dict(self.headers) if self.headers is not None else None


def json_response(
    obj: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=_encode(obj), status=status, content_type="application/json", headers=headers
    )


def error_response(exc: ApiError, headers: Mapping[str, str] | None = None) -> web.Response:
    info = s.ErrorInfo(
        message=str(exc), type=exc.type, code=exc.status, field=exc.field, detail=exc.detail
    )
    return json_response(s.ErrorBody(error=info), exc.status, headers)


def map_exception(exc: BaseException) -> ApiError:
    """The one map from an exception to an HTTP answer (the admin API's and the report
    process's): an ApiError as it is; any other CanaryError by its class's `http_status`,
    `code`, `http_message`, `http_field`, `http_detail()` and `http_headers()`
    (domain/errors.py); a database
    driver's transient error (an evaluator's read) as StorageUnavailable; anything else, a
    stray KeyError included, a logged 500."""
    if isinstance(exc, ApiError):
        return exc
    if not isinstance(exc, CanaryError) and is_transient(exc):
        exc = se.StorageUnavailable(str(exc))
    if not isinstance(exc, CanaryError) or exc.http_status == 500:
        log.error("admin: unexpected error", exc_info=exc)
        return ApiError(500, "internal_error", "internal error (see the gateway log)")
    if exc.http_status >= 500:
        log.warning("admin: %s: %s", exc.code, exc)
    message = exc.http_message or str(exc)
    return ApiError(
        exc.http_status,
        exc.code,
        message,
        field=exc.http_field,
        detail=exc.http_detail(),
        headers=exc.http_headers(),
    )


def boundary(enabled: bool, authenticate: Callable[[web.Request], str]) -> Any:
    """The sub-app middleware: 404 when disabled, then authentication (which returns the actor
    or raises), then the handler; every failure leaves in the error shape, by `map_exception`."""

    @web.middleware
    async def admin_boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if not enabled:
                raise se.NotFound("admin API is disabled (no admin token set)")
            name = request.match_info.route.name
            if name != "openapi" and not is_public(name):  # the page's files hold no data
                request[ACTOR] = authenticate(request)
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            err = ApiError(exc.status, _HTTP_TYPES.get(exc.status, "http_error"), exc.reason)
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return error_response(err, allow)
        except Exception as exc:  # the boundary: everything becomes the error shape
            err = map_exception(exc)
            return error_response(err, err.headers)

    return admin_boundary


async def read_body(request: web.Request) -> bytes:
    buf = bytearray()
    async for chunk in request.content.iter_any():
        buf += chunk
        if len(buf) > MAX_BODY_BYTES:
            raise ApiError(413, "payload_too_large", f"body over {MAX_BODY_BYTES} bytes")
    return bytes(buf)


def validation_error(exc: msgspec.ValidationError) -> ApiError:
    """msgspec's message ("Expected `float` <= 1.0 - at `$.sample_rate`") -> field + reason."""
    msg, _, path = str(exc).partition(" - at `")
    path = path.rstrip("`").rpartition("` in `")[2]  # "key` in `$.verdict": a dict key
    field = path.removeprefix("$").lstrip(".").split("[", 1)[0] or None
    for prefix in ("Object contains unknown field `", "Object missing required field `"):
        if msg.startswith(prefix):
            name = msg[len(prefix) :].rstrip("`")
            field = f"{field}.{name}" if field else name
            msg = "unknown field" if "unknown" in prefix else "required field is missing"
            if "unknown" in prefix and any(w in name.lower() for w in SECRET_LIKE):
                msg += (
                    ": credentials are never accepted by value; put the secret in an "
                    "environment variable of the gateway and send its name as credentials_env"
                )
    top = (field or "").split(".", 1)[0]
    if msg.startswith("Expected `str` matching regex") and field:
        # A sub-struct's field (grader.url) has the reason of the field it is named after.
        last = field.rsplit(".", 1)[-1]
        msg = PATTERN_REASONS.get(top) or PATTERN_REASONS.get(last, "has an invalid format")
    elif msg.startswith("Expected `str` of length") and top in _LENGTH_IN_PATTERN:
        msg = PATTERN_REASONS[top]  # the pattern's own length bound, said as the pattern says it
    return ApiError(422, "validation_error", f"{field or 'body'}: {msg}", field=field)


async def decode(request: web.Request, type_: type[T], *, optional: bool = False) -> T:
    """The body as `type_`: 400 when it is not JSON, 422 when it does not validate. With
    `optional`, an empty body means `{}` (every field has a default)."""
    raw = await read_body(request)
    if optional and not raw.strip():
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        if "got `float`" not in str(exc):
            raise validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
    # JSON has one number type: `3.0` is the integer 3 (JSON Schema's `integer`, which the
    # OpenAPI document speaks, says so too; schemathesis found `12437.0` refused).
    try:
        return msgspec.convert(_integral(msgspec.json.decode(raw)), type_)
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None


def _integral(value: Any) -> Any:
    """`value` with every finite float that has no fractional part as an int."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
