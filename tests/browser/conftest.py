"""The browser tests drive Debian's `chromium` with Playwright (no browser download). Without
chromium or Playwright they skip with one line, unless `CANARY_REQUIRE_BROWSER=1` (what
`.ci/run` sets): then they fail."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from bench._shared.browser_stack import CHROMIUM


def browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = browser_missing()
    if reason is None or os.environ.get("CANARY_REQUIRE_BROWSER") == "1":
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"browser tests skipped: {reason}")
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _browser_required() -> None:
    reason = browser_missing()
    if reason is not None:  # only reached under CANARY_REQUIRE_BROWSER=1
        pytest.fail(f"CANARY_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
