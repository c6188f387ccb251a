"""Bounded fuzzing of both ports of a real gateway in front of a simulated engine.

    .venv/bin/python bench/fuzz_edges.py [--proxy-seconds 120] [--admin-seconds 120]

Starts `canary sim --profile fast` (the live endpoint, and a candidate at sample rate 1, so the
mirror process parses every body too) and `canary serve` with the admin API on its own listener,
each in its own process on 127.0.0.1, then:

  proxy port  hypothesis generates raw bytes over the request head and body framing: methods,
              targets (origin, absolute, asterisk, odd), versions, header lines (duplicated or
              conflicting Content-Length and Transfer-Encoding, obs-folds, bare LF, NUL and
              control bytes, huge values), bodies framed by length, chunked (bad sizes,
              extensions, trailers), truncated or followed by a pipelined request, sent whole or
              in pieces, with or without a half-close; each exchange on its own connection
  admin port  schemathesis over `/admin/openapi.json` with every check (`--checks all`), token
              given, for a bounded time

Each proxy example must get no 5xx the live endpoint did not send (the simulator's fast profile
never sends one), and an answer whenever h11 (an independent parser) reads a whole request from
its bytes, the gateway must stay up (`/healthz` between rounds) and its memory bounded
(RSS of the worker and the mirror process sampled before and after), and nothing may be logged at
ERROR or with a traceback. It prints a markdown report; a finding names the bytes that caused it.
It is a benchmark-style script, not a test: tests/ holds the regression test of each finding.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h11
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TOKEN = "fuzz-admin-token-0123456789"
READ_TIMEOUT = 5.0  # longer than the gateway's head and body timeouts below
RETRY_TIMEOUT = 30.0
PARALLEL = 8  # exchanges at once: most of an exchange's time is waiting on a timeout

# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def admin_call(admin: str, method: str, path: str, body: dict[str, Any] | None = None) -> int:
    req = urllib.request.Request(
        admin + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


# --------------------------------------------------------------------- request generation

METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"CONNECT",
           b"TRACE", b"get", b"G\x00ET", b"POST ", b"PR\xffI", b""]  # fmt: skip
TARGETS = [
    b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/models", b"/healthz",
    b"/readyz", b"/metrics", b"/admin/status", b"/admin/openapi.json", b"*",
    b"http://elsewhere.example/v1/models", b"https://x:99999/v1/models?x=1", b"//double//slash",
    b"/%00%ff%2e%2e/../etc/passwd", b"/v1/models?" + b"q" * 9000, b"/" + b"a" * 70000,
    b"/v1/models#frag", b"/\xff\xfe", b"example.com:443", b"", b"/sp ace",
]  # fmt: skip
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.10", b"HTTP/1",
            b"http/1.1", b"HTTP/1.1 extra", b""]  # fmt: skip
CHAT = (b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],'
        b'"max_tokens":4,"stream":%s}')  # fmt: skip
BODIES = [
    b"", CHAT % b"true", CHAT % b"false", b"{", b"[]" * 2000, b"\x00" * 64, b'{"a":' * 500,
    b'{"model":"sim-model","messages":"\xff\xfe"}', b"x" * 70000, b'{"stream":"yes"}',
    b'{"model":1e999999,"messages":[]}', b'{"messages":[{"role":"user","content":"\\ud800"}]}',
]  # fmt: skip
HEADER_NAMES = [b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect",
                b"Upgrade", b"Content-Type", b"Content-Encoding", b"Authorization",
                b"X-Session-ID", b"X-Request-ID", b"Cookie", b"Te", b"Trailer", b"Keep-Alive",
                b"X-Forwarded-For", b"Proxy-Connection", b"Content-Length ", b" Host",
                b"X\x00Y", b"\xff", b""]  # fmt: skip
HEADER_VALUES = [b"x", b"0", b"5", b"-1", b"+5", b"0x10", b"99999999999999999999", b"5, 5",
                 b"chunked", b"chunked, chunked", b" chunked", b"gzip, chunked", b"identity",
                 b"close", b"keep-alive", b"upgrade", b"websocket", b"100-continue",
                 b"application/json", b"gzip", b"Bearer sk-fuzz", b"\x00", b"\xff\xfe",
                 b"a\rb", b"v" * 9000, b"trailers", b""]  # fmt: skip

_header = st.tuples(
    st.one_of(st.sampled_from(HEADER_NAMES), st.binary(max_size=20)),
    st.one_of(st.sampled_from(HEADER_VALUES), st.binary(max_size=40)),
    st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r", b"\r\n "]),  # last: obs-fold
)


@st.composite
def chunked(draw: st.DrawFn, body: bytes, valid: bool) -> bytes:
    """`body` in chunks; sometimes with bad sizes, extensions, trailers or no terminator."""
    out = b""
    rest = body
    while rest:
        n = draw(st.integers(1, max(1, len(rest))))
        sizes = [b"%x" % n, b"%X" % n, b"%x;ext=1" % n]
        if not valid:
            sizes += [b"0x%x" % n, b" %x" % n, b"%x " % n, b"-%x" % n, b"ffffffffffffffffff"]
        ends = [b"\r\n"] if valid else [b"\r\n", b"\n", b"", b"xx"]
        out += draw(st.sampled_from(sizes)) + b"\r\n" + rest[:n] + draw(st.sampled_from(ends))
        rest = rest[n:]
    last = [b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n"]
    out += draw(st.sampled_from(last if valid else [*last, b"0\r\n", b"", b"0\n\n"]))
    return out


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    """Half well-formed requests with odd but legal parts, half malformed, some plain noise."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(min_size=1, max_size=512))
    valid = draw(st.booleans())
    if valid:
        method = draw(st.sampled_from(METHODS[:7]))
        target = draw(st.sampled_from(TARGETS[:12]))
        version, eol = draw(st.sampled_from(VERSIONS[:2])), b"\r\n"
        header = st.tuples(
            st.sampled_from(HEADER_NAMES[:17]), st.sampled_from(HEADER_VALUES[:21]),
            st.just(b"\r\n"),
        )  # fmt: skip
    else:
        method = draw(st.one_of(st.sampled_from(METHODS), st.binary(max_size=8)))
        target = draw(st.one_of(st.sampled_from(TARGETS), st.binary(max_size=30)))
        version = draw(st.sampled_from(VERSIONS))
        eol = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"]))
        header = _header
    sep = b" " if valid else draw(st.sampled_from([b" ", b"  ", b"\t"]))
    head = method + sep + target + b" " + version + eol
    if valid or draw(st.booleans()):
        head += b"Host: gw" + eol
    body = draw(st.one_of(st.sampled_from(BODIES), st.binary(max_size=256)))
    framings = ["length", "length", "chunked", "none"]
    framing = draw(st.sampled_from(framings if valid else [*framings, "wrong-length"]))
    if framing == "length":
        head += b"Content-Length: %d" % len(body) + eol
    elif framing == "wrong-length":
        head += b"Content-Length: %d" % draw(st.integers(0, len(body) + 64)) + eol
    elif framing == "chunked":
        head += b"Transfer-Encoding: chunked" + eol
        body = draw(chunked(body, valid))
    for name, value, end in draw(st.lists(header, max_size=4)):
        head += name + b": " + value + end
    data = head + eol + (body if framing != "none" else b"")
    if draw(st.integers(0, 9)) == 0:  # a pipelined second request
        data += b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"
    if not valid and draw(st.integers(0, 9)) == 0:  # truncated anywhere
        data = data[: draw(st.integers(0, len(data)))]
    return data


# ------------------------------------------------------------------------------ proxy fuzz

STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


class ProxyFuzz:
    def __init__(self, port: int) -> None:
        self.port = port
        self.examples = 0
        self.statuses: dict[int, int] = {}
        self.no_answer = 0
        self.answered_on_retry = 0  # whole requests unanswered in READ_TIMEOUT, then answered
        self.findings: list[tuple[str, bytes, bytes]] = []
        self._lock = threading.Lock()

    def exchange(
        self, data: bytes, pieces: int, half_close: bool, timeout: float = READ_TIMEOUT
    ) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            step = max(1, len(data) // pieces)
            try:
                for start in range(0, len(data), step):
                    sock.sendall(data[start : start + step])
                    if pieces > 1:
                        time.sleep(0.005)
                if half_close:
                    sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the gateway may close early (413, 400): read what it said
            out = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    out += chunk
                    if len(out) > 1 << 20:
                        break
            return out

    def check(self, data: bytes, pieces: int, half_close: bool) -> None:
        try:
            out = self.exchange(data, pieces, half_close)
        except OSError as exc:
            with self._lock:
                self.examples += 1
                self.findings.append((f"connect failed: {exc}", data, b""))
            return
        # A client that half-closes is taken as gone, as a close is (the upstream exchange is
        # aborted at once; nginx's proxy_ignore_client_abort off does the same): only a whole
        # request from a client still reading must be answered.
        if not half_close and not STATUS.search(out) and complete_request(data):
            # Asked again alone with a long timeout: on a host at load 40 a read timeout is
            # the neighbours' doing; a request still unanswered then is a finding.
            again = self.exchange(data, 1, half_close, timeout=RETRY_TIMEOUT)
            with self._lock:
                if STATUS.search(again):
                    self.answered_on_retry += 1
                else:
                    self.findings.append(("a whole request (h11) got no answer", data, again))
        found = [int(m) for m in STATUS.findall(out)]
        with self._lock:
            self.examples += 1
            self.no_answer += not found
            for status in found:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status >= 500:  # the fast simulator never sends one: the gateway's own
                    self.findings.append((f"{status} from the gateway", data, out[:600]))


def complete_request(data: bytes) -> bool:
    """Whether h11 (an independent HTTP/1.1 parser) reads a whole request from `data`: the
    gateway must answer such a request, whatever it answers."""
    conn = h11.Connection(h11.SERVER)
    try:
        conn.receive_data(data)
        for _ in range(len(data) + 8):  # bounded: each event consumes bytes, or ends the loop
            event = conn.next_event()
            if isinstance(event, h11.EndOfMessage):
                return True
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return False
    except h11.RemoteProtocolError:
        return False
    return False


def fuzz_proxy(port: int, seconds: float) -> ProxyFuzz:
    fz = ProxyFuzz(port)
    end = time.monotonic() + seconds

    @settings(
        max_examples=20, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(st.lists(st.tuples(request_bytes(), st.sampled_from([1, 1, 1, 2, 7]), st.booleans()),
                    min_size=PARALLEL, max_size=PARALLEL))  # fmt: skip
    def one(batch: list[tuple[bytes, int, bool]]) -> None:
        if time.monotonic() < end:
            list(pool.map(lambda args: fz.check(*args), batch))

    with ThreadPoolExecutor(PARALLEL) as pool:
        while time.monotonic() < end:
            one()
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=10)
            print(f"{fz.examples} examples, {len(fz.findings)} findings", file=sys.stderr)
    return fz


# ------------------------------------------------------------------------------ admin fuzz


# As in tests/control/test_admin_openapi.py: the gate answers its verdict as a status (412
# reject, 425 hold), as the document declares. Positive-data acceptance stays on for every
# operation; on create and update it also reports verdict overrides whose values break a rule
# relating two settings (delta <= critical), which JSON Schema cannot state: the report counts
# those apart (`known_verdict_rules`), every other failure is a finding.
ST_CONFIG = """
[[operations]]
include-operation-id-regex = "^gateCandidate(Webhook)?$"
checks.positive_data_acceptance.expected-statuses = ["200", "404", "412", "425"]
"""


def admin_failures(out: str) -> tuple[list[str], int]:
    """(failures that are findings, failures that are only verdict-override relation rules)."""
    blocks = out.split("Test Case ID:")[1:]
    known = [b for b in blocks if "[422]" in b and '{"error":{"message":"verdict: ' in b]
    found = [b.split("Reproduce with:")[0].strip() for b in blocks if b not in known]
    return found, len(known)


def fuzz_admin(admin: str, seconds: float, tmp: Path) -> tuple[int, str]:
    spec = admin + "/admin/openapi.json"
    config = tmp / "schemathesis.toml"
    config.write_text(ST_CONFIG)
    cmd = [
        str(Path(PY).parent / "schemathesis"), "--config-file", str(config), "run", spec,
        "--checks", "all",
        "--max-time", str(int(seconds)), "-H", f"Authorization: Bearer {TOKEN}",
        "--workers", "1", "--request-timeout", "10", "--suppress-health-check", "all",
        "--no-color", "--continue-on-failure",
        "--report", "junit", "--report-dir", str(tmp / "st-report"),
    ]  # fmt: skip
    # In tmp: its cache directory goes there, not into the repository.
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy-seconds", type=float, default=120.0)
    ap.add_argument("--admin-seconds", type=float, default=120.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the children on the way out
    tmp = Path(tempfile.mkdtemp(prefix="canary-fuzz-"))
    sim_port, gw_port, admin_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env.update(
        CANARY_ADMIN_TOKEN=TOKEN, CANARY_ADMIN_LISTEN=f"127.0.0.1:{admin_port}",
        CANARY_HEADER_READ_TIMEOUT_S="1", CANARY_BODY_READ_TIMEOUT_S="1",
        CANARY_KEEPALIVE_TIMEOUT_S="1", CANARY_LOG_FORMAT="json",
    )  # fmt: skip
    log_path = tmp / "gateway.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [PY, "-m", "gateway.cli.main", "sim", "--profile", "fast", "--port", str(sim_port)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        sim = f"http://127.0.0.1:{sim_port}"
        wait_http(sim + "/health")
        with log_path.open("wb") as log:
            gw = subprocess.Popen(
                [PY, "-m", "gateway.cli.main", "serve", "--live", sim,
                 "--listen", f"127.0.0.1:{gw_port}", "--db", f"sqlite+aiosqlite:///{tmp}/gw.db"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env,
            )  # fmt: skip
        procs.append(gw)
        admin = f"http://127.0.0.1:{admin_port}"
        wait_http(f"http://127.0.0.1:{gw_port}/readyz")
        admin_call(admin, "POST", "/admin/candidates",
                   {"name": "fuzz-candidate", "url": sim, "sample_rate": 1.0})  # fmt: skip
        time.sleep(3)  # the registry poll
        pids = {"worker": gw.pid, **{f"child {p}": p for p in children(gw.pid)}}
        rss0 = {name: rss_kib(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        pf = fuzz_proxy(gw_port, args.proxy_seconds)
        proxy_s = time.monotonic() - t0
        rss1 = {name: rss_kib(pid) for name, pid in pids.items() if Path(f"/proc/{pid}").exists()}
        t0 = time.monotonic()
        st_code, st_out = (
            fuzz_admin(admin, args.admin_seconds, tmp) if args.admin_seconds else (0, "")
        )
        admin_s = time.monotonic() - t0
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", timeout=10)
        alive = gw.poll() is None and all(Path(f"/proc/{p}").exists() for p in pids.values())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    logged = log_path.read_text(errors="replace").splitlines()
    errors = [line for line in logged if '"level":"ERROR"' in line or "Traceback" in line]
    lines = [
        f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        "",
        f"- proxy port: {pf.examples:,} hypothesis examples in {proxy_s:.0f} s; statuses "
        + ", ".join(f"{s}: {n:,}" for s, n in sorted(pf.statuses.items()))
        + f"; closed without an answer: {pf.no_answer:,} (whole requests among them, answered "
        f"when asked again alone: {pf.answered_on_retry:,})",
        f"- proxy findings: {len(pf.findings)}",
    ]
    for what, data, out in pf.findings[:10]:
        lines.append(f"  - {what}: sent {data[:300]!r} -> {out[:300]!r}")
    admin_found, known = admin_failures(st_out)
    lines += [
        f"- admin port: schemathesis --checks all for {admin_s:.0f} s, exit {st_code}; "
        f"findings: {len(admin_found)}; verdict-override relation rules (known, 422 naming "
        f"`verdict`): {known}",
        *[f"  - {block[:400]}" for block in admin_found[:10]],
        "",
        "```",
        *[line for line in st_out.splitlines() if line.strip()][-40:],
        "```",
        "",
        "- memory (RSS KiB) before -> after the proxy fuzzing: "
        + ", ".join(f"{n}: {rss0[n]:,} -> {rss1.get(n, 0):,}" for n in rss0),
        f"- gateway and mirror process alive throughout: {alive}",
        f"- log lines at ERROR or with a traceback: {len(errors)}",
        *[f"  - {line[:300]}" for line in errors[:10]],
    ]
    print("\n".join(lines))
    shutil.rmtree(tmp, ignore_errors=True)
    ran = st_code in (0, 1)  # 1: failures, all listed above; anything else: it did not run
    return 1 if pf.findings or admin_found or errors or not alive or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
