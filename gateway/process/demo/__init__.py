"""`canary demo`: the whole loop — mirror, measure, decide — on one machine, in about a minute.

Starts six engine simulators (production, a `control` with production's profile, a `bi-kv`
candidate that keeps each session's KV cache, a `quantized` candidate whose answers sometimes
diverge, and an `upgrade` — a new checkpoint answering in its own words — with the simulator's
LLM grader, which has a planted position bias), a gateway in front of production with SQLite in
a temporary directory, and drives agent-like multi-turn sessions through it until every
candidate is promoted or rejected; the upgrade is decided by preference while exact match, had
it gated, would have rejected it. A promoted bi-kv is then ramped on live traffic; then the
reports.

By concept: `arms` (the engines, the config and margins it registers, the options),
`children` (the processes it starts and stops), `run` (drive until decided), `labeller` (the
simulated labeller of the upgrade's pairs, a stand-in for a person), `rollout` (the live
rollout of bi-kv), `story` (what it prints). Every process it starts is its own child; all are
stopped on exit, on error and on Ctrl-C.
"""

from gateway.process.demo.arms import DemoOptions
from gateway.process.demo.rollout import ROLLOUT_STEPS
from gateway.process.demo.run import run_demo

__all__ = ["ROLLOUT_STEPS", "DemoOptions", "run_demo"]
