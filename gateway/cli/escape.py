"""What the CLI prints is safe for a terminal: no control sequence from a client reaches it.

Reports and listings carry strings clients chose (a `model` value, an error message). An ESC
sequence can clear the screen and draw a fake verdict line, a CR can overwrite one. Every C0
and C1 control character except newline and tab, and DEL, is shown as a visible `\\xNN` escape.
Pure: no IO.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def terminal_safe(text: str) -> str:
    """`text` with every control character but `\\n` and `\\t` escaped as `\\xNN`."""
    return _CONTROL.sub(_visible, text)


def one_line(text: str) -> str:
    """A client string for one line of output: controls escaped, and newlines as `\\n`."""
    return terminal_safe(text).replace("\n", "\\n").replace("\t", "\\t")
