"""Runs inside the built image (deploy/image/ci.sh), as root, with the image's own python: the
pod's two commands from deploy/k8s, then a SIGTERM to `canary serve` as PID 1 mid-stream.

1. The db-upgrade Job's args (`db upgrade`) migrate a SQLite file in /tmp, as UID 10001.
2. The Deployment's args (`serve --config /etc/canary/gateway.toml`, the ConfigMap's file
   mounted there) run as UID 10001 and PID 1 of a PID namespace of their own
   (`unshare --pid --fork`), in front of a streaming upstream served from here. Once both
   workers answer, a streamed answer is opened; after its first events the gateway gets SIGTERM.
   The stream must end whole (every event and `[DONE]`) or be closed cleanly, the gateway must
   exit 0 within the pod's grace (terminationGracePeriodSeconds), and when PID 1 exits no other
   process may be left in its namespace (the kernel would kill it: an orphan).

It never touches the host: only 127.0.0.1 ports it picked and files under /tmp.
Usage: python pod_check.py JOB_ARGS_JSON DEPLOYMENT_ARGS_JSON GRACE_S"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

UID = "10001"
EVENTS = 40
EVENT_GAP_S = 0.1  # a 4 s answer: SIGTERM lands while most of it is still to come


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def as_uid(args: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--", *args]


async def upstream(request: web.Request) -> web.StreamResponse:
    """An OpenAI-style streamed chat answer, one event every EVENT_GAP_S."""
    body = await request.json()
    if not body.get("stream"):
        return web.json_response({"id": "x", "object": "chat.completion", "choices": []})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(EVENTS):
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}  # fmt: skip
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(EVENT_GAP_S)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def namespace_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def members(ns: str) -> set[int]:
    """Every live process in that PID namespace: a zombie (Z, exited, not yet reaped) or a dead
    one (X) has stopped running, so it is no orphan the kernel would have to kill."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and namespace_of(int(entry)) == ns:
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("X", "Z"):
                found.add(int(entry))
    return found


def pid_one(unshare_pid: int) -> int:
    """The process unshare forked into the new namespace, where it is PID 1."""
    for _ in range(500):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["PPid"]) == unshare_pid and fields["NSpid"].split()[-1] == "1":
                return int(entry)
        time.sleep(0.01)
    raise SystemExit("unshare's child (PID 1 of its namespace) never appeared")


async def run_job(args: list[str], env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *as_uid(["canary", *args]), env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    print(out.decode()[-2000:])
    if proc.returncode != 0:
        raise SystemExit(f"the Job's `canary {' '.join(args)}` exited {proc.returncode}")
    print(f"ok: the Job's `canary {' '.join(args)}` exited 0 as UID {UID}")


async def main(job_args: list[str], pod_args: list[str], grace_s: float) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream)
    runner = web.AppRunner(app)
    await runner.setup()
    live_port, proxy_port, admin_port = free_port(), free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", live_port).start()
    os.makedirs("/tmp/spill", exist_ok=True)
    os.chown("/tmp/spill", int(UID), int(UID))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env |= {
        "CANARY_STORAGE_DB_URL": "sqlite+aiosqlite:////tmp/pod/canary.db",
        "CANARY_ADMIN_TOKEN": "ops:" + "k" * 32,
        "CANARY_SERVER_REPLICA_NAME": "canary-gateway-image-check",
        # The pod has a network namespace of its own; here the host's is shared.
        "CANARY_LISTEN": f"127.0.0.1:{proxy_port}",
        "CANARY_ADMIN_LISTEN": f"127.0.0.1:{admin_port}",
        "CANARY_LIVE_URL": f"http://127.0.0.1:{live_port}",
        "CANARY_REPORTS_SPILL_DIR": "/tmp/spill",
    }
    os.makedirs("/tmp/pod", exist_ok=True)
    os.chown("/tmp/pod", int(UID), int(UID))
    await run_job(job_args, env)

    unshare = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--kill-child", *as_uid(["canary", *pod_args]), env=env,
    )  # fmt: skip
    leader = pid_one(unshare.pid)
    ns = namespace_of(leader)
    assert ns is not None
    base = f"http://127.0.0.1:{proxy_port}"
    pids: set[int] = set()
    deadline = time.monotonic() + 120
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        while len(pids) < 2:  # both workers listening, or a probe would meet a starting one
            if time.monotonic() > deadline or unshare.returncode is not None:
                raise SystemExit("the Deployment's `canary serve` never answered /healthz")
            try:
                async with http.get(base + "/healthz") as resp:
                    pids.add((await resp.json())["pid"])
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.2)
        running = members(ns)
        print(f"ok: `canary {' '.join(pod_args)}` serves as PID 1; {len(running)} processes")

        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        events, done, closed = 0, False, ""
        async with http.post(base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            stopped_at = 0.0
            try:
                async for line in resp.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b"data: "):
                        events += 1
                    if events == 5 and not stopped_at:
                        os.kill(leader, signal.SIGTERM)
                        stopped_at = time.monotonic()
                        print("sent SIGTERM to PID 1 after 5 of the stream's events")
            except aiohttp.ClientPayloadError as exc:
                closed = repr(exc)

    # Watch the namespace until PID 1 is gone: what was alive at the last look beside it was
    # killed by the kernel when it exited, i.e. left behind by the gateway.
    last = {leader}
    while True:
        now = members(ns) if namespace_of(leader) == ns else set()
        if leader not in now:
            break
        last = now
        if time.monotonic() - stopped_at > grace_s:
            raise SystemExit(f"PID 1 still running {grace_s:.0f} s after SIGTERM (the grace)")
        await asyncio.sleep(0.002)
    code = await unshare.wait()
    took = time.monotonic() - stopped_at
    await runner.cleanup()
    print(f"stream: {events}/{EVENTS} events, [DONE]={done}, closed={closed or 'no'}")
    print(f"PID 1 exited {code} {took:.1f} s after SIGTERM; last look beside it: {last - {leader}}")
    if not (done and events == EVENTS) and not closed:
        raise SystemExit("the stream neither finished nor was closed cleanly")
    if code != 0:
        raise SystemExit(f"`canary serve` as PID 1 exited {code} on SIGTERM")
    if last - {leader}:
        raise SystemExit(f"processes outlived PID 1 (orphans the kernel killed): {last}")
    print(f"ok: SIGTERM mid-stream: clean stop in {took:.1f} s (grace {grace_s:.0f} s)")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])))
