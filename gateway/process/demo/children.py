"""The demo's child processes: simulators and a gateway started as `canary` subcommands, each
its own child with a log in the working directory, all stopped on exit, on error and on Ctrl-C
(and by the kernel should the demo die first). Also the progress bar the demo drives.

Never a process the demo did not start: `Processes.stop_all` stops its own children only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

import aiohttp

from domain.errors import CanaryError
from gateway.lifecycle import die_with_parent

# How long a simulator or the gateway may take to answer its readiness probe.
READY_TIMEOUT_S = 30.0


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # handed to the child process; closed right after the spawn


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:]


# The line `canary sim` prints once it listens: the demo learns each simulator's URL from it.
_SIM_ANNOUNCED = re.compile(r"^canary sim: profile \S+ serving .* on (http://\S+)$", re.M)


def free_port() -> int:
    """A port free now, for the gateway's config. A simulator binds port 0 instead and says
    where (`wait_announced`): two ports picked this way, each released before its process binds
    it, can be the same one, and the second process then dies while the first answers for it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Processes:
    """The child processes of the demo; `stop_all` terminates them, then kills stragglers."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.children: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, *args: str) -> asyncio.subprocess.Process:
        log = _open_log(self.logdir / f"{name}.log")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli.main",
            *args,
            stdout=log,
            stderr=log,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops its children itself
            preexec_fn=functools.partial(die_with_parent, os.getpid()),  # ... or the kernel does
        )
        log.close()
        self.children.append((name, proc))
        return proc

    def get(self, name: str) -> asyncio.subprocess.Process:
        return next(p for n, p in self.children if n == name)

    async def stop(self, name: str, timeout_s: float = 15.0) -> None:
        for child_name, proc in self.children:
            if child_name == name:
                await self._stop(proc, timeout_s)

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(p, 5.0) for _, p in reversed(self.children)))


async def wait_ready(url: str, proc: asyncio.subprocess.Process, what: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = _tail(log)
                raise CanaryError(f"{what} exited with code {proc.returncode}:\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise CanaryError(
        f"{what} did not become ready at {url} within {READY_TIMEOUT_S:g} s (log: {log})"
    )


async def wait_announced(proc: asyncio.subprocess.Process, what: str, log: Path) -> str:
    """The URL a simulator started on port 0 says it listens on (read from its log, where its
    stdout goes); a clear error if it exits first or does not say so in time."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(log.read_text, errors="replace")
        found = _SIM_ANNOUNCED.search(text)
        if found:
            return found.group(1)
        if proc.returncode is not None:
            raise CanaryError(f"{what} exited with code {proc.returncode}:\n{_tail(log)}")
        await asyncio.sleep(0.05)
    raise CanaryError(f"{what} did not start within {READY_TIMEOUT_S:g} s (log: {log})")


@contextlib.asynccontextmanager
async def workdir(keep: bool) -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="canary-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


class ProgressBar(Protocol):
    """What the demo needs of a progress bar (the CLI passes `gateway.cli.progress.Progress`)."""

    def advance(self, n: int = 1) -> None: ...
    def note(self, status: str) -> None: ...
    def __enter__(self) -> ProgressBar: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class NoProgress:
    def advance(self, n: int = 1) -> None:
        pass

    def note(self, status: str) -> None:
        pass

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass
