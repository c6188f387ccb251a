"""Record -> row conversion for the writer, with the guards that keep a row insertable and
within policy: strings cut to their column's length, NUL characters replaced (PostgreSQL text
cannot hold them), output text kept by `domain.observation.kept_text` (cut to `max_chars`, or
removed with `store_text=False`), its xxh3_128 hash kept, and tool-call arguments replaced by
their hashes. Pure functions, no IO.
"""

from __future__ import annotations

from typing import Any

import msgspec
import xxhash
from sqlalchemy import String, Table

from domain.observation import kept_text
from domain.records import ExchangeRecord, ObservationRecord
from storage.sql import EXCHANGES, OBSERVATIONS

Row = dict[str, Any]

_decode_tools = msgspec.json.Decoder(list[dict[str, Any]]).decode
_encode = msgspec.json.Encoder().encode


def _string_columns(table: Table, record: type[msgspec.Struct]) -> tuple[tuple[str, int], ...]:
    """(field, max length or 0) for each of the record's fields stored in a text column."""
    fields = {f.name for f in msgspec.structs.fields(record)}
    return tuple(
        (c.name, c.type.length or 0)
        for c in table.columns
        if isinstance(c.type, String) and c.name in fields
    )


_EXCHANGE_STRINGS = _string_columns(EXCHANGES, ExchangeRecord)
_OBSERVATION_STRINGS = _string_columns(OBSERVATIONS, ObservationRecord)


def text_hash(text: str) -> str:
    """The hash the meter uses: hex xxh3_128 of the UTF-8 text."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def _clean(row: Row, strings: tuple[tuple[str, int], ...]) -> Row:
    for key, limit in strings:
        value = row[key]
        if value is None:
            continue
        if "\x00" in value:
            value = row[key] = value.replace("\x00", "\ufffd")
        if limit and len(value) > limit:
            row[key] = value[:limit]
    return row


def exchange_row(record: ExchangeRecord) -> Row:
    row = msgspec.structs.asdict(record)
    # Delimited on both sides so `LIKE '%,name,%'` matches a whole name only.
    row["targets"] = f",{','.join(record.targets)}," if record.targets else ""
    return _clean(row, _EXCHANGE_STRINGS)


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
    if text is not None and record.output_hash is None:
        row["output_hash"] = text_hash(text)
    row["output_text"], row["text_truncated"] = kept_text(
        text, record.text_truncated, store_text=store_text, max_chars=max_chars
    )
    if not store_text:
        row["tool_calls"] = redact_tool_calls(record.tool_calls)
    return _clean(row, _OBSERVATION_STRINGS)
