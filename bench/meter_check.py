#!/usr/bin/env python3
"""Cross-check the gateway's meter on real vLLM: against the engine's own `/metrics` and
against `vllm bench serve` run through the gateway on the same traffic. Run by hand.

Engines must already run (e.g. ``bash /work/shared/real-engine/serve_vllm.sh``, or the four the
real-engine suite starts): ``--live`` without prefix caching and ``--candidate`` with it. The
script starts ``canary serve --live LIVE`` (SQLite in a temporary folder), registers the
candidate at sample rate 1 (so every production answer is stored), scrapes both engines'
``/metrics``, runs ``vllm bench serve --backend openai-chat`` through the gateway, scrapes
again, stops the gateway and prints one table: the same requests as the client (``bench
serve``), the gateway's meter (stored production observations) and the engine saw them.

    .venv/bin/python bench/meter_check.py --live http://127.0.0.1:8200 \\
        --candidate http://127.0.0.1:8201 --root /work/main/.real-engine

It needs only the standard library in this venv; ``vllm bench serve`` runs in vLLM's venv.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._shared.ports import free_port  # noqa: E402
from bench._shared.vllm_metrics import delta, scrape  # noqa: E402


def post(url: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(resp.status)


def wait_ready(url: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"gateway at {url} not ready")


def hist_mean(after: dict[str, float], before: dict[str, float], name: str) -> float | None:
    n = delta(after, before, name + "_count")
    return delta(after, before, name + "_sum") / n if n else None


def ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1000:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", required=True)
    ap.add_argument("--candidate", required=True, help="an engine with prefix caching")
    ap.add_argument("--root", default=str(REPO / ".real-engine"))
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", default="4")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--direct", action="store_true", help="also run bench serve straight to live")
    ap.add_argument("--out", default=None, help="folder for the results (default: a temp one)")
    args = ap.parse_args()
    root = Path(args.root)
    out = Path(args.out or tempfile.mkdtemp(prefix="canary-meter-check-"))
    out.mkdir(parents=True, exist_ok=True)
    db = out / "canary.db"
    port = free_port()
    gw = f"http://127.0.0.1:{port}"
    canary = str(Path(sys.executable).parent / "canary")
    log = (out / "gateway.log").open("wb")
    # Shedding and deduplication off for this check: it compares the meter with the client and
    # the engine on the same requests, so every production answer must be stored.
    env = dict(os.environ, CANARY_MIRROR_SHED_LOOP_LAG_MS="60000", CANARY_MIRROR_SHED_CPU_BUSY="0")
    env["CANARY_DEDUP_WINDOW_S"] = "0"  # bench serve repeats some prompts: store them all
    proc = subprocess.Popen(
        [canary, "serve", "--live", args.live, "--listen", f"127.0.0.1:{port}",
         "--db", f"sqlite+aiosqlite:///{db}", "--insecure-admin"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    try:
        wait_ready(gw)
        post(
            gw + "/admin/candidates",
            {"name": "bi-kv", "url": args.candidate, "kind": "bi-kv", "sample_rate": 1.0},
        )

        def bench(base_url: str, name: str) -> list[str]:
            return [
            str(root / "venv" / "bin" / "python"), str(REPO / "bench" / "vllm_cli.py"),
            "bench", "serve", "--backend", "openai-chat", "--base-url", base_url,
            "--endpoint", "/v1/chat/completions", "--model", "tiny-llama",
            "--tokenizer", str(root / "tiny-llama"), "--dataset-name", "random",
            "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--ignore-eos",
            "--num-prompts", str(args.num_prompts), "--request-rate", args.request_rate,
            "--seed", "1", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json",
            ]  # fmt: skip

        def run(base_url: str, name: str) -> float:
            t0 = time.monotonic()
            res = subprocess.run(
                bench(base_url, name), capture_output=True, text=True, check=False, cwd=out
            )
            (out / f"{name}.log").write_text(res.stdout + res.stderr)
            if res.returncode != 0:
                raise SystemExit(f"vllm bench serve failed:\n{(res.stdout + res.stderr)[-3000:]}")
            return time.monotonic() - t0

        if args.direct:  # the same prompts straight to live first, for the proxy's overhead
            run(args.live, "direct")
        live_before, cand_before = scrape(args.live), scrape(args.candidate)
        bench_s = run(gw, "bench")
        time.sleep(3)  # the last copies reach the candidate
        live_after, cand_after = scrape(args.live), scrape(args.candidate)
        # Who carried the answers' reads to the client: the relay, or the request's task.
        with urllib.request.urlopen(gw + "/metrics", timeout=10) as resp:
            exposition = resp.read().decode()
        reads = {
            line.split('path="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in exposition.splitlines()
            if line.startswith("canary_proxy_stream_reads_total{")
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    b = json.loads((out / "bench.json").read_text())
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        prod = list(conn.execute("SELECT * FROM observations WHERE arm = 'production'"))
        cand = list(conn.execute("SELECT * FROM observations WHERE arm = 'candidate'"))
    ttft = [r["ttft_s"] for r in prod if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in prod if r["tpot_s"] is not None]
    unresolved = sum(
        1 for r in prod if r["tpot_s"] is None and (r["output_tokens"] or 0) > 1 and r["ttft_s"]
    )
    gaps = [r for r in prod if r["inter_event_mean_s"] is not None]
    itl_n = sum(r["inter_event_count"] for r in gaps)
    itl_sum = sum(r["inter_event_mean_s"] * r["inter_event_count"] for r in gaps)
    finish: dict[str, int] = {}
    for r in prod:
        finish[str(r["finish_reason"])] = finish.get(str(r["finish_reason"]), 0) + 1
    e2e = [r["e2e_s"] for r in prod if r["e2e_s"] is not None]
    summary = {
        "requests": {
            "bench_completed": b.get("completed"),
            "gateway_production_ok": sum(1 for r in prod if r["error_kind"] is None),
            "engine_success": delta(live_after, live_before, "vllm:request_success_total"),
        },
        "output_tokens": {
            "bench": b.get("total_output_tokens"),
            # counted from the text by one tokenizer (the candidate's /tokenize): what gates
            "gateway_counted": sum(r["output_tokens"] or 0 for r in prod),
            "gateway_counted_answers": sum(1 for r in prod if r["output_tokens"] is not None),
            "gateway_counted_by": sorted({str(r["token_counter"]) for r in prod}),
            "gateway_usage": sum(r["usage_tokens"] or 0 for r in prod),  # the engine's usage
            "gateway_token_events": sum(r["token_events"] or 0 for r in prod),
            "engine": delta(live_after, live_before, "vllm:generation_tokens_total"),
        },
        "finish_reasons": {"gateway": finish, "expected": {"length": args.num_prompts}},
        "stream_reads": reads,
        "ttft_mean_s": {
            "bench": b["mean_ttft_ms"] / 1000,
            "gateway": statistics.fmean(ttft),
            "engine": hist_mean(live_after, live_before, "vllm:time_to_first_token_seconds"),
        },
        "ttft_median_s": {
            "bench": b["median_ttft_ms"] / 1000,
            "gateway": statistics.median(ttft),
        },
        "tpot_mean_s": {
            "bench": b["mean_tpot_ms"] / 1000,
            "gateway": statistics.fmean(tpot) if tpot else None,
            "engine": hist_mean(
                live_after, live_before, "vllm:request_time_per_output_token_seconds"
            ),
        },
        "inter_event_mean_s": {
            "bench": b["mean_itl_ms"] / 1000,
            "gateway": itl_sum / itl_n if itl_n else None,
            "engine": hist_mean(live_after, live_before, "vllm:inter_token_latency_seconds"),
        },
        "e2e_mean_s": {
            "bench": b["mean_e2el_ms"] / 1000,
            "gateway": statistics.fmean(e2e),
            "engine": hist_mean(live_after, live_before, "vllm:e2e_request_latency_seconds"),
        },
        "tpot_unresolved": unresolved,
        "prefix_cache": {
            "gateway_cached_tokens": sum(r["cached_tokens"] or 0 for r in cand),
            "engine_hits": delta(cand_after, cand_before, "vllm:prefix_cache_hits_total"),
            "engine_queries": delta(cand_after, cand_before, "vllm:prefix_cache_queries_total"),
        },
        "bench_s": bench_s,
        "out": str(out),
    }
    if args.direct:
        d = json.loads((out / "direct.json").read_text())
        for key, field in (
            ("ttft_mean_s", "mean_ttft_ms"),
            ("ttft_median_s", "median_ttft_ms"),
            ("tpot_mean_s", "mean_tpot_ms"),
            ("inter_event_mean_s", "mean_itl_ms"),
            ("e2e_mean_s", "mean_e2el_ms"),
        ):
            row = summary[key]
            assert isinstance(row, dict)
            row["direct"] = d[field] / 1000
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print("\n| quantity | bench serve direct | bench serve via gateway | gateway meter | engine |")
    print("|---|---:|---:|---:|---:|")
    for key in (
        "ttft_mean_s", "ttft_median_s", "tpot_mean_s", "inter_event_mean_s", "e2e_mean_s"
    ):  # fmt: skip
        row = summary[key]
        assert isinstance(row, dict)
        print(f"| {key[:-2]} (ms) | {ms(row.get('direct'))} | {ms(row.get('bench'))} "
              f"| {ms(row.get('gateway'))} "
              f"| {ms(row.get('engine'))} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
