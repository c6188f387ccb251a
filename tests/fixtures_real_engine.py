"""The real vLLM engines of the test session: one home for their start-up, shared by every suite.

- `real_engines`: the four engines of `tests.real_engine.engines.SUITE` (`live` without prefix
  caching, `bi-kv` with it, `control` configured like live, `quantized` in bfloat16), started
  once per test session, all at once (they compile in parallel), and stopped at its end. The
  real-engine suite mirrors traffic onto all four; the capacity tests replay onto `bi-kv` and
  `live`, so no test starts an engine of its own.

Tests that use them run last (`pytest_collection_modifyitems` below), so the engines are up
only while something talks to them: two shared cores are not also carrying idle engines while
the rest of the suite runs. Without the install (`bench/real_engine_setup.sh`) those tests skip,
saying why, unless `CANARY_REQUIRE_REAL_ENGINE=1` (what `.ci/run` sets): then they fail.
`CANARY_REAL_ENGINE_URLS="live=URL,bi-kv=URL,control=URL,quantized=URL"` uses engines already
running instead (configured as in `SUITE`), which is handy while editing the tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_engine import engines as eng

FIXTURE = "real_engines"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests that need real engines to the end, keeping their order."""
    items.sort(key=lambda item: FIXTURE in getattr(item, "fixturenames", ()))


def _unavailable(reason: str) -> None:
    if os.environ.get("CANARY_REQUIRE_REAL_ENGINE") == "1":
        pytest.fail(f"CANARY_REQUIRE_REAL_ENGINE=1 but {reason}", pytrace=False)
    pytest.skip(f"real vLLM not available: {reason}")


def _wait_for_setup() -> None:
    """When the install runs in the background (`.ci/run` sets CANARY_REAL_ENGINE_SETUP to the
    file its exit code is written to when it ends), wait for it, up to
    CANARY_REAL_ENGINE_SETUP_WAIT_S (default 1800 s); a failed install fails with its log."""
    status = os.environ.get("CANARY_REAL_ENGINE_SETUP")
    if not status:
        return
    path = Path(status)
    wait_s = float(os.environ.get("CANARY_REAL_ENGINE_SETUP_WAIT_S", "1800"))
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() > deadline:
            _unavailable(f"the background install did not end within {wait_s:g} s ({path})")
        time.sleep(2.0)
    code = path.read_text().strip()
    if code != "0":
        log = path.with_name("setup.log")
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        _unavailable(f"bench/real_engine_setup.sh exited with {code}:\n{tail}")


@pytest.fixture(scope="session")
def real_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, eng.Engine]]:
    """The four engines by name, started once for the whole test session and stopped after it."""
    workdir = tmp_path_factory.mktemp("real-engine")
    given = os.environ.get("CANARY_REAL_ENGINE_URLS")
    if given:
        yield eng.given(given, workdir)
        return
    root = eng.engine_root()
    _wait_for_setup()
    reason = eng.missing(root)
    if reason is not None:
        _unavailable(reason)
    started = eng.start_all(eng.SUITE, root, workdir)
    try:
        yield {e.name: e for e in started}
    finally:
        for e in started:
            e.stop()
