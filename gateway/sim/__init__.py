"""A vLLM-compatible engine simulator: the live endpoint and the candidates of the demo, the
tests and the benchmarks, without a GPU.

`profiles` holds the knobs and named profiles, `engine` the pure core (tokenizer, KV caches,
latency model, deterministic answers, prompt logprobs), `calls` the agent's tool calls (parallel
calls, broken arguments on request), `protocol` the OpenAI/vLLM JSON and SSE shapes, `generate`
the completion routes, `responses` the Responses API route (`/v1/responses`), `faults` the
injected failures, `server` the app and `start_sim`, `state` per-app state, `grader` pairwise
verdicts as an LLM grader and `workload` agent-like client traffic.
Importing this package stays free of aiohttp: the server names load on first use.
"""

from __future__ import annotations

from typing import Any

from gateway.sim.profiles import PROFILES, SimProfile, get_profile

__all__ = ["PROFILES", "SimProfile", "SimServer", "build_sim_app", "get_profile", "start_sim"]


def __getattr__(name: str) -> Any:
    if name in ("SimServer", "build_sim_app", "start_sim"):
        from gateway.sim import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
