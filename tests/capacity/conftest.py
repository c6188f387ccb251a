"""Real vLLM engines for the capacity tests, started once per test session (shareable: any test
package can import `real_engines` from here or list this module in `pytest_plugins`).

The engines come from the real-engine kit (`../shared/real-engine/`): the vLLM CPU build and the
tiny model under `$CANARY_REAL_ENGINE_ROOT` (default /work/main/.real-engine). Two servers of the
same model in float32: `pc` with prefix caching, `nopc` with `--no-enable-prefix-caching`, on
`$CANARY_CAPACITY_PORTS` (default 8110,8111). A port that already serves the model is reused
as is (and left running); engines this fixture started are stopped at the end of the session.
Without the kit the tests skip, saying what is missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("CANARY_REAL_ENGINE_ROOT", "/work/main/.real-engine"))
SERVE = Path(
    os.environ.get(
        "CANARY_REAL_ENGINE_SERVE",
        str(Path(__file__).resolve().parents[3] / "shared" / "real-engine" / "serve_vllm.sh"),
    )
)
if not SERVE.exists():  # the worktree layout: /work/wt/NAME/tests/capacity
    SERVE = Path("/work/shared/real-engine/serve_vllm.sh")
PORTS = tuple(int(p) for p in os.environ.get("CANARY_CAPACITY_PORTS", "8110,8111").split(","))
START_TIMEOUT_S = 240.0  # first start compiles (~50 s idle); a busy 2-core machine is slower
FLAGS = {"pc": [], "nopc": ["--no-enable-prefix-caching"]}


def _serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
            return b"tiny-llama" in resp.read()
    except OSError:
        return False


def _missing() -> str | None:
    if not (ROOT / "venv").is_dir() or not (ROOT / "tiny-llama").is_dir():
        return (
            f"no real-engine kit at {ROOT} (set CANARY_REAL_ENGINE_ROOT; see ../shared/real-engine)"
        )
    if not SERVE.is_file():
        return f"no serve_vllm.sh at {SERVE} (set CANARY_REAL_ENGINE_SERVE)"
    return None


@pytest.fixture(scope="session")
def real_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"pc": URL, "nopc": URL}: two real vLLM servers, started once (or reused)."""
    if reason := _missing():
        pytest.skip(reason)
    # A root of our own (links to the kit) so the engines' logs stay in the test's temp dir.
    root = tmp_path_factory.mktemp("real-engine")
    for name in ("venv", "tiny-llama"):
        (root / name).symlink_to(ROOT / name)
    started: list[int] = []
    urls: dict[str, str] = {}
    try:
        for (name, flags), port in zip(FLAGS.items(), PORTS, strict=True):
            url = f"http://127.0.0.1:{port}"
            urls[name] = url
            if _serves(url):
                continue
            out = subprocess.run(
                ["bash", str(SERVE), str(port), *flags],
                env={**os.environ, "ROOT": str(root)},
                capture_output=True,
                text=True,
                check=True,
            )
            started.append(int(out.stdout.strip().splitlines()[-1]))
        deadline = time.monotonic() + START_TIMEOUT_S
        for name, url in urls.items():
            while not _serves(url):
                if time.monotonic() > deadline:
                    logs = sorted(root.glob("vllm-*.log"))
                    tail = logs[-1].read_text()[-2000:] if logs else ""
                    pytest.fail(f"vLLM {name} at {url} not ready in {START_TIMEOUT_S} s:\n{tail}")
                time.sleep(1.0)
        yield urls
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in started:
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
