"""The check of one answer's tool calls against what its request declared.

`Checker.check` judges the calls of one answer (production's or a candidate's) in a fixed order
and reports the first problem: FORBIDDEN_CALL, MISSING_CALL, PARALLEL, CALL_ID, then per call
UNDECLARED, NOT_OBJECT, SCHEMA. A call it cannot judge safely (its schema refused by
`schema.SchemaCache`, its arguments over the bounds) makes the answer UNCHECKABLE unless another
call is definitely invalid. An error text never holds an argument value, an undeclared name or an
object key the schema does not declare: arguments may carry secrets. Runs in the mirror process,
never on the request path. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from domain.outcomes import ToolCheck

from .schema import CAUSES, SchemaCache
from .spec import ToolSpec

__all__ = ["CallCheck", "Checker"]

_ERROR_CHARS: Final = 160
_ANY = msgspec.json.Decoder()


class CallCheck(msgspec.Struct, frozen=True):
    """The verdict on one answer's calls."""

    check: ToolCheck
    pointer: str | None = None  # SCHEMA: RFC 6901 pointer into the arguments of the first error
    error: str | None = None  # short and value-free, at most 160 characters
    calls: int = 0  # number of calls in the answer


def _escape(segment: str | int) -> str:
    return str(segment).replace("~", "~0").replace("/", "~1")


def _keyword(kind: object) -> str:
    # The error kind's class is one of a fixed vocabulary (Enum, Required, AdditionalProperties):
    # it names the keyword and never carries the instance.
    name = type(kind).__name__
    return name[:1].lower() + name[1:]


def _error(text: str) -> str:
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


class Checker:
    """Judges answers' tool calls; holds the schema cache and the counters (one per process)."""

    __slots__ = ("max_arguments_bytes", "schemas", "uncheckable")

    def __init__(
        self,
        *,
        cache_size: int = 256,
        max_schema_bytes: int = 65536,
        max_schema_depth: int = 32,
        max_pattern_chars: int = 1000,
        max_arguments_bytes: int = 262144,
    ) -> None:
        # cache_size: distinct tool schemas compiled and kept (an agent fleet declares few; each
        # entry is a compiled validator of at most max_schema_bytes of schema).
        self.schemas = SchemaCache(
            size=cache_size,
            max_schema_bytes=max_schema_bytes,
            max_schema_depth=max_schema_depth,
            max_pattern_chars=max_pattern_chars,
        )
        # Arguments longer than this are not decoded: a model's arguments are small, and a bound
        # on them is a bound on the work one answer costs.
        self.max_arguments_bytes = max_arguments_bytes
        self.uncheckable: dict[str, int] = dict.fromkeys(CAUSES, 0)  # answers not judged, by why

    @property
    def counters(self) -> Mapping[str, int]:
        """compiled, cache_hits, evicted, cached, and uncheckable_<cause> (answers not judged)."""
        out = dict(self.schemas.counters())
        out.update({f"uncheckable_{cause}": n for cause, n in self.uncheckable.items()})
        return out

    def check(
        self,
        spec: ToolSpec | None,
        calls: Sequence[tuple[str, str, str | None]] | None,
        *,
        api: Literal["chat", "responses"] = "chat",
    ) -> CallCheck | None:
        """The verdict on an answer's calls, (name, arguments JSON text, call id) in order, or
        None when there is nothing to judge (no declaration and no call)."""
        n = len(calls) if calls else 0
        if spec is None:
            if not n:
                return None
            return CallCheck(ToolCheck.UNDECLARED, error="call 0: no tools declared", calls=n)
        if spec.malformed is not None:
            self.uncheckable[spec.cause] += 1
            return CallCheck(ToolCheck.UNCHECKABLE, error=_error(spec.malformed), calls=n)
        if spec.choice == "none" and n:
            return CallCheck(ToolCheck.FORBIDDEN_CALL, error="tool_choice none: a call", calls=n)
        if spec.choice == "required" and not n:
            return CallCheck(ToolCheck.MISSING_CALL, error="tool_choice required: no call", calls=n)
        if spec.choice == "named" and not any(call[0] == spec.named for call in calls or ()):
            text = f"tool_choice names {spec.named}: no call to it"
            return CallCheck(ToolCheck.MISSING_CALL, error=_error(text), calls=n)
        if not calls:
            return CallCheck(ToolCheck.VALID, calls=0)
        if n > 1 and not spec.parallel:
            text = f"{n} calls with parallel_tool_calls false"
            return CallCheck(ToolCheck.PARALLEL, error=text, calls=n)
        id_field = "id" if api == "chat" else "call_id"
        seen: set[str] = set()
        for i, (_, _, call_id) in enumerate(calls):
            if not call_id:
                return CallCheck(ToolCheck.CALL_ID, error=f"call {i}: no {id_field}", calls=n)
            if call_id in seen:
                text = f"call {i}: duplicate {id_field}"
                return CallCheck(ToolCheck.CALL_ID, error=text, calls=n)
            seen.add(call_id)
        # A call that cannot be judged does not hide a later call that is definitely invalid.
        unjudged: tuple[int, str, str] | None = None
        for i, (name, arguments, _) in enumerate(calls):
            verdict = self._call(spec, i, name, arguments, n)
            if isinstance(verdict, str):
                unjudged = unjudged or (i, name, verdict)
            elif verdict is not None:
                return verdict
        if unjudged is not None:
            i, name, cause = unjudged
            self.uncheckable[cause] += 1
            text = f"call {i} {name}: {cause}"
            return CallCheck(ToolCheck.UNCHECKABLE, error=_error(text), calls=n)
        return CallCheck(ToolCheck.VALID, calls=n)

    def _call(
        self, spec: ToolSpec, i: int, name: str, arguments: str, n: int
    ) -> CallCheck | str | None:
        """The problem with call `i`, the cause (one of `CAUSES`) when it cannot be judged, or
        None when it is valid."""
        tool = spec.tools.get(name)
        if tool is None:
            # The name is the engine's text, not the declaration's: it is left out.
            return CallCheck(ToolCheck.UNDECLARED, error=f"call {i}: undeclared function", calls=n)
        if not tool.function:
            return None  # a built-in or custom tool: its input is not a JSON object to check
        limit = self.max_arguments_bytes
        if len(arguments) > limit or (
            len(arguments) * 4 > limit and len(arguments.encode()) > limit
        ):
            return "too_big"
        try:
            value: Any = _ANY.decode(arguments)
        except msgspec.DecodeError:
            text = f"call {i} {name}: arguments are not JSON"
            return CallCheck(ToolCheck.NOT_OBJECT, error=_error(text), calls=n)
        except RecursionError:
            return "too_deep"
        if not isinstance(value, dict):
            text = f"call {i} {name}: arguments are JSON but not an object"
            return CallCheck(ToolCheck.NOT_OBJECT, error=_error(text), calls=n)
        if tool.parameters is None or tool.digest is None:
            return None
        compiled = self.schemas.get(tool.parameters, tool.digest, tool.depth)
        if compiled.validator is None:
            assert compiled.cause is not None  # a refused schema always names its cause
            return compiled.cause
        if compiled.validator.is_valid(value):
            return None
        first = next(iter(compiled.validator.iter_errors(value)))
        path = list(first.instance_path)
        pointer = "".join("/" + _escape(seg) for seg in path)
        # Only indexes and the schema's own property names are shown; any other key is the
        # engine's text (it may hold a secret), shown as "*".
        shown = "".join(
            "/" + (_escape(seg) if isinstance(seg, int) or seg in compiled.names else "*")
            for seg in path
        )
        text = f"call {i} {name}: {shown or '(root)'}: {_keyword(first.kind)}"
        return CallCheck(ToolCheck.SCHEMA, pointer=pointer, error=_error(text), calls=n)
