"""An async client of the admin REST API, used by the `canary` CLI (and usable by scripts).

Responses are decoded into the Structs of `gateway.control.admin.schema`. Two exceptions, and only
two,
leave this module: `AdminAPIError` (the API answered with an error: its status and message) and
`AdminUnreachable` (no answer at all). The bearer token is sent, never printed.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from domain.errors import EXIT_FAILURE, EXIT_USAGE, CanaryError
from gateway.control.admin import schema as s

T = TypeVar("T")


class AdminAPIError(CanaryError):
    """The admin API answered with an error status: exit 2 for a refusal (4xx, the operator's
    to fix), 1 for a server failure."""

    http_status = 502
    code = "admin_api_error"

    def __init__(self, status: int, message: str, error: s.ErrorInfo | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.exit_code = EXIT_USAGE if status < 500 else EXIT_FAILURE

    def cli_lines(self) -> list[str]:
        """A refused promote's reasons, one per line (the verdict is already in the message)."""
        detail = self.error.detail if self.error is not None else None
        if not detail or not isinstance(detail.get("reasons"), list):
            return []
        lines = [
            f"  {r.get('metric', '?'):<14}{r.get('status', ''):<14}{r.get('reason', '')}"
            for r in detail["reasons"]
            if isinstance(r, dict) and r.get("metric") != "verdict"
        ]
        return [*lines, "use --force to promote anyway (the audit log records it)"]


class AdminUnreachable(CanaryError):
    """The admin API did not answer (refused, reset, timed out, not HTTP). Exit code 1."""

    http_status = 502
    code = "admin_unreachable"


def admin_base(url: str) -> str:
    """Accept the gateway's base URL or its `/admin` URL; return the `/admin` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/admin") else url + "/admin"


class AdminClient:
    """`async with AdminClient(url, token) as c: await c.list_candidates()`."""

    def __init__(
        self, url: str, token: str | None, *, timeout_s: float = 60.0, token_source: str = ""
    ) -> None:
        """`token_source` names where a token would come from, for a 401's hint."""
        self.url = url
        self._token_source = token_source
        self.base = admin_base(url)
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdminClient:
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self, method: str, path: str, body: object = None, ok: tuple[int, ...] = ()
    ) -> tuple[int, bytes]:
        if self._session is None:
            raise RuntimeError("use AdminClient as an async context manager")
        data = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._session.request(
                method, self.base + path, data=data, headers=headers
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise AdminUnreachable(
                f"cannot reach the admin API at {self.url}: {_why(exc, self._timeout.total)}"
            ) from exc
        if status >= 400 and status not in ok:
            error = _error(status, raw)
            if status == 401 and "Authorization" not in self._headers and self._token_source:
                error.args = (f"{error} (set {self._token_source})",)
            raise error
        return status, raw

    async def _get(self, path: str, type_: type[T]) -> T:
        _, raw = await self._call("GET", path)
        return _decode(raw, type_)

    async def list_candidates(self) -> s.CandidateList:
        return await self._get("/candidates", s.CandidateList)

    async def get_candidate(self, name: str) -> s.CandidateDetail:
        return await self._get(f"/candidates/{quote(name, safe='')}", s.CandidateDetail)

    async def create_candidate(self, fields: dict[str, Any]) -> s.EndpointView:
        _, raw = await self._call("POST", "/candidates", fields)
        return _decode(raw, s.EndpointView)

    async def update_candidate(self, name: str, changes: dict[str, Any]) -> s.EndpointView:
        _, raw = await self._call("PATCH", f"/candidates/{quote(name, safe='')}", changes)
        return _decode(raw, s.EndpointView)

    async def delete_candidate(self, name: str) -> None:
        await self._call("DELETE", f"/candidates/{quote(name, safe='')}")

    async def promote(self, name: str, *, reason: str, force: bool) -> s.PromotionResult:
        body = {"reason": reason, "force": force}
        _, raw = await self._call("POST", f"/candidates/{quote(name, safe='')}/promote", body)
        return _decode(raw, s.PromotionResult)

    async def rollback(self, *, reason: str) -> s.PromotionResult:
        _, raw = await self._call("POST", "/rollback", {"reason": reason})
        return _decode(raw, s.PromotionResult)

    async def start_rollout(self, name: str, body: dict[str, Any]) -> s.RolloutView:
        _, raw = await self._call("POST", f"/candidates/{quote(name, safe='')}/rollout", body)
        return _decode(raw, s.RolloutView)

    async def rollout(self) -> s.RolloutView:
        return await self._get("/rollout", s.RolloutView)

    async def rollout_action(self, action: str, *, reason: str) -> s.RolloutView:
        _, raw = await self._call("POST", f"/rollout/{quote(action, safe='')}", {"reason": reason})
        return _decode(raw, s.RolloutView)

    async def status(self) -> s.StatusView:
        return await self._get("/status", s.StatusView)

    async def report(self, name: str) -> dict[str, Any]:
        return await self._get(f"/candidates/{quote(name, safe='')}/report", dict[str, Any])

    async def label_next(self, name: str) -> dict[str, Any]:
        """The next pair to label (blind), the caller's progress, the target and the rubric."""
        return await self._get(f"/labels/{quote(name, safe='')}/next", dict[str, Any])

    async def label(self, name: str, body: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Store a label: (201, stored), or a refusal a labeller goes on after (404: the pair
        or the candidate is gone, 409: labelled already) with its error body."""
        path = f"/labels/{quote(name, safe='')}"
        status, raw = await self._call("POST", path, body, ok=(404, 409))
        return status, _decode(raw, dict[str, Any])

    async def label_undo(self, name: str) -> tuple[int, dict[str, Any]]:
        """Undo the caller's latest label: (200, undone), or (404, error): nothing to undo."""
        path = f"/labels/{quote(name, safe='')}/undo"
        status, raw = await self._call("POST", path, ok=(404,))
        return status, _decode(raw, dict[str, Any])

    async def gate(self, name: str) -> tuple[int, dict[str, Any]]:
        path = f"/candidates/{quote(name, safe='')}/gate"
        status, raw = await self._call("GET", path, ok=(412, 425))
        return status, _decode(raw, dict[str, Any])


def _why(exc: BaseException, timeout_s: float | None) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return str(exc.os_error)
    return str(exc) or type(exc).__name__


def _decode(raw: bytes, type_: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.MsgspecError as exc:
        raise AdminUnreachable(f"the admin API answered something unexpected: {exc}") from exc


def _error(status: int, raw: bytes) -> AdminAPIError:
    try:
        info = msgspec.json.decode(raw, type=s.ErrorBody).error
    except msgspec.MsgspecError:
        text = raw.decode("utf-8", "replace").strip()[:200]
        return AdminAPIError(status, f"HTTP {status}" + (f": {text}" if text else ""))
    return AdminAPIError(status, info.message, info)
