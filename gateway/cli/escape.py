"""What the CLI prints is safe for a terminal: no control sequence from a client reaches it.

Reports and listings carry strings clients chose (a `model` value, an error message). An ESC
sequence can clear the screen and draw a fake verdict line, a CR can overwrite one. Every C0
and C1 control character except newline and tab, and DEL, is shown as a visible `\\xNN` escape;
`safe_for` does it (and escapes newlines, and HTML in markdown) on every string of a report
before it is rendered, so no client string can start a line of its own. Pure: no IO.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

R = TypeVar("R")

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def terminal_safe(text: str) -> str:
    """`text` with every control character but `\\n` and `\\t` escaped as `\\xNN`."""
    return _CONTROL.sub(_visible, text)


def one_line(text: str) -> str:
    """A client string for one line of output: controls escaped, and newlines as `\\n`."""
    return terminal_safe(text).replace("\n", "\\n").replace("\t", "\\t")


def _markdown_cell(text: str) -> str:
    # Raw HTML is live in most markdown viewers, and `|` ends a table cell.
    return (
        one_line(text)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
    )


def _clean(value: Any, fix: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fix(value)
    if isinstance(value, dict):
        return {fix(k) if isinstance(k, str) else k: _clean(v, fix) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, fix) for v in value]
    return value


def safe_for(report: R, fmt: str) -> R:
    """The report with every string fit for `fmt`: for text, controls and line breaks escaped;
    for markdown, HTML and `|` escaped too. JSON (the encoder escapes) and HTML (the renderer
    escapes) are returned unchanged."""
    if fmt not in ("text", "markdown"):
        return report
    fix = one_line if fmt == "text" else _markdown_cell
    builtins = msgspec.to_builtins(report)
    return msgspec.convert(_clean(builtins, fix), type(report))
