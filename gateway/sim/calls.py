"""Tool calls of the simulated engine: whether an answer calls tools, which and how many at once,
arguments drawn to fit each tool's JSON Schema, and, on a profile told to (`break_calls`), the
ways real models get arguments wrong.

Every decision is drawn from the prompt hash with its own salt, so reruns and every profile
agree on the same prompt (the words inside string arguments come from the answer, so a
diverging or rephrasing profile fills them differently). Pure: no IO, no clock, no global
random state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgspec
import xxhash

__all__ = [
    "AUTO_CALL_SHARE",
    "BREAKS",
    "PARALLEL_SHARE",
    "ToolSpec",
    "broken_arguments",
    "call_arguments",
    "call_hash",
    "call_id",
    "choose_calls",
    "is_broken",
]

# Under tool_choice "auto" (or none given), the share of answers that call: an agent's model
# mostly keeps working with tools until it answers the task.
AUTO_CALL_SHARE: Final = 0.75
# Of call answers (tools allow it: two or more declared, parallel_tool_calls not false), the
# share that make two or three calls at once.
PARALLEL_SHARE: Final = 0.3
# How a broken answer is wrong (`SimProfile.break_calls`): as real models get arguments wrong.
BREAKS: Final = ("missing_required", "wrong_type", "enum_outside", "invalid_json")

_MAX_PROPERTIES = 16  # a schema's properties filled at most (bounds the work per call)
_S_CALL, _S_PARALLEL, _S_COUNT, _S_PICK, _S_ID, _S_BREAK, _S_HOW, _S_WHICH = range(201, 209)
_S_VALUE, _S_CALL_HASH = 300, 400  # + property index / + call index
_encode = msgspec.json.Encoder().encode


class ToolSpec(NamedTuple):
    """A declared tool: its name and its JSON Schema `parameters` (None: none declared)."""

    name: str
    parameters: Mapping[str, Any] | None


def _mix(h: int, salt: int) -> int:
    return xxhash.xxh64_intdigest(h.to_bytes(8, "little"), seed=salt)


def _unit(h: int, salt: int) -> float:
    return _mix(h, salt) / 2.0**64


def choose_calls(
    phash: int,
    tools: Sequence[ToolSpec],
    choice: str | None,
    named: str | None,
    *,
    parallel: bool = True,
) -> list[ToolSpec]:
    """The tools the answer calls, in order (empty: a text answer). `named` forces exactly that
    one; "none" never calls; "required" always does; "auto" (or absent) on a prompt-hash coin
    of `AUTO_CALL_SHARE`. A call answer makes 2-3 calls with probability `PARALLEL_SHARE`
    unless `parallel` is false (`parallel_tool_calls: false`) or one tool is declared."""
    if not tools or choice == "none":
        return []
    if named is not None:
        return [t for t in tools if t.name == named][:1]
    if choice != "required" and _unit(phash, _S_CALL) >= AUTO_CALL_SHARE:
        return []
    n = 1
    if parallel and len(tools) > 1 and _unit(phash, _S_PARALLEL) < PARALLEL_SHARE:
        n = 2 + _mix(phash, _S_COUNT) % 2
    return [tools[_mix(phash, _S_PICK + 16 * i) % len(tools)] for i in range(n)]


def call_id(phash: int, index: int) -> str:
    """The call's id: `call_` and 24 hex digits, distinct for each call of an answer."""
    h = _mix(phash, _S_ID + 16 * index)
    return f"call_{h:016x}{_mix(h, _S_ID) & 0xFFFFFFFF:08x}"


def call_hash(phash: int, index: int) -> int:
    """The hash that draws call `index`'s values (independent between the calls of an answer)."""
    return _mix(phash, _S_CALL_HASH + index)


def _schema(tool: ToolSpec) -> tuple[Mapping[str, Any], frozenset[str]]:
    params = tool.parameters or {}
    props = params.get("properties")
    if not isinstance(props, Mapping) or not props:
        props = {"query": {"type": "string"}}
    required = params.get("required")
    names = frozenset(str(r) for r in required) if isinstance(required, list) else frozenset()
    return props, names


def _value(key: str, spec: Mapping[str, Any], h: int, words: Sequence[str], at: int) -> Any:
    kind, enum = spec.get("type", "string"), spec.get("enum")
    if isinstance(enum, list) and enum:
        return enum[h % len(enum)]
    if kind == "integer":
        lo, hi = spec.get("minimum", 0), spec.get("maximum", 99)
        lo, hi = (int(lo), int(hi)) if isinstance(lo, int) and isinstance(hi, int) else (0, 99)
        return lo + h % max(hi - lo + 1, 1)
    if kind == "number":
        return round((h % 10000) / 100, 2)
    if kind == "boolean":
        return bool(h & 1)
    if kind == "array":
        return [words[(at + j) % len(words)] for j in range(2)]
    if kind == "object":
        return {}
    picked = [words[(at * 3 + j) % len(words)] for j in range(3)]
    if "path" in key or "file" in key:
        return "/".join(picked) + ".py"
    return " ".join(picked)


def call_arguments(tool: ToolSpec, words: Sequence[str], h: int) -> dict[str, Any]:
    """Arguments that fit `tool`'s schema: every required property, each optional one about half
    the time, each value of its declared type (within an enum, minimum and maximum); strings
    are drawn from `words` (the answer's)."""
    props, required = _schema(tool)
    words = words or ["value"]
    offset = h % len(words)
    args: dict[str, Any] = {}
    for i, (key, spec) in enumerate(list(props.items())[:_MAX_PROPERTIES]):
        hv = _mix(h, _S_VALUE + i)
        if key not in required and hv & 2:
            continue
        args[str(key)] = _value(
            str(key), spec if isinstance(spec, Mapping) else {}, hv, words, i + offset
        )
    return args


def is_broken(phash: int, share: float) -> bool:
    """Whether this answer's calls are broken, on a prompt-hash coin of `share`."""
    return share > 0.0 and _unit(phash, _S_BREAK) < share


def broken_arguments(tool: ToolSpec, args: dict[str, Any], phash: int) -> str:
    """`args` made wrong in one of the ways of `BREAKS` that the tool's schema allows (drawn
    from the prompt hash), as the JSON text a model would send."""
    props, required = _schema(tool)
    missing = sorted(k for k in required if k in args)
    enums = sorted(k for k in args if isinstance(props.get(k), Mapping) and props[k].get("enum"))
    possible = [
        b
        for b, ok in zip(BREAKS, (bool(missing), bool(args), bool(enums), True), strict=True)
        if ok
    ]
    how = possible[_mix(phash, _S_HOW) % len(possible)]
    pick = _mix(phash, _S_WHICH)
    out = dict(args)
    if how == "missing_required":
        del out[missing[pick % len(missing)]]
    elif how == "wrong_type":
        key = sorted(out)[pick % len(out)]
        out[key] = _wrong_type(out[key])
    elif how == "enum_outside":
        key = enums[pick % len(enums)]
        allowed = {str(v) for v in props[key]["enum"]}
        value = str(out[key]).capitalize()
        while value in allowed:
            value += "s"
        out[key] = value
    else:
        text = _encode(out).decode()
        # A model that stops early leaves the object open; one that writes Python quotes it
        # with single quotes. Neither parses as JSON.
        return text[:-1] if pick & 1 else text.replace('"', "'")
    return _encode(out).decode()


def _wrong_type(value: Any) -> Any:
    """A value of another JSON type than `value`'s, as a model confusing the types writes it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return str(value)  # "5" for 5
    if isinstance(value, str):
        return 7
    return str(value)
