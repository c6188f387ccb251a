"""What the demo runs and registers: its simulated engines (production, the candidates and the
upgrade's LLM grader), the gateway's config with each candidate's margins, and the options.

The margins are the demo's own, loosened so that a minute of traffic decides (each says why);
a real deployment keeps the defaults. Nothing here starts a process (children.py) or prints
(story.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import msgspec


class DemoOptions(msgspec.Struct, kw_only=True):
    sessions: int = 0  # > 0: exactly this many, no looking; 0: until every verdict is decided
    max_sessions: int = 600  # the cap when driving until decided
    batch: int = 20  # sessions between two looks
    turns: int = 6
    concurrency: int = 16
    time_scale: float = 0.25
    keep: bool = False
    out_dir: str = "canary-reports"
    seed: int = 0
    step_dwell_s: float = 3.0  # each ramp step's minimum dwell (the rollout's min_step_s)
    fail_at_step: int = 0  # > 0: kill bi-kv's simulator when the ramp reaches this step (1-based)


class Engine(NamedTuple):
    """A simulated engine of the demo: `canary sim --profile <profile> <extra>`."""

    name: str
    profile: str
    extra: tuple[str, ...]
    kind: str | None  # the candidate's kind; None: not a candidate (production, the grader)
    time_factor: float = 1.0  # its delays: the demo's --time-scale times this
    price: float = 2.0  # USD per hour (candidates)


# The LLM grader answers one short JSON verdict per call, one call at a time (the mirror's one
# grading task): a fiftieth of an engine's delays (its prefill of a long grading prompt) lets
# it keep up with the demo's traffic.
GRADER_TIME_FACTOR = 0.02

# The serving engines prefill at half the simulator's default speed (0.1 ms a token: a
# larger model): the demo's agents answer with up to three calls a turn, and during the ramp
# bi-KV decodes its live half beside the copies still mirrored to it; the session KV it keeps
# saves enough prefill to stay ahead of production end to end, as on a real deployment where
# reuse pays.
PREFILL = ("--prefill-scale", "2")

ENGINES: tuple[Engine, ...] = (
    Engine("live", "baseline", PREFILL, None),
    Engine("control", "control", PREFILL, "control"),
    Engine("bi-kv", "bi-kv", PREFILL, "bi-kv"),
    Engine(
        "quantized",
        "quantized",
        # Its answers sometimes diverge, and a fifth of its call answers break their
        # arguments (a required one missing, a wrong type): rejected on tool-call validity.
        (*PREFILL, "--divergence", "0.3", "--logprob-shift", "0.1", "--break-calls", "0.2"),
        "quantized",
        price=1.2,
    ),
    # A new checkpoint: every answer in its own words (planted quality difference: none).
    Engine("upgrade", "upgrade", PREFILL, "model-upgrade"),
    # Its grader: indifferent between the two styles, picks the answer shown first 25 % of the
    # time (a planted position bias the report must measure).
    Engine("grader", "grader", (), None, time_factor=GRADER_TIME_FACTOR),
)
CANDIDATES = tuple(e for e in ENGINES if e.kind is not None)

# Candidates whose verdicts the demo waits for (the control's is the noise floor, not a goal).
DECIDING = ("bi-kv", "quantized", "upgrade")
DECIDED = ("promote", "reject")
UPGRADE = "upgrade"

# The upgrade's preference margin and grading, sized with `canary plan --graded`. About two
# thirds of the demo's turns are tool calls, graded like text turns (the grader is shown the
# calls and the declared tools); half the pairs graded leaves ~3 graded pairs a session, each
# graded both ways (the position bias cancels within a pair): a
# session's score varies with an sd near 0.45 (measured: 437 graded sessions gave an interval
# of +-7.5 pp). At 20 pp the plan needs ~95 graded sessions, which the demo's 160-340 sessions
# hold with the grader's lag; 15 pp needs ~180 and the default 5 pp ~1,760 (hours of traffic).
PREFERENCE_DELTA = 0.20
GRADER_RATE = 0.5  # half the pairs: the one grading task keeps up with the demo's traffic
GRADER_SWAP_RATE = 1.0
GRADER_SESSION_SD = 0.45
GRADER_PRICE_PER_MTOK = 0.2
GRADING_DEADLINE_S = 20.0
# A quarter of the graded sessions kept for people: the demo's simulated labeller labels their
# pairs (~40-80 sessions, ~3 graded pairs each) as they are graded, ten a second at most.
LABEL_RATE = 0.25

CONFIG_TEMPLATE = """\
# Written by `canary demo`: a gateway in front of a simulated production engine, with four
# simulated candidates mirrored whole sessions at a time (one of them graded by an LLM grader).
[server]
listen = "127.0.0.1:{gateway_port}"
log_format = "json"

[live]
url = "{live_url}"
price_per_hour_usd = 2.0

[storage]
db_url = "sqlite+aiosqlite:///{db_path}"
registry_poll_interval_s = 1.0
counters_flush_interval_s = 1.0

[admin]
insecure = true

[reports]
# The demo asks for the candidates' verdicts between batches of sessions; beside six busy
# simulators an idle-priority report process would answer late (keep "idle" in production).
priority = "normal"

[mirror]
# Seven processes share this machine's cores, so scheduling delays show up as event-loop lag
# and the gateway may use a whole core; production here is a simulator, so the demo's loop
# guard tolerates more lag and no CPU limit (in a real deployment keep the defaults).
shed_loop_lag_ms = 250.0
shed_cpu_busy = 0.0
# The mirror process meters the candidates' answers; at idle priority, beside the busy
# simulators, its wake-ups land late and every candidate TTFT carries that delay. The demo's
# production is a simulator, so the mirror runs at normal priority here (keep "idle" in a real
# deployment, where the engines are not on the gateway's cores).
priority = "normal"
# Scoring copies (the quantized candidate and the control score production's answers): a few
# at once per simulator, so scoring keeps up with the demo's traffic.
score_concurrency = 4
# The control's /tokenize counts every arm's answers, text and each tool call's name and
# arguments (a piece each): an observation is stored once counted, so the demo lets 16 pieces be
# counted at once where a real deployment would use token_counter = "local:<tokenizer.json>".
tokenize_concurrency = 16
# The upgrade's pairs wait for its grader together: 16 sessions in flight and a burst of
# queued gradings fit in 2,000 (the default 256 would drop pairs in the demo's bursts).
grading_max_pending = 2000

[rollout]
# The demo's ramp dwells a few seconds per step: the controller judges every second (default
# 2 s) so that the 100 % step completes soon after its dwell.
controller_interval_s = 1.0
{candidates}"""

CANDIDATE_TEMPLATE = """
[[candidates]]
name = "{name}"
url = "{url}"
kind = "{kind}"
sample_rate = 1.0
sampling = "session"
concurrency = 16
{scoring}price_per_hour_usd = {price}
# 100 sessions can show a rate within about 3.7/100 ≈ 4 pp at best (sessions are the unit of
# independence); the defaults (0.5 pp failures, 1 pp agreement and tool-call validity) need
# ~750 / ~375 / ~375 sessions.
# The demo accepts 5 pp so that it can decide within a minute; and its simulators share
# this machine's cores with the gateway, so their timings carry scheduling noise that a real
# engine's would not (TPOT of the KV-keeping simulator moves with its batch): latency gets a
# 20 % margin, under the 25 % critical one.
[candidates.verdict]
latency_delta = 1.2
error_delta = 0.05
error_critical = 0.1
slo_exceedance_delta = 0.05
agreement_delta = 0.05
similarity_delta = 0.05
# Tool-call validity, the same 5 pp (its critical margin with it: a reject at the first look
# that shows harm beyond it).
tool_validity_delta = 0.05
tool_validity_critical = 0.05
# The ramp (docs/rollout.md): at the demo's ~9 new sessions a second, a 5 % step would need 600
# sessions for its candidate arm to reach the 30 a test needs, so 1 % and 5 % are smoke steps
# of min_step_s and the dwells are sized from 25 % on; and its failure dwell is sized for a
# candidate failing half its sessions (a dead engine; the guards stop that at once anyway), not
# +3 pp, which at this demo's zero background failures needs ~900 sessions at 25 %.
ramp_ttft_from = 25.0
ramp_failure_harm = 0.5
{extra}"""

# The quantized candidate scores half its pairs (its default, 0.1, leaves a one-minute demo
# with too few scored pairs to decide `logprob_divergence`).
SCORING = {"quantized": "score_rate = 0.5\n"}

GRADED_TEMPLATE = f"""\
# A model upgrade gates quality on preference: the candidate may lose at most
# {PREFERENCE_DELTA:.0%} net (a demo-sized margin: the default 5 pp needs ~1,760 graded sessions
# here).
preference_delta = {PREFERENCE_DELTA}
# The simulated grader answers within seconds and its queue drains as the demo's batches end,
# so a graded session's unit may close {GRADING_DEADLINE_S:g} s after its idle gap (the
# default, 900 s, allows for a real grader slowed or backed up for minutes); a verdict stored
# later is late, not used.
grading_deadline_s = {GRADING_DEADLINE_S}

# Its LLM grader, the simulator's. Every graded pair in both orders; half of the pairs; no cap
# that the demo's traffic could reach; a price so that the report states a cost.
[candidates.grader]
url = "{{grader_url}}"
model = "sim-model"
rate = {GRADER_RATE}
swap_rate = {GRADER_SWAP_RATE}
max_per_minute = 1000000
# Agent contexts are long (tool results): ~2,600 tokens a grading, past the default 2 M a day
# within the demo's minute of traffic.
daily_token_budget = 1000000000
price_per_mtok = {GRADER_PRICE_PER_MTOK}
# Sessions kept for people to label (the demo's simulated labeller stands in for them).
label_rate = {LABEL_RATE}
"""


def write_config(path: Path, gateway_port: int, urls: dict[str, str], db_path: Path) -> None:
    """The gateway's config: production, then every candidate with its margins."""
    candidates = "".join(
        CANDIDATE_TEMPLATE.format(
            name=e.name,
            url=urls[e.name],
            kind=e.kind,
            price=e.price,
            scoring=SCORING.get(e.name, ""),
            extra=GRADED_TEMPLATE.format(grader_url=urls["grader"]) if e.name == UPGRADE else "",
        )
        for e in CANDIDATES
    )
    path.write_text(
        CONFIG_TEMPLATE.format(
            gateway_port=gateway_port,
            live_url=urls["live"],
            db_path=db_path,
            candidates=candidates,
        )
    )
