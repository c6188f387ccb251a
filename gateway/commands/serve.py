"""`canary serve` (placeholder until its module lands)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    sub.add_parser("serve", help="(not yet available)").set_defaults(func=lambda _a: 1)
