"""A small terminal progress bar for long CLI work (demo traffic, loading pairs).

On a terminal it redraws one line in place, at most ten times a second; otherwise (CI logs,
pipes) it prints a plain line at every 10 % so logs stay short. Never used on the proxy path.
"""

from __future__ import annotations

import shutil
import sys
import time
from types import TracebackType
from typing import TextIO


class Progress:
    __slots__ = (
        "_done",
        "_last_decile",
        "_last_draw",
        "_started",
        "_tty",
        "label",
        "out",
        "status",
        "total",
    )

    def __init__(self, total: int, label: str, *, out: TextIO | None = None) -> None:
        self.total = max(total, 0)
        self.label = label
        self.out = out if out is not None else sys.stderr
        self._tty = self.out.isatty()
        self._done = 0
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1
        self.status = ""  # a short note after the counts (the demo: each verdict as it forms)

    @property
    def done(self) -> int:
        return self._done

    def advance(self, n: int = 1) -> None:
        self._done += n
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1 or self._done >= self.total:
                self._last_draw = now
                self._draw(now)
        elif self.total:
            decile = min(10, self._done * 10 // self.total)
            if decile > self._last_decile:
                self._last_decile = decile
                note = f" {self.status}" if self.status else ""
                self.out.write(f"{self.label}: {self._done}/{self.total} ({decile * 10}%){note}\n")
                self.out.flush()

    def note(self, status: str) -> None:
        """Show `status` after the counts: redrawn in place on a terminal, a line otherwise."""
        if status == self.status:
            return
        self.status = status
        if self._tty:
            self._draw(time.monotonic())
        else:
            self.out.write(f"{self.label}: {self._done}/{self.total} {status}\n")
            self.out.flush()

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        rate = self._done / elapsed
        remaining = (self.total - self._done) / rate if rate > 0 else 0.0
        counts = f" {self._done}/{self.total} {rate:6.1f}/s eta {remaining:4.0f}s"
        if self.status:
            counts += f" {self.status}"
        width = shutil.get_terminal_size((80, 24)).columns
        bar_width = max(10, width - len(self.label) - len(counts) - 4)
        filled = bar_width * self._done // self.total if self.total else bar_width
        bar = "#" * filled + "." * (bar_width - filled)
        self.out.write(f"\r{self.label} [{bar}]{counts}")
        self.out.flush()

    def close(self) -> None:
        if self._tty:
            self._draw(time.monotonic())
            self.out.write("\n")
            self.out.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
