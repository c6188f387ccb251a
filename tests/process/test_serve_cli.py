"""`canary serve`: flags and config errors, a real process serving, workers, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.cli.main import main
from gateway.config.sections import ServerConfig
from tests.upstreams import free_port
from tests.waiting import SERVE_START_S, SETTLE_S, until, until_ready


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_unknown_key_in_config_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown key stops serve with exit 2 and a message naming the file and the key."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text('listen = "127.0.0.1:0"\nmax_bodyy_bytes = 5\n')
    code, err = run_cli(["serve", "--config", str(cfg)], capsys)
    assert code == 2
    assert str(cfg) in err and "max_bodyy_bytes" in err
    assert "Traceback" not in err


def test_wrong_type_in_config_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrongly typed value names the file, the key and the expected type."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[upstream]\nidle_timeout_s = "soon"\n')
    code, err = run_cli(["serve", "--config", str(cfg)], capsys)
    assert code == 2
    assert str(cfg) in err and "'upstream.idle_timeout_s'" in err and "float" in err


def test_bad_live_url_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A live URL that is not http(s) is refused with the key and the reason."""
    code, err = run_cli(["serve", "--live", "ftp://example"], capsys)
    assert code == 2
    assert "'live.url'" in err and "scheme" in err


def test_unreadable_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing config file is reported by name, with exit 2."""
    missing = tmp_path / "nope.toml"
    code, err = run_cli(["serve", "--config", str(missing)], capsys)
    assert code == 2 and str(missing) in err and "cannot read" in err


def test_bad_workers_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """--workers 0 is a configuration error (exit 2), not a crash."""
    code, err = run_cli(["serve", "--workers", "0"], capsys)
    assert code == 2 and "workers" in err


async def spawn_serve(tmp: Path, *args: str) -> tuple[asyncio.subprocess.Process, int]:
    """`canary serve` on a free port and a SQLite file in `tmp`, stderr piped; not waited for."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--db",
        f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    return proc, port


async def start_serve(tmp: Path, *args: str) -> tuple[asyncio.subprocess.Process, str]:
    """`spawn_serve`, then wait until it is ready."""
    proc, port = await spawn_serve(tmp, *args)
    return proc, await until_serving(proc, port)


async def until_serving(proc: asyncio.subprocess.Process, port: int) -> str:
    """The URL of a spawned `canary serve` once its /readyz answers 200 (within the start the
    product bounds: `tests.waiting.SERVE_START_S`); its stderr when it does not."""
    url = f"http://127.0.0.1:{port}"
    with contextlib.suppress(AssertionError):
        await until_ready(url + "/readyz", proc)
        return url
    if proc.returncode is None:
        proc.kill()
    assert proc.stderr is not None
    err = await proc.stderr.read()
    code = await proc.wait()
    raise AssertionError(f"canary serve did not become ready (exit {code}): {err.decode()[-2000:]}")


async def stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    if proc.returncode is None:  # else it has exited already: its code and log say why
        proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    err = await asyncio.wait_for(proc.stderr.read(), 30)
    return await asyncio.wait_for(proc.wait(), 30), err.decode()


async def test_serve_with_builtin_simulator_and_json_logs(tmp_path: Path) -> None:
    """Without --live, serve proxies to a built-in simulator, logs JSON and exits 0 on SIGTERM."""
    proc, url = await start_serve(tmp_path, "--log-format", "json")
    try:
        async with aiohttp.ClientSession() as http:
            payload = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(url + "/v1/chat/completions", json=payload) as resp:
                assert resp.status == 200
                assert (await resp.json())["choices"][0]["message"]["content"]
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
            assert 'canary_proxy_requests_total{route="/v1/chat/completions",status="200"} 1' in (
                text
            )
    finally:
        code, err = await stop(proc)
    assert code == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    messages = [r["msg"] for r in records]
    assert any("simulator" in m for m in messages)
    assert "canary-gateway listening" in messages and "shutting down" in messages


async def test_two_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    """--workers 2 runs two processes on one port, both mapping the one session-arm table the
    supervisor created; SIGTERM to the parent stops them all and removes the table."""
    arms = tmp_path / "arms"
    arms.mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[rollout]\narms_dir = "{arms}"\narms_slots = 4096\n')
    proc, url = await start_serve(tmp_path, "--workers", "2", "--config", str(config))
    pids: set[int] = set()
    try:

        async def both_answered() -> bool:  # workers come up one after the other
            async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as resp:
                pids.add((await resp.json())["pid"])
            return len(pids) == 2

        with contextlib.suppress(AssertionError):  # the assertions below say what was seen
            await until(both_answered, what="both workers answering", within_s=SERVE_START_S)
        [table] = arms.iterdir()
        assert table.name.startswith(f"canary-arms-{proc.pid}-")
        for pid in pids:
            assert str(table) in await asyncio.to_thread(Path(f"/proc/{pid}/maps").read_text)
    finally:
        code, err = await stop(proc)
    assert list(arms.iterdir()) == []
    assert len(pids) == 2, err
    assert proc.pid not in pids
    assert code == 0, err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_workers_exit_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """A supervisor killed with SIGKILL leaves no worker behind holding the port."""
    # A worker's shutdown waits up to `drain_timeout_s` three times (in-flight requests, the
    # mirror's drain, the writer's last flush), as the supervisor allows it (workers._join_all);
    # the supervisor's `wait()` also waits for its stderr pipe, which its workers hold.
    within_s = 3 * ServerConfig().drain_timeout_s + 5.0 + SETTLE_S
    proc, url = await start_serve(tmp_path, "--workers", "2")
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as resp:
            worker = (await resp.json())["pid"]
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), within_s)

    async def gone() -> bool:  # the kernel signals the workers; their drain takes a moment
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return True
        return False

    await until(gone, what=f"worker {worker} exited", within_s=within_s)


async def test_sigterm_while_workers_start_is_a_clean_stop(tmp_path: Path) -> None:
    """A SIGTERM that reaches workers still starting (a rollout stopping a pod right after its
    first worker answered) stops them all and exits 0: a worker that dies of it had not yet
    listened, so it never held a request."""
    proc, _ = await spawn_serve(tmp_path, "--workers", "2", "--log-format", "json")
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        while True:  # the supervisor has just spawned its workers: they are importing
            line = (await asyncio.wait_for(proc.stderr.readline(), 120)).decode()
            assert line, "".join(seen)
            seen.append(line)
            if '"supervising workers"' in line:
                pids = json.loads(line)["pids"]
                break
        proc.send_signal(signal.SIGTERM)
        err = (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
        code = await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, "".join(seen) + err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# Runs `canary serve` as the child of a child subreaper (as PID 1 of a container is one): a
# process the gateway leaves behind when it exits is reparented here, and listed.
_SUBREAPER = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
serve = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
sys.stdin.readline()
serve.send_signal(signal.SIGTERM)
code = serve.wait(60)
time.sleep(0.5)  # an orphan exits soon after (its pipe closed) and stays a zombie here
left = []
for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/children") as f:
        for pid in f.read().split():
            with open(f"/proc/{pid}/stat") as stat:  # "pid (comm) state ...": a zombie's
                left.append(stat.read().split(" ", 3)[:3])  # cmdline is empty
print(json.dumps({"code": code, "left": left}), flush=True)
"""


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_leaves_no_process_behind(tmp_path: Path, workers: str) -> None:
    """On SIGTERM `canary serve` exits 0 with nothing of it still running: not a worker, the
    mirror or report process, nor multiprocessing's resource tracker (which exits only when
    its pipe closes, after the last process holding it; as PID 1 of a pod the kernel would kill
    it). Every process it leaves is reparented to the test's subreaper and listed."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SUBREAPER,
        sys.executable,
        "-m",
        "gateway.cli.main",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--db",
        f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}",
        "--workers",
        workers,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        await until_ready(f"http://127.0.0.1:{port}/readyz", proc)
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        out = json.loads(await asyncio.wait_for(proc.stdout.readline(), 90))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert out["code"] == 0, out
    assert out["left"] == [], out
