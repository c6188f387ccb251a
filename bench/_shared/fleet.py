"""`canary serve` replicas as child processes on one database and one config file, as a fleet
runs them (deploy/k8s mounts one ConfigMap): the fleet test and the rollout fleet benchmark
start them here, behind the shipped nginx (`bench._shared.nginx`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from bench._shared.nginx import wait_http
from bench._shared.ports import free_port

TOKEN = "ops:fleet-test-token-0123456789"  # each replica's admin token, labelled "ops"


def child_env() -> dict[str, str]:
    """This process's environment less every CANARY_ variable (a child reads only its file)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}


def cli(*args: str) -> list[str]:
    """The argv of `canary ARGS` run by this interpreter."""
    return [sys.executable, "-m", "gateway.cli.main", *args]


@asynccontextmanager
async def processes(*children: tuple[list[str], str, dict[str, str]]) -> AsyncIterator[None]:
    """Child processes (argv, readiness URL, environment), started at once and ready once every
    URL answers; SIGTERM and a clean exit for each at the end."""
    procs = []
    try:
        for argv, _url, env in children:
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        await asyncio.gather(
            *(
                wait_http(url, " ".join(argv[3:5]), p)
                for (argv, url, _), p in zip(children, procs, strict=True)
            )
        )
        yield
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for (argv, _, _), proc in zip(children, procs, strict=False):
            assert proc.stderr is not None
            err = await asyncio.wait_for(proc.stderr.read(), 60)
            code = await asyncio.wait_for(proc.wait(), 60)
            assert code == 0, f"{argv}: exit {code}: {err.decode()[-2000:]}"


@asynccontextmanager
async def replicas(conf: Path, db_url: str, *names: str) -> AsyncIterator[list[str]]:
    """`canary serve` replicas on one database and one config file, by URL."""
    ports = [free_port() for _ in names]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    children = []
    for name, port, url in zip(names, ports, urls, strict=True):
        args = ["serve", "--config", str(conf), "--listen", f"127.0.0.1:{port}", "--db", db_url]
        env = child_env() | {"CANARY_ADMIN_TOKEN": TOKEN, "CANARY_SERVER_REPLICA_NAME": name}
        children.append((cli(*args), url + "/readyz", env))
    async with processes(*children):
        yield urls
