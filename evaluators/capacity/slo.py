"""Service-level objectives of a capacity run: `ttft=0.5s`, `tpot=50ms`, `e2e=10s`.

A request meets the SLO when it succeeded and each set bound holds (vLLM's `--goodput`: a TPOT
of a one-token answer counts as 0). Parsing raises UsageError with a message naming the input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from domain.errors import UsageError

_NUMBER = r"([0-9]*\.?[0-9]+(?:e-?\d+)?)"
_ITEM = re.compile(r"^\s*(ttft|tpot|e2e|e2el)\s*(?:=|:|<=)\s*" + _NUMBER + r"\s*(ms|s)?\s*$")


class Slo(msgspec.Struct, frozen=True, kw_only=True):
    """Upper bounds in seconds; None: not part of the objective."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def label(self) -> str:
        parts = [
            f"{name}<={value:g}s"
            for name, value in (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s))
            if value is not None
        ]
        return ",".join(parts)

    def meets(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None) -> bool:
        """Every set bound holds; a missing measurement of a bounded quantity fails it."""
        if self.ttft_s is not None and (ttft_s is None or ttft_s > self.ttft_s):
            return False
        if self.tpot_s is not None and (tpot_s or 0.0) > self.tpot_s:
            return False
        return not (self.e2e_s is not None and (e2e_s is None or e2e_s > self.e2e_s))


def parse_slo(items: Sequence[str]) -> Slo:
    """`["ttft=0.5s", "tpot=50ms"]` (also comma-separated in one item) -> Slo."""
    bounds: dict[str, float] = {}
    for raw in (part for item in items for part in item.split(",")):
        if not raw.strip():
            continue
        m = _ITEM.match(raw.lower())
        if m is None:
            raise UsageError(
                f"--slo {raw.strip()!r}: expected KEY=VALUE with KEY one of ttft, tpot, e2e and "
                "VALUE in seconds or with a unit, e.g. ttft=0.5s, tpot=50ms, e2e=10"
            )
        key, value, unit = m.group(1), float(m.group(2)), m.group(3) or "s"
        key = "e2e" if key == "e2el" else key
        seconds = value / 1000.0 if unit == "ms" else value
        if not seconds > 0:
            raise UsageError(f"--slo {raw.strip()!r}: the bound must be positive")
        if key in bounds:
            raise UsageError(f"--slo: {key} is given twice")
        bounds[key] = seconds
    if not bounds:
        raise UsageError("--slo: give at least one objective, e.g. --slo ttft=0.5s")
    return Slo(ttft_s=bounds.get("ttft"), tpot_s=bounds.get("tpot"), e2e_s=bounds.get("e2e"))
