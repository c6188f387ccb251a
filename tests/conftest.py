"""Shared pytest set-up. Fixtures live in `tests/fixtures_*.py` modules, one per concern,
listed here so every test module sees them:

- fixtures_db: `db_url` (each storage test runs on SQLite and on the local PostgreSQL)
"""

from __future__ import annotations

import importlib.util

pytest_plugins = [
    name
    for name in ("tests.fixtures_db", "tests.fixtures_net")
    if importlib.util.find_spec(name) is not None
]
