"""A throwaway PostgreSQL server for the test session, built from the local binaries.

When nothing answers at the configured DSN, `start()` runs `initdb` into a fresh temporary
directory and the `postgres` server on it (trust authentication, user `postgres`, a Unix socket
in the same directory and a free TCP port on 127.0.0.1). `initdb` refuses to run as root, so as
root the directory is handed to the unprivileged `nobody` user (else `postgres`) and both
programs run as that user. The server is a child of the test process that the kernel stops
(fast shutdown) if the test process dies, so a killed run leaves no server behind; `stop()`
ends it and removes the directory.

Plain Python and subprocesses: no event loop, so a session fixture can call it from anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
START_TIMEOUT_S = 60.0
# Tests start `canary serve` processes with pools of their own beside the test's connections.
MAX_CONNECTIONS = 200


def answers(dsn: str, timeout: float = 3.0) -> bool:
    """True when something accepts a connection where `dsn` points (TCP host:port, or a Unix
    socket directory given as the host)."""
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5432
    try:
        if host.startswith("/"):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(timeout)
                sock.connect(f"{host}/.s.PGSQL.{port}")
        else:
            with socket.create_connection((host, port), timeout=timeout):
                pass
    except OSError:
        return False
    return True


def find_bindir() -> Path | None:
    """The local PostgreSQL's bin directory holding initdb and postgres, if any: only
    $CANARY_TEST_PG_BINDIR when it is set, else the newest of Debian's /usr/lib/postgresql/N/bin,
    else the one on $PATH."""
    given = os.environ.get("CANARY_TEST_PG_BINDIR")
    candidates: list[Path] = []
    if given is not None:
        candidates.append(Path(given))
    else:
        candidates += _debian_bindirs()
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def _debian_bindirs() -> list[Path]:
    def version(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    return [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)[::-1]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _unprivileged_user() -> pwd.struct_passwd | None:
    """None when this process may run initdb itself; else the account to run it as."""
    if os.geteuid() != 0:
        return None
    for name in ("nobody", "postgres"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a `nobody` nor a `postgres` account exists")


def _die_with_parent() -> None:
    # Runs in the child after its user changed (a credential change clears the setting).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGINT)  # SIGINT: the server's fast shutdown


@dataclass
class Server:
    """A running throwaway server; `dsn` is its maintenance database as a libpq URL."""

    dsn: str
    directory: Path
    process: subprocess.Popen[bytes]
    bindir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start(bindir: Path) -> Server:
    """initdb a temporary cluster and start `postgres` on it; raises RuntimeError, with the
    server's own words, when it does not come up."""
    user = _unprivileged_user()
    directory = Path(tempfile.mkdtemp(prefix="canary-test-pg-"))
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    uid = gid = None
    groups: list[int] | None = None
    if user is not None:
        os.chown(directory, user.pw_uid, user.pw_gid)
        uid, gid, groups = user.pw_uid, user.pw_gid, []
        env["HOME"] = str(directory)
    data = directory / "data"
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
    initdb += ["-E", "UTF8", "--no-locale", "--no-sync"]
    init = subprocess.run(
        initdb,
        cwd=directory,
        env=env,
        capture_output=True,
        check=False,
        user=uid,
        group=gid,
        extra_groups=groups,
    )
    if init.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace').strip()}")
    port = _free_port()
    args = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(directory)]
    for setting in (
        "listen_addresses=127.0.0.1",
        f"max_connections={MAX_CONNECTIONS}",
        # A throwaway cluster: durability buys nothing, speed keeps the suite quick.
        "fsync=off",
        "synchronous_commit=off",
        "full_page_writes=off",
    ):
        args += ["-c", setting]
    with open(directory / "server.log", "wb") as log:
        process = subprocess.Popen(
            args,
            cwd=directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    server = Server(dsn=dsn, directory=directory, process=process, bindir=bindir)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if answers(dsn, timeout=1.0) and _accepts_queries(bindir, port, directory):
            return server
        time.sleep(0.1)
    text = (directory / "server.log").read_text(errors="replace")[-2000:]
    server.stop()
    raise RuntimeError(f"postgres did not come up on port {port}: {text.strip()}")


def _accepts_queries(bindir: Path, port: int, directory: Path) -> bool:
    """The server finished recovery and takes connections (pg_isready, over the socket)."""
    ready = bindir / "pg_isready"
    if not ready.is_file():
        return True
    probe = [str(ready), "-q", "-h", str(directory), "-p", str(port), "-U", "postgres"]
    return subprocess.run(probe, check=False, capture_output=True).returncode == 0
