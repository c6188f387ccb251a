"""The ramp's cost on production: one gateway worker with no rollout against the same worker
ramping a candidate at 50 %, at a fixed offered rate.

    .venv/bin/python bench/rollout_overhead.py [--rate 300] [--duration 6] [--rounds 6]

One `canary serve` (one worker, SQLite) in front of nginx `return 200` as production, a second
nginx server as the candidate. Rounds alternate "no rollout" and "ramp at 50 %" (a forced
rollout started through the admin API before the round, aborted after it: after an abort the
router is rolled back, the same path as no rollout), in alternating order, same process, same
run. Load is bench/overhead.py's open-loop generator (its child process): latency from the
scheduled send time, every request a new session (no X-Session-ID: the request id keys it, the
ramp's dearest case). CPU per request from /proc: the worker (production's process) and the
worker plus its children (the mirror process, which receives the ramp's evidence, and the
report process). Prints a markdown table of medians over the rounds. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import (  # a sibling script, found through sys.path above
    JSON_BODY,
    PY,
    Procs,
    child,
    cpu_seconds,
    free_port,
    median,
    wait_port,
)

TOKEN = "bench:ramp-overhead-token-0123456789"
NGINX = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{live} reuseport;
    location / {{ default_type application/json; return 200 '{body}'; }}
  }}
  server {{
    listen 127.0.0.1:{cand} reuseport;
    location / {{ default_type application/json; return 200 '{body}'; }}
  }}
}}
"""


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = (task / "children").read_text().split()
            out += map(int, kids)
            todo += map(int, kids)
    return out


def host_cpu(pid: int) -> float:
    total = cpu_seconds(pid)
    for kid in descendants(pid):
        with contextlib.suppress(FileNotFoundError):  # a child that exited meanwhile
            total += cpu_seconds(kid)
    return total


def admin(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {TOKEN.partition(':')[2]}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def metric(url: str, name: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        lines = resp.read().decode().splitlines()
    return " ".join(line for line in lines if line.startswith(name))


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="canary-ramp-overhead-"))
    procs = Procs()
    os.environ["CANARY_ADMIN_TOKEN"] = TOKEN
    try:
        live, cand, port = free_port(), free_port(), free_port()
        (tmp / "nginx.conf").write_text(NGINX.format(tmp=tmp, live=live, cand=cand, body=JSON_BODY))
        procs.start(
            "nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp), "-e", str(tmp / "err.log"),
            "-g", "daemon off;", port=live,
        )  # fmt: skip
        wait_port(cand)
        conf = tmp / "gateway.toml"
        conf.write_text(
            f'live_url = "http://127.0.0.1:{live}"\n\n[[candidates]]\nname = "cand"\n'
            f'url = "http://127.0.0.1:{cand}"\nsample_rate = 0.0\n'
        )
        gw = procs.start(
            PY, "-m", "gateway.cli.main", "serve", "--config", str(conf),
            "--listen", f"127.0.0.1:{port}", "--db", f"sqlite+aiosqlite:///{tmp}/gw.db",
        )  # fmt: skip
        wait_port(port)
        time.sleep(2.0)  # the mirror and report processes up
        base = f"http://127.0.0.1:{port}"
        url = base + "/v1/completions"
        cases = ("no rollout", "ramp at 50 %")
        res: dict[str, dict[str, list[float]]] = {
            c: {"worker": [], "host": [], "p50": [], "p99": [], "errors": []} for c in cases
        }
        split: list[str] = []
        load0 = os.getloadavg()
        child(["_openloop", url, str(args.rate), "2"])  # warm-up
        for r in range(args.rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:
                if case != "no rollout":
                    start = {"steps": [50, 100], "min_step_s": 3600, "force": True}
                    admin(f"{base}/admin/candidates/cand/rollout", start | {"reason": "bench"})
                    time.sleep(0.3)
                w0, h0 = cpu_seconds(gw.pid), host_cpu(gw.pid)
                out = child(["_openloop", url, str(args.rate), str(args.duration)])
                w1, h1 = cpu_seconds(gw.pid), host_cpu(gw.pid)
                n = out["served"]
                res[case]["worker"].append((w1 - w0) / n * 1e6)
                res[case]["host"].append((h1 - h0) / n * 1e6)
                for key, field in (("p50", "p50_ms"), ("p99", "p99_ms"), ("errors", "errors")):
                    res[case][key].append(out[field])
                if case != "no rollout":
                    split.append(metric(base, "canary_rollout_requests_total"))
                    admin(f"{base}/admin/rollout/abort", {"reason": "bench"})
                    time.sleep(0.3)
        load1 = os.getloadavg()
    finally:
        procs.stop()
    print(
        f"Machine: {os.cpu_count()} cores, load average {load0[0]:.2f} / {load0[1]:.2f} at the "
        f"start, {load1[0]:.2f} / {load1[1]:.2f} at the end (1 / 5 min)\n"
    )
    print(
        f"### One worker at {args.rate:.0f} req/s open loop, {args.rounds} rounds of "
        f"{args.duration:g} s each, median\n"
    )
    print(
        "| case | worker CPU µs/request | rounds (µs) | worker + children µs/request "
        "| p50 ms | p99 ms | errors |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for case, r in res.items():
        each = ", ".join(f"{c:.0f}" for c in r["worker"])
        print(
            f"| {case} | {median(r['worker']):.1f} | {each} | {median(r['host']):.1f} "
            f"| {median(r['p50']):.3f} | {median(r['p99']):.3f} | {sum(r['errors']):.0f} |"
        )
    off, on = res["no rollout"], res["ramp at 50 %"]
    pairs = zip(on["worker"], off["worker"], strict=True)
    diff = median(on["worker"]) - median(off["worker"])
    print(
        f"\nRamp - no rollout, worker CPU per request: {diff:+.1f} µs (medians); per round "
        "pair: " + ", ".join(f"{a - b:+.0f}" for a, b in pairs)
    )
    print(
        f"Ramp - no rollout, worker + children: {median(on['host']) - median(off['host']):+.1f} µs"
    )
    print(f"\nLast ramp round's counters: {split[-1] if split else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
