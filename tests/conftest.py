"""Shared pytest set-up. Fixtures live in `tests/fixtures_*.py` modules, one per concern,
listed here so every test module sees them:

- fixtures_db: `db_url` (each storage test runs on SQLite and on the local PostgreSQL)
- fixtures_net: real servers on 127.0.0.1:0, both event loops
- fixtures_real_engine: `real_engines`, the session's real vLLM engines (the tests that use
  them run last)

It also puts each test in its tier (docs/getting-started.md, "Test tiers"): plain `pytest`
deselects the marked ones (pyproject.toml's `addopts`), `.ci/run` runs every tier once. It must
never skip or deselect a test by itself: a tier is chosen with `-m` only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest_plugins = [
    name
    for name in ("tests.fixtures_db", "tests.fixtures_net", "tests.fixtures_real_engine")
    if importlib.util.find_spec(name) is not None
]

HERE = Path(__file__).resolve().parent
# A folder whose every test belongs to a tier, so that a new module there cannot land in the
# default tier by forgetting its mark: the real engines (minutes of vLLM start-up), the browser
# (chromium), and the scenarios that start several `canary` processes.
FOLDER_TIERS = {
    HERE / "real_engine": "real_engine",
    HERE / "browser": "browser",
    HERE / "process": "slow",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it reads these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test of a tiered folder with its tier, and every test that needs the real
    engines (`real_engines`, wherever it lives) `real_engine`."""
    for item in items:
        path = Path(str(item.path)).resolve()
        for folder, tier in FOLDER_TIERS.items():
            if path.is_relative_to(folder):
                item.add_marker(tier)
        if "real_engines" in getattr(item, "fixturenames", ()):
            item.add_marker("real_engine")
