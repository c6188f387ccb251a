"""nginx for a fleet on one host: where the binary is, the shipped deploy/nginx/nginx.conf
rewritten for local replicas, and nginx run in the foreground in front of them. Debian's
package is the one expected (`apt-get install -y nginx`)."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from bench._shared.ports import free_port
from bench._shared.waiting import until_ready

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"
MISSING = "nginx is not installed (apt-get install -y nginx)"


class NginxMissing(RuntimeError):
    """No nginx binary on this host."""


def find_nginx() -> str | None:
    """The nginx binary on PATH or Debian's /usr/sbin/nginx; None when neither is there."""
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )


def nginx_binary() -> str:
    """The nginx binary; NginxMissing (saying how to install it) when there is none."""
    exe = find_nginx()
    if exe is None:
        raise NginxMissing(MISSING)
    return exe


def nginx_conf(tmp: Path, listen: int, replicas: list[str], *, affinity: bool = True) -> Path:
    """deploy/nginx/nginx.conf as shipped, with its listen port, pid file and replica addresses
    replaced (and, with affinity=False, its hash line removed: nginx's default round-robin)."""
    text = NGINX_CONF.read_text()
    servers = re.findall(r"^ *server canary-\d+:8080;\n", text, re.M)
    assert servers, "the example lists its replicas as `server canary-N:8080;`"
    text = text.replace("".join(servers), "".join(f"        server {r};\n" for r in replicas))
    text = text.replace("listen 8000;", f"listen 127.0.0.1:{listen};")
    text = text.replace("pid /tmp/canary-nginx.pid;", f"pid {tmp / 'nginx.pid'};")
    # One process that stays in the foreground (the caller owns it), writing its temporary
    # files under `tmp`, which a worker switched to another user could not.
    text = text.replace("worker_processes auto;", "worker_processes 1;\nmaster_process off;")
    text = text.replace("http {\n", f"http {{\n    client_body_temp_path {tmp / 'body'};\n"
                        f"    proxy_temp_path {tmp / 'proxy'};\n", 1)  # fmt: skip
    if not affinity:
        text, n = re.subn(r"^ *hash \$canary_session consistent;\n", "", text, flags=re.M)
        assert n == 1
    conf = tmp / "nginx.conf"
    conf.write_text(text)
    return conf


async def wait_http(url: str, what: str, proc: object) -> None:
    """Until `url` answers below 500 (a gateway: its start as the product bounds it) or `proc`
    ends."""
    try:
        await until_ready(url, proc, ok=lambda status: status < 500)
    except AssertionError as exc:
        raise AssertionError(f"{what} did not come up at {url}: {exc}") from exc


@asynccontextmanager
async def nginx_front(tmp: Path, replicas: list[str], *, affinity: bool) -> AsyncIterator[str]:
    """The shipped nginx in front of `replicas` (URLs), by its URL; a clean exit at the end."""
    port = free_port()
    servers = [u.removeprefix("http://") for u in replicas]
    conf = nginx_conf(tmp, port, servers, affinity=affinity)
    proc = await asyncio.create_subprocess_exec(
        *(nginx_binary(), "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_http(f"http://127.0.0.1:{port}/healthz", "nginx", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        assert proc.stderr is not None
        err = await asyncio.wait_for(proc.stderr.read(), 30)
        code = await asyncio.wait_for(proc.wait(), 30)
        assert code == 0, err.decode()[-2000:]
