"""Shared pytest set-up. Fixtures live in `tests/fixtures_*.py` modules, one per concern,
listed here so every test module sees them:

- fixtures_db: `db_url` (each storage test runs on SQLite and on the local PostgreSQL)
- fixtures_net: real servers on 127.0.0.1:0, both event loops
- fixtures_real_engine: `real_engines`, the session's real vLLM engines (the tests that use
  them run last)
"""

from __future__ import annotations

import importlib.util

pytest_plugins = [
    name
    for name in ("tests.fixtures_db", "tests.fixtures_net", "tests.fixtures_real_engine")
    if importlib.util.find_spec(name) is not None
]
