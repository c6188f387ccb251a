"""What a request declared about tools: its `tools`, `tool_choice` and `parallel_tool_calls`.

`ToolSpec.from_request` reads the raw JSON of each declaration once per request, in both shapes
(Chat Completions nests the function under `"function"`; the Responses API puts its fields at the
top) and keeps each function's `parameters` as canonical JSON (keys sorted) with its xxh3_128, the
key the schema cache compiles under. It never compiles a schema, never raises on a client's bad
declaration (a malformed one makes the spec `malformed`: its answers are not judged) and never
keeps a description or schema it does not need beyond the canonical bytes. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal

import msgspec
import xxhash

__all__ = ["Choice", "ToolDef", "ToolSpec"]

Choice = Literal["auto", "none", "required", "named"]
_MODES: Final[frozenset[str]] = frozenset({"auto", "none", "required"})


class ToolDef(msgspec.Struct, frozen=True):
    """One declared tool. `parameters` is the canonical JSON of its schema (None: the function
    declared none and accepts any object; always None for a non-function tool), `digest` its
    xxh3_128, `depth` its nesting depth (-1: too deep to decode at all)."""

    name: str
    function: bool = True  # False: a non-function tool (e.g. a Responses built-in): name only
    description: str | None = None
    parameters: bytes | None = None
    digest: bytes | None = None
    depth: int = 0
    strict: bool | None = None  # kept for the record; the schema is the schema either way


class _Function(msgspec.Struct):
    name: str | None = None
    description: str | None = None
    parameters: msgspec.Raw = msgspec.Raw()
    strict: bool | None = None


class _Entry(msgspec.Struct):
    """Either shape of one entry of `tools` (unknown fields are ignored)."""

    type: str = "function"
    function: _Function | None = None  # Chat Completions
    name: str | None = None  # Responses API (and named built-ins)
    description: str | None = None
    parameters: msgspec.Raw = msgspec.Raw()
    strict: bool | None = None


class _Named(msgspec.Struct):
    name: str | None = None


class _ChoiceObject(msgspec.Struct):
    type: str | None = None
    function: _Named | None = None  # Chat Completions
    name: str | None = None  # Responses API


_ENTRY = msgspec.json.Decoder(_Entry)
_CHOICE = msgspec.json.Decoder(str | _ChoiceObject)
_ANY = msgspec.json.Decoder()
_SORTED = msgspec.json.Encoder(order="sorted")


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, `{}` is 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in children)
    return deepest


def _tool(raw: bytes) -> ToolDef | None:
    """One declared tool; None for a nameless built-in (it declares no name to call)."""
    entry = _ENTRY.decode(raw)
    fn = entry.function
    if fn is not None:
        name, desc, params, strict = fn.name, fn.description, fn.parameters, fn.strict
    else:
        name, desc, params, strict = entry.name, entry.description, entry.parameters, entry.strict
    if entry.type != "function":
        return ToolDef(name=name, function=False, description=desc) if name else None
    if not name:
        raise ValueError("a function without a name")
    if not params or bytes(params).strip() == b"null":
        return ToolDef(name=name, description=desc, strict=strict)
    try:
        schema = _ANY.decode(params)
    except RecursionError:
        # Deeper than the decoder goes: no canonical form, so the raw bytes are the key.
        return ToolDef(name, True, desc, bytes(params), xxhash.xxh3_128_digest(params), -1, strict)
    canonical = _SORTED.encode(schema)
    return ToolDef(
        name, True, desc, canonical, xxhash.xxh3_128_digest(canonical), _depth(schema), strict
    )


class ToolSpec:
    """What one request declared; built once per request, immutable."""

    __slots__ = ("cause", "choice", "malformed", "named", "parallel", "tools")

    tools: Mapping[str, ToolDef]
    choice: Choice
    named: str | None  # the function a named tool_choice requires
    parallel: bool  # parallel_tool_calls (OpenAI's default: true)
    malformed: str | None  # why the declaration cannot be read (value-free); None when it can
    cause: str  # the uncheckable cause a malformed declaration is counted under

    def __init__(
        self,
        tools: Mapping[str, ToolDef],
        choice: Choice = "auto",
        named: str | None = None,
        parallel: bool = True,
        malformed: str | None = None,
        cause: str = "invalid_schema",
    ) -> None:
        object.__setattr__(self, "tools", MappingProxyType(dict(tools)))
        object.__setattr__(self, "choice", choice)
        object.__setattr__(self, "named", named)
        object.__setattr__(self, "parallel", parallel)
        object.__setattr__(self, "malformed", malformed)
        object.__setattr__(self, "cause", cause)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ToolSpec is immutable (tried to set {name})")

    def __repr__(self) -> str:
        return (
            f"ToolSpec(tools={sorted(self.tools)}, choice={self.choice!r}, named={self.named!r},"
            f" parallel={self.parallel}, malformed={self.malformed!r})"
        )

    @classmethod
    def from_request(
        cls,
        tools: Sequence[bytes] | None,
        tool_choice: bytes | None,
        parallel_tool_calls: bool | None,
    ) -> ToolSpec | None:
        """The spec of a request, or None when it declared no tools and no tool_choice."""
        if not tools and tool_choice is None:
            return None
        parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
        declared: dict[str, ToolDef] = {}
        for i, raw in enumerate(tools or ()):
            try:
                tool = _tool(raw)
            except RecursionError:
                # Nested past the decoder's depth: no name can be read, so nothing is judged.
                return cls(
                    {}, parallel=parallel, malformed=f"tools[{i}] too_deep", cause="too_deep"
                )
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
                return cls({}, parallel=parallel, malformed=f"tools[{i}] is not a tool")
            if tool is None:
                continue
            if tool.name in declared:
                return cls({}, parallel=parallel, malformed=f"tools[{i}] repeats a name")
            declared[tool.name] = tool
        choice: Choice = "auto"
        named = None
        if tool_choice is not None:
            try:
                parsed = _CHOICE.decode(tool_choice)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                return cls(declared, parallel=parallel, malformed="tool_choice is not understood")
            if isinstance(parsed, str):
                if parsed not in _MODES:
                    return cls(declared, parallel=parallel, malformed="tool_choice mode unknown")
                choice = parsed  # type: ignore[assignment]  # checked against _MODES above
            else:
                named = parsed.function.name if parsed.function is not None else parsed.name
                if parsed.type != "function" or not named:
                    # allowed_tools, a built-in or a custom tool: not a function this checks.
                    return cls(
                        declared, parallel=parallel, malformed="tool_choice is not a function"
                    )
                choice = "named"
        return cls(declared, choice, named, parallel)
