"""Real vLLM engines for the tests that need them: find the install, start, scrape, stop.

The install is the one `bench/real_engine_setup.sh` makes (vLLM's CPU build in its own venv and
the tiny model built locally), under `$CANARY_REAL_ENGINE_ROOT` (default `./.real-engine`).
Every engine runs in its own process group and is killed with it; every engine gets vLLM's
idle busy-polling capped (`SPIN_S`, the same for all) so four engines and the gateway can share
two cores. The test session starts `SUITE` once (`tests/fixtures_real_engine.py`); this module
imports no pytest, so scripts can use it too. It must never download anything or touch a
process it did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Read by the suites as `eng.scrape`; their home is bench's, so the scripts share them.
from bench._shared.vllm_metrics import delta as delta
from bench._shared.vllm_metrics import scrape as scrape
from bench._shared.vllm_metrics import settled_scrape as settled_scrape

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
# Local ports of this suite (other suites on the same machine use others); in CI, or when these
# are taken, any free port will do.
PORT_RANGE = range(8200, 8220)
# How long one engine may take to answer /health: 25-50 s alone, several minutes when four
# compile at once on two busy cores.
START_TIMEOUT_S = float(os.environ.get("CANARY_REAL_ENGINE_START_TIMEOUT_S", "600"))
SPIN_S = float(os.environ.get("CANARY_REAL_ENGINE_SPIN_S", "0.01"))
# The engines of a test session, by name, with the flags that make each what it is (later flags
# win over `Engine.start`'s defaults). Every test that needs a real engine uses these.
SUITE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("live", ("--no-enable-prefix-caching",)),
    ("bi-kv", ("--enable-prefix-caching",)),
    ("control", ("--no-enable-prefix-caching",)),
    ("quantized", ("--no-enable-prefix-caching", "--dtype", "bfloat16")),
)

_SPIN_HOOK = """\
# vLLM's shared-memory queue busy-polls for 1 s after every read; cap it (same for every engine).
import importlib.abc, importlib.util, sys

_NAME = "vllm.distributed.device_communicators.shm_broadcast"


class _CapSpin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.SpinCondition.__init__.__defaults__ = ({spin_s!r},)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CapSpin())
"""


def engine_root() -> Path:
    """Where the vLLM venv and the tiny model are."""
    root = Path(os.environ.get("CANARY_REAL_ENGINE_ROOT", str(REPO / ".real-engine")))
    return root if root.is_absolute() else (REPO / root)


def missing(root: Path) -> str | None:
    """Why engines cannot start from `root`, or None when they can."""
    py = root / "venv" / "bin" / "python"
    if not py.exists():
        return f"no vLLM venv at {py} (run: ROOT={root} bash bench/real_engine_setup.sh)"
    if not (root / MODEL / "model.safetensors").exists():
        return f"no tiny model at {root / MODEL} (run: ROOT={root} bash bench/real_engine_setup.sh)"
    return None


def given(spec: str, workdir: Path) -> dict[str, Engine]:
    """Engines already running, from `name=URL,name=URL` (not started, never stopped here)."""
    out: dict[str, Engine] = {}
    for part in spec.split(","):
        name, _, url = part.partition("=")
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        out[name.strip()] = Engine(name.strip(), port, (), workdir / f"vllm-{name.strip()}.log")
    return out


def free_port(taken: set[int]) -> int:
    """A free port in this suite's range, else any free one."""
    for port in [*PORT_RANGE, 0]:
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            got = int(s.getsockname()[1])
        taken.add(got)
        return got
    raise RuntimeError("no free port")


@dataclass
class Engine:
    """One vLLM OpenAI server."""

    name: str
    port: int
    flags: Sequence[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    ready_after_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, root: Path, hook_dir: Path) -> None:
        self.argv = [
            str(root / "venv" / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model", str(root / MODEL), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "2048", "--block-size", "32",
            "--kv-cache-memory-bytes", str(256 << 20),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
            "--dtype", "float32",
            # Tool calls (tests/real_engine/test_real_tools.py): hermes parses the calls (the form
            # bench/tiny_model.py's chat template renders); with VLLM_ENFORCE_STRICT_TOOL_CALLING=0
            # (below) a named or required `tool_choice` is forced as a JSON schema of the
            # arguments. A request without tools is untouched.
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            # Compact JSON only: with whitespace allowed, the tiny model pads forced JSON (a tool
            # call's arguments, a grader's verdict) with blanks until max_tokens and never closes
            # it. vLLM takes this option only with an explicit xgrammar (or guidance) backend.
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
            *self.flags,  # later flags win: --dtype bfloat16, prefix caching on or off
        ]  # fmt: skip
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            TOKENIZERS_PARALLELISM="false",
            # One unpinned model thread: vLLM would pin every engine to core 0 of a 2-core host.
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",
            # A named `tool_choice` as the plain JSON-schema path (which honours
            # `disable_any_whitespace`), not hermes's structural tag (which does not).
            VLLM_ENFORCE_STRICT_TOOL_CALLING="0",
        )
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_ready(self, started: float) -> None:
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM {self.name} exited with {self.proc.returncode}:\n{tail(self.log)}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as resp,
            ):
                if resp.status == 200:
                    self.ready_after_s = time.monotonic() - started
                    return
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"vLLM {self.name} not ready in {START_TIMEOUT_S:.0f} s")
            time.sleep(1.0)

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start_all(
    specs: Sequence[tuple[str, Sequence[str]]], root: Path, workdir: Path
) -> list[Engine]:
    """Start every engine at once (they compile in parallel) and wait for all of them."""
    hook_dir = workdir / "spin-cap"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(_SPIN_HOOK.format(spin_s=SPIN_S))
    taken: set[int] = set()
    engines = [
        Engine(name, free_port(taken), flags, workdir / f"vllm-{name}.log") for name, flags in specs
    ]
    started = time.monotonic()
    try:
        for engine in engines:
            engine.start(root, hook_dir)
        for engine in engines:
            engine.wait_ready(started)
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines
