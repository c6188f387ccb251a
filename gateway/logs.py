"""Structured process logs for the gateway, as JSON lines or human-readable text.

`setup_logging` configures the root logger once per process (`--log-format json|text`). Code
logs events with fields in `extra={"fields": {...}}`; the JSON format writes them as keys, the
text format as `key=value`. Logs are for start-up, shutdown and rare events: the proxy's hot path
never logs (it counts, and `/metrics` exports the counts), and there is no access log by default.
This module must never log request bodies, headers or credentials.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Literal, TextIO

import msgspec

_encode = msgspec.json.Encoder().encode


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the record's fields, exc when any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encode(out).decode()


class TextFormatter(logging.Formatter):
    """`2024-01-01T12:00:00Z info canary.gateway: message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        line = f"{stamp} {record.levelname.lower()} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(
    fmt: Literal["json", "text"] = "text",
    level: str = "info",
    *,
    stream: TextIO | None = None,
) -> None:
    """Send all logs to `stream` (stderr) in `fmt`; replaces handlers set by earlier calls."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log is off (no access_log on the runner); keep its other loggers quiet.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Alembic narrates every plugin and revision at INFO; the gateway logs the outcome itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)
