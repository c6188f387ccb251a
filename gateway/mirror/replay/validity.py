"""Every arm's tool calls judged against what its request declared, before the observation is
stored: production's answer (the reference) in `Mirror.on_response`, each candidate's when its
lane records it. One `Checker` per mirror process (its compiled schemas are cached by hash and
shared by every arm), so the same request's schema compiles once for all arms.

`Declared` is taken from the request once, when its copy is accepted, and travels with the copy
(`Copy.tools`) and production's token. The check runs in the mirror process, never on the
request path, and writes only the verdict and a value-free description: never an argument.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

import msgspec
import xxhash

from domain.exposition import Exposed, Family, integer
from domain.outcomes import TOOL_CHECKS
from domain.records import ObservationRecord
from gateway.mirror.sampling.sampler import RequestView
from gateway.mirror.toolcalls import Checker, ToolSpec

__all__ = ["CallJudge", "Declared"]

_NULL: Final = b"null"
RESPONSES_ROUTE: Final = "/v1/responses"
# Declarations kept parsed: an agent fleet uses a few tool sets, each sent on every turn.
_SPECS_MAX: Final = 256


TOOL_CHECKED: Final = Family(
    "canary_mirror_tool_checks_total",
    "counter",
    "Answers (every arm) whose tool calls were checked, by verdict (valid, a reason it is "
    "invalid, or uncheckable).",
    ("verdict",),
    fmt=integer,
)
TOOL_SCHEMAS: Final = Family(
    "canary_mirror_tool_schemas_total",
    "counter",
    "The tool-schema cache: schemas compiled, cache hits, evicted, and schemas refused by cause.",
    ("outcome",),
    fmt=integer,
)


class Declared:
    """A request's tool contract and the API that shapes its calls."""

    __slots__ = ("api", "spec")

    def __init__(self, spec: ToolSpec | None, api: Literal["chat", "responses"]) -> None:
        self.spec = spec
        self.api: Literal["chat", "responses"] = api


# The copy of a request that declared nothing: an answer with a call is still judged
# (undeclared), one without is not applicable.
NOTHING: Final = Declared(None, "chat")
NOTHING_RESPONSES: Final = Declared(None, "responses")


class CallJudge:
    """The mirror process's tool-call checker and its counters."""

    __slots__ = ("_specs", "checker", "enabled", "judged", "verdicts")

    def __init__(self, checker: Checker | None = None, *, enabled: bool = True) -> None:
        self.checker = checker or Checker()
        self.enabled = enabled  # `mirror.tool_check`
        self.judged = 0  # answers given a verdict (any, uncheckable included)
        self.verdicts = dict.fromkeys(map(str, TOOL_CHECKS), 0)  # exported from 0
        self._specs: OrderedDict[bytes, Declared] = OrderedDict()

    def declared(self, view: RequestView, route: str) -> Declared:
        """What `view`'s request declared (parsed once per accepted copy)."""
        responses = route == RESPONSES_ROUTE
        if not self.enabled:  # `mirror.tool_check = false`: nothing is read either
            return NOTHING_RESPONSES if responses else NOTHING
        choice = view.tool_choice
        raw_choice = None if bytes(choice) == _NULL else bytes(choice)
        if not view.tools and raw_choice is None:
            return NOTHING_RESPONSES if responses else NOTHING
        tools: Sequence[bytes] = [bytes(t) for t in view.tools or ()]
        # An agent sends the same tools every turn: parse a declaration once, keep the last
        # `_SPECS_MAX` (a bound: clients choose what they declare).
        parallel = view.parallel_tool_calls
        key = xxhash.xxh3_128_digest(
            b"\0".join((*tools, raw_choice or b"", str(parallel).encode(), route.encode()))
        )
        found = self._specs.get(key)
        if found is not None:
            self._specs.move_to_end(key)
            return found
        spec = ToolSpec.from_request(tools, raw_choice, parallel)
        declared = self._specs[key] = Declared(spec, "responses" if responses else "chat")
        if len(self._specs) > _SPECS_MAX:
            self._specs.popitem(last=False)
        return declared

    def judge(
        self,
        record: ObservationRecord,
        declared: Declared,
        calls: Sequence[tuple[str, str, str | None]] | None,
    ) -> None:
        """Set `record.tool_check` / `tool_error` from its answer's `calls`; a failed answer is
        never judged (the failure metrics count it)."""
        if record.error_kind is not None or not self.enabled:
            return
        try:
            out = self.checker.check(declared.spec, calls, api=declared.api)
        except (ValueError, TypeError, msgspec.DecodeError):  # never lose the observation
            return
        if out is None:
            return
        self.judged += 1
        verdict = record.tool_check = str(out.check)
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        record.tool_error = out.error

    @property
    def counters(self) -> Mapping[str, int]:
        return {"judged": self.judged, **self.checker.counters}

    def prometheus_lines(self) -> Iterable[Exposed]:
        yield TOOL_CHECKED
        for verdict, n in self.verdicts.items():
            yield TOOL_CHECKED.sample(n, verdict)
        yield TOOL_SCHEMAS
        for outcome, n in self.checker.counters.items():
            yield TOOL_SCHEMAS.sample(n, outcome)
