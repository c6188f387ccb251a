"""Record -> row conversion for the writer, with the guards that keep a row insertable and
within policy: strings cut to their column's length, NUL characters replaced (PostgreSQL text
cannot hold them), output text cut to `max_chars` or — with `store_text=False` — removed, its
xxh3_128 hash kept, and tool-call arguments replaced by their hashes. Pure functions, no IO.
"""

from __future__ import annotations

from typing import Any

import msgspec
import xxhash
from sqlalchemy import String, Table

from storage.records import ExchangeRecord, ObservationRecord
from storage.sql import EXCHANGES, OBSERVATIONS

Row = dict[str, Any]

_decode_tools = msgspec.json.Decoder(list[dict[str, Any]]).decode
_encode = msgspec.json.Encoder().encode


def _limits(table: Table) -> dict[str, int]:
    return {
        c.name: c.type.length
        for c in table.columns
        if isinstance(c.type, String) and c.type.length is not None
    }


_EXCHANGE_LIMITS = _limits(EXCHANGES)
_OBSERVATION_LIMITS = _limits(OBSERVATIONS)


def text_hash(text: str) -> str:
    """The hash the meter uses: hex xxh3_128 of the UTF-8 text."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def _clean(row: Row, limits: dict[str, int]) -> Row:
    for key, value in row.items():
        if isinstance(value, str):
            if "\x00" in value:
                value = row[key] = value.replace("\x00", "\ufffd")
            limit = limits.get(key)
            if limit is not None and len(value) > limit:
                row[key] = value[:limit]
    return row


def exchange_row(record: ExchangeRecord) -> Row:
    row = msgspec.structs.asdict(record)
    # Delimited on both sides so `LIKE '%,name,%'` matches a whole name only.
    row["targets"] = f",{','.join(record.targets)}," if record.targets else ""
    return _clean(row, _EXCHANGE_LIMITS)


def redact_tool_calls(tool_calls: str | None) -> str | None:
    """Keep each tool call's name, replace its arguments by their hash; None if unparseable."""
    if tool_calls is None:
        return None
    try:
        calls = _decode_tools(tool_calls)
    except msgspec.DecodeError:
        return None
    out = []
    for call in calls:
        args = call.get("arguments")
        hashed = None if args is None else "xxh3:" + text_hash(str(args))
        out.append({"name": call.get("name"), "arguments": hashed})
    return _encode(out).decode()


def observation_row(record: ObservationRecord, *, store_text: bool, max_chars: int) -> Row:
    row = msgspec.structs.asdict(record)
    text = record.output_text
    if text is not None:
        if record.output_hash is None:
            row["output_hash"] = text_hash(text)
        if not store_text:
            row["output_text"] = None
        elif len(text) > max_chars:
            row["output_text"] = text[:max_chars]
            row["text_truncated"] = True
    if not store_text:
        row["tool_calls"] = redact_tool_calls(record.tool_calls)
    return _clean(row, _OBSERVATION_LIMITS)
