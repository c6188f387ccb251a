"""Safe compilation of a client's `parameters` schema, cached by its xxh3_128.

Schemas come from clients, so compiling one must be bounded and must reach nothing outside it:
a schema over `max_schema_bytes` or deeper than `max_schema_depth` is refused before it is
compiled; a `$ref` that does not resolve inside the schema reaches a retriever that refuses it
(nothing is fetched, no file is read); `pattern` and `patternProperties` run on jsonschema-rs's
linear-time regex engine (Rust `regex`, size-limited), and a pattern it cannot compile
(backreferences, lookaround) or longer than `max_pattern_chars` refuses the schema. `format` is
an annotation, never asserted. A refused schema is cached with its cause, so it is judged once.
This module must never fall back to a backtracking regex engine or to Python-source generation.
Pure: no IO.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import jsonschema_rs
import msgspec

__all__ = ["CAUSES", "Compiled", "SchemaCache"]

# Why a schema (or an answer's arguments) is uncheckable; each has a counter.
CAUSES: Final = ("too_big", "too_deep", "remote_ref", "pattern", "invalid_schema")

# Compiled regex size and lazy-DFA cache per pattern: a pattern like "a{1000}{1000}" is refused
# at compile time instead of taking memory (the engine's defaults are 10 MiB and 2 MiB).
_REGEX: Final = jsonschema_rs.RegexOptions(size_limit=1 << 20, dfa_size_limit=1 << 20)
# Keywords whose values are data, not schemas: a "pattern" key under them is not a pattern.
_DATA_KEYWORDS: Final = frozenset({"enum", "const", "default", "examples"})
_ANY = msgspec.json.Decoder()


class Compiled:
    """A compiled schema (`validator`) or why it is uncheckable (`cause`), plus the property
    names the schema declares (the only object keys an error text may show)."""

    __slots__ = ("cause", "names", "validator")

    def __init__(
        self,
        validator: jsonschema_rs.Validator | None,
        cause: str | None,
        names: frozenset[str] = frozenset(),
    ) -> None:
        self.validator = validator
        self.cause = cause
        self.names = names


def _scan(schema: Any, max_pattern_chars: int) -> tuple[str | None, frozenset[str]]:
    """Patterns over the length bound (a cause) and the declared property names, in one walk."""
    names: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _DATA_KEYWORDS:
                continue
            if key == "pattern" and isinstance(value, str) and len(value) > max_pattern_chars:
                return "pattern", frozenset()
            if key in ("properties", "patternProperties") and isinstance(value, dict):
                if key == "properties":
                    names.update(value)
                elif any(len(p) > max_pattern_chars for p in value):
                    return "pattern", frozenset()
            stack.append(value)
    return None, frozenset(names)


def _compile(canonical: bytes, max_pattern_chars: int) -> Compiled:
    schema = _ANY.decode(canonical)
    cause, names = _scan(schema, max_pattern_chars)
    if cause is not None:
        return Compiled(None, cause)
    asked: list[str] = []

    def refuse(uri: str) -> Any:
        # Every reference the schema does not hold itself (and any unknown `$schema`) comes
        # here: noted, then refused, never fetched.
        asked.append(uri)
        raise LookupError("remote references are refused")  # noted in `asked` above

    try:
        validator = jsonschema_rs.validator_for(
            schema,
            validate_formats=False,
            retriever=refuse,
            pattern_options=_REGEX,
        )
    except jsonschema_rs.ValidationError as exc:
        if asked:
            return Compiled(None, "remote_ref")
        kind = exc.kind
        if isinstance(kind, jsonschema_rs.ValidationErrorKind.Format) and kind.format == "regex":
            return Compiled(None, "pattern")
        return Compiled(None, "invalid_schema")
    except (LookupError, ValueError, TypeError):
        return Compiled(None, "remote_ref" if asked else "invalid_schema")
    return Compiled(validator, None, names)


class SchemaCache:
    """Compiled schemas by digest, least recently used first out, at most `size` of them."""

    __slots__ = (
        "_entries",
        "cache_hits",
        "compiled",
        "evicted",
        "max_pattern_chars",
        "max_schema_bytes",
        "max_schema_depth",
        "refused",
        "size",
    )

    def __init__(
        self, *, size: int, max_schema_bytes: int, max_schema_depth: int, max_pattern_chars: int
    ) -> None:
        if size < 1:
            raise ValueError(f"cache_size must be at least 1, got {size}")
        self.size = size
        self.max_schema_bytes = max_schema_bytes
        self.max_schema_depth = max_schema_depth
        self.max_pattern_chars = max_pattern_chars
        self._entries: OrderedDict[bytes, Compiled] = OrderedDict()
        self.compiled = 0  # compile attempts (a refused schema counts: it was judged once)
        self.cache_hits = 0
        self.evicted = 0  # entries pushed out by the `size` bound
        self.refused: dict[str, int] = dict.fromkeys(CAUSES, 0)  # compile attempts refused

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, parameters: bytes, digest: bytes, depth: int) -> Compiled:
        """The compiled schema for canonical `parameters` (digest and depth from `ToolDef`)."""
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
            self.cache_hits += 1
            return entry
        self.compiled += 1
        if len(parameters) > self.max_schema_bytes:
            entry = Compiled(None, "too_big")
        elif depth < 0 or depth > self.max_schema_depth:
            entry = Compiled(None, "too_deep")
        else:
            entry = _compile(parameters, self.max_pattern_chars)
        if entry.cause is not None:
            self.refused[entry.cause] += 1
        self._entries[digest] = entry
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
            self.evicted += 1
        return entry

    def counters(self) -> Mapping[str, int]:
        return {
            "compiled": self.compiled,
            "cache_hits": self.cache_hits,
            "evicted": self.evicted,
            "cached": len(self._entries),
        }
