"""Tool-call validity: an answer's calls checked against its request's declared tools.

- `spec` — `ToolSpec.from_request`: a request's `tools`, `tool_choice`, `parallel_tool_calls`
- `schema` — `SchemaCache`: a client's schema compiled safely (bounded, no remote reference,
  linear-time patterns), cached by hash
- `check` — `Checker.check`: one answer's calls judged (`domain.outcomes.ToolCheck`)

Runs in the mirror process, never on the request path; must never log or return
argument values. Pure: no IO.
"""

from __future__ import annotations

from domain.outcomes import TOOL_CHECKS, TOOL_INVALID, ToolCheck

from .check import CallCheck, Checker
from .schema import CAUSES
from .spec import ToolDef, ToolSpec

__all__ = [
    "CAUSES",
    "TOOL_CHECKS",
    "TOOL_INVALID",
    "CallCheck",
    "Checker",
    "ToolCheck",
    "ToolDef",
    "ToolSpec",
]
