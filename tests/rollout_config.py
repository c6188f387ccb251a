"""The gateway config of the rollout tests that run a whole `canary serve` in front of a
production engine and the `bi-kv` candidate (tests/process/test_rollout_e2e.py on simulators,
tests/real_engine/test_real_rollout.py on real vLLM). Holds no tests.
"""

from __future__ import annotations


def rollout_config(candidate_url: str) -> str:
    """The registry's poll, the rollout controller's interval, and the candidate `bi-kv` at
    `candidate_url` with `sample_rate = 0` (no mirrored copy reaches it: every request its
    engine serves is one it served for a client), as TOML; production's URL is the caller's."""
    return f"""
registry_poll_interval_s = 0.2

[rollout]
controller_interval_s = 0.5

[[candidates]]
name = "bi-kv"
url = "{candidate_url}"
kind = "bi-kv"
sample_rate = 0.0
# Every split step sized (1 % too: 3,000 sessions for 30 on the candidate's arm), so the
# controller never advances a step before the test's own hand advance; it still completes 100 %.
[candidates.verdict]
ramp_ttft_from = 0.0
"""
