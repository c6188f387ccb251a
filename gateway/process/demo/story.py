"""What the demo tells: the candidates it runs and why the upgrade's margin is what it is, each
candidate's report (text on the terminal, HTML in the out dir), the model upgrade's decision by
preference beside what exact match would have done, and the URLs left running under --keep.

Pure formatting over reports and plans, plus the printing; it starts and stops nothing.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from evaluators.judge.metric import MetricResult
from evaluators.judge.preference_plan import preference_plan
from evaluators.report.model import Report
from gateway.control.admin.ui import PAGE_PATH
from gateway.process.demo.arms import (
    DECIDING,
    GRADER_PRICE_PER_MTOK,
    GRADER_RATE,
    GRADER_SESSION_SD,
    GRADER_SWAP_RATE,
    PREFERENCE_DELTA,
    UPGRADE,
)

# The preference test's error rate in the plan the demo quotes (the verdict's default alpha).
_PLAN_ALPHA = 0.05


def planted_position_bias() -> tuple[float, float]:
    """The grader profile's planted position bias: the chance it picks the answer shown first
    whatever they say, and what the report measures from it (among decisive verdicts the share
    won by the first-shown answer, minus one half; an indifferent grader's other decisive
    verdicts split evenly)."""
    from gateway.sim.profiles import get_profile

    g = get_profile("grader")
    first, decisive_other = g.grader_first, (1.0 - g.grader_first) * (1.0 - g.grader_tie)
    return first, (first + decisive_other / 2) / (first + decisive_other) - 0.5


def _pp(x: float | None) -> str:
    """A share or a difference of shares in percentage points."""
    return "n/a" if x is None else f"{x * 100:+.1f} pp"


def _interval(m: MetricResult) -> str:
    return f"[{_pp(m.ci_low)}, {_pp(m.ci_high)}]"


def candidates_lines(turns: int) -> list[str]:
    """The candidates, and the upgrade's margin with the graded sessions the plan says it needs
    at this demo's size (and at the default 5 pp, for contrast)."""
    plans = preference_plan(
        (PREFERENCE_DELTA, 0.05),
        alpha=_PLAN_ALPHA,
        sd=GRADER_SESSION_SD,
        pairs_per_session=turns * GRADER_RATE,
        swap_rate=GRADER_SWAP_RATE,
        price_per_mtok=GRADER_PRICE_PER_MTOK,
    )
    demo, default = (p.sessions for p in plans)
    first, _ = planted_position_bias()
    need = f"~{demo:,}" if demo else "more than the plan's horizon of"
    strict = f"~{default:,}" if default else "more than the plan's horizon of"
    pp = f"{PREFERENCE_DELTA * 100:g} pp"
    return [
        "candidates: control (same profile as production), bi-kv (keeps session KV), quantized,",
        "  and upgrade: a new checkpoint answering every turn in its own words, judged by an LLM",
        "  grader (the simulator's: indifferent between the two, but it picks the answer shown",
        f"  first {first:.0%} of the time); {GRADER_RATE:.0%} of its pairs graded, each in both "
        "orders",
        f"upgrade's margin: it may lose at most {pp} of net preference, a margin this demo's",
        f"  size can show: `canary plan --rate 30 --sample-rate 1 --turns {turns} --graded "
        f"--preference-delta {PREFERENCE_DELTA:g}",
        f"  --swap-rate {GRADER_SWAP_RATE:g} --grader-rate {GRADER_RATE:g} --grader-sd "
        f"{GRADER_SESSION_SD:g}` says {need} graded sessions (the default 5 pp: {strict})",
    ]


def decided_by_preference(report: Report) -> bool:
    """Whether the report's verdict is the preference metric's (promote inside its margin, or
    reject beyond it), not latency's or failures'."""
    pref = report.metrics.get("preference")
    if pref is None:
        return False
    if report.verdict == "promote":
        return pref.status == "inside"
    if report.verdict == "reject":
        return pref.status in ("beyond", "critical")
    return False


def exact_match_would_reject(exact: MetricResult) -> bool:
    """Gating (as for a candidate without a grader, at the demo's planned final look), would
    exact match have rejected? Its interval lies wholly beyond its margin."""
    bound = exact.margin if exact.margin is not None else exact.critical_margin
    return exact.ci_low is not None and bound is not None and exact.ci_low > bound


def upgrade_lines(report: Report) -> list[str]:
    """The model upgrade's decision by preference, its grader's position bias, and exact match's
    verdict, had it gated."""
    pref = report.metrics.get("preference")
    if pref is None:
        return [f"{UPGRADE}: no preference metric in its report (no grader?)"]
    how = "decided by preference" if decided_by_preference(report) else "not by preference"
    graded = pref.detail.get("pairs_graded")
    out = [
        f"{UPGRADE} (model-upgrade): {report.verdict.upper()}, {how}: net preference "
        f"{_pp(pref.estimate)} {_interval(pref)} over {pref.units or 0:,} graded sessions "
        f"({graded or 0:,} graded pairs), margin -{(pref.margin or 0) * 100:g} pp: {pref.status}",
    ]
    bias = report.metrics.get("grader_position_bias")
    if bias is not None and bias.estimate is not None:
        planted = planted_position_bias()[1]
        out.append(
            f"  the grader's position bias: {_pp(bias.estimate)} {_interval(bias)} over "
            f"{bias.n:,} decisive verdicts (planted {_pp(planted)}); each pair is graded in both "
            "orders, so it does not move the net preference"
        )
    exact = report.metrics.get("exact_match")
    if exact is not None and exact.estimate is not None:
        would = (
            "gating, it would have REJECTED the upgrade"
            if exact_match_would_reject(exact)
            else "gating, it would not have rejected the upgrade"
        )
        out.append(
            f"  exact match (information for a graded candidate): answers differing from "
            f"production {_pp(exact.estimate)} over the noise floor {_interval(exact)}, margin "
            f"{_pp(exact.margin)}; {would}"
        )
    return out


def _write_report(out_dir: Path, name: str, ext: str, body: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.{ext}"
    path.write_text(body, encoding="utf-8")
    return path.resolve()


async def print_reports(db_url: str, out_dir: Path, until: float | None) -> int:
    """Every deciding candidate's report at the planned final look, then the upgrade's story."""
    from evaluators.judge.settings import VerdictSettings
    from evaluators.report.build import evaluate
    from evaluators.report.render import render
    from storage.engine import make_engine

    engine = make_engine(db_url)
    upgrade: Report | None = None
    try:
        for name in DECIDING:
            # The demo's traffic is over: this is its planned final look.
            report = await evaluate(
                engine, name, until=until, settings=VerdictSettings(), planned_look=True
            )
            print()
            print(render(report, "text"))
            html_path = _write_report(out_dir, name, "html", render(report, "html"))
            _write_report(out_dir, name, "json", render(report, "json"))
            print(f"HTML report: {html_path} (JSON beside it)")
            if name == UPGRADE:
                upgrade = report
    finally:
        await engine.dispose()
    if upgrade is not None:
        print()
        print("\n".join(upgrade_lines(upgrade)))
    return 0


async def keep_running(gateway: str, urls: dict[str, str], config: Path, db: Path) -> int:
    db_url = f"sqlite+aiosqlite:///{db}"
    print(
        f"""
Everything is still running (Ctrl-C stops it all):
  gateway      {gateway}   (metrics: {gateway}/metrics, admin: {gateway}/admin/status)
  live page    {gateway}/admin{PAGE_PATH}   (open it in a browser: no token on loopback)
  production   {urls["live"]}
  candidates   control {urls["control"]}, bi-kv {urls["bi-kv"]}, quantized {urls["quantized"]},
               upgrade {urls["upgrade"]} (graded by {urls["grader"]})
  config       {config}

Try:
  canary candidates list --admin-url {gateway}
  canary candidates show bi-kv --admin-url {gateway}
  canary report bi-kv --db {db_url}
  canary report quantized --db {db_url} --planned-look --format html --out quantized.html
  canary report upgrade --db {db_url}
  curl -s {gateway}/admin/candidates/bi-kv/gate
  canary promote bi-kv --admin-url {gateway} --reason "demo"
  canary rollback --admin-url {gateway}
""",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stopping...")
    return 0
