"""`canary sim`: run the vLLM-compatible engine simulator in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from domain.errors import EXIT_OK, UsageError

# Static so that `canary --help` needs no import of the simulator; a test checks it lists every
# profile in gateway.sim.profiles.PROFILES.
_EPILOG = """\
profiles:
  baseline          production today: no prefix cache; prefill 0.05 ms/token, decode 8 ms/token
                    + 0.5 ms per other running sequence, lognormal jitter sigma 0.08
  control           the baseline under another name (an A/A control)
  bi-kv             baseline + per-session KV kept between turns + an 8192-block prefix cache
  quantized         decode 0.6x as long, 30 % of answers diverge from the baseline's
  upgrade           a model upgrade: the baseline's speed, every answer in its own words
  grader            an LLM grader (pairwise json_schema requests, docs/grading.md):
                    indifferent between the styles, picks the first answer 25 % of the time
  fast              no delays at all (for benchmarks of the gateway)
  hang              reads the request, never answers
  reset-mid-stream  sends a few chunks, then resets the TCP connection
  error-500         answers 500 with an OpenAI error body
  slow-drip         one chunk per second
  garbage           200 text/event-stream carrying random non-SSE bytes
  slow-read         reads its request one byte at a time, then answers normally

Answers at temperature 0 depend only on the prompt, so every profile gives the same text
(except quantized's diverging ones and upgrade's own words). Observability for tests:
GET /sim/stats, GET /sim/requests, POST /sim/reset.
"""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "sim",
        help="run the vLLM-compatible engine simulator (no GPU needed)",
        description=(
            "Serve a simulated vLLM engine: OpenAI-compatible routes (/v1/chat/completions,\n"
            "/v1/completions, /v1/embeddings, /v1/models, /tokenize, /health), a latency model,\n"
            "prefix and session KV caches, deterministic answers and optional fault injection.\n"
            "Runs in the foreground until Ctrl-C."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--profile", default="baseline", help="named profile (see below)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the latency noise")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="X",
        help="multiply every delay by X (e.g. 0.1 for a 10x faster engine)",
    )
    parser.add_argument(
        "--divergence",
        type=float,
        default=None,
        metavar="P",
        help="probability that an answer diverges from the baseline's (0..1)",
    )
    parser.add_argument(
        "--logprob-shift",
        type=float,
        default=None,
        metavar="NATS",
        help="lower every prompt token's logprob by NATS when scoring (quantized: 0.1)",
    )
    parser.add_argument(
        "--break-calls",
        type=float,
        default=None,
        metavar="P",
        help=(
            "share of call answers whose arguments are wrong (a required argument missing, a"
            " wrong type, an enum value outside the set, not JSON), drawn per request (0..1)"
        ),
    )
    parser.add_argument(
        "--prefill-scale",
        type=float,
        default=None,
        metavar="X",
        help=(
            "multiply the profile's prefill time per uncached prompt token by X (e.g. 4: a "
            "model 4x slower to prefill, where reusing a session's KV saves more)"
        ),
    )
    parser.add_argument(
        "--tokens-per-event",
        type=int,
        default=None,
        metavar="K",
        help=(
            "pack 1..K tokens into each SSE event at random, as a busy vLLM API server does "
            "(default 1: one token per event)"
        ),
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="served model name; repeat for several (default sim-model)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.sim.profiles import get_profile

    overrides: dict[str, Any] = {}
    if args.time_scale is not None:
        overrides["time_scale"] = args.time_scale
    if args.divergence is not None:
        overrides["divergence"] = args.divergence
    if args.logprob_shift is not None:
        overrides["logprob_shift"] = args.logprob_shift
    if args.break_calls is not None:
        overrides["break_calls"] = args.break_calls
    if args.tokens_per_event is not None:
        overrides["max_tokens_per_event"] = args.tokens_per_event
    if args.prefill_scale is not None:
        if not 0 < args.prefill_scale <= 100:
            raise UsageError(f"--prefill-scale must be in (0, 100], got {args.prefill_scale}")
        base = get_profile(args.profile).prefill_s_per_token
        overrides["prefill_s_per_token"] = base * args.prefill_scale
    if args.models:
        overrides["served_model_names"] = tuple(args.models)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    profile = get_profile(args.profile, **overrides)

    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(profile, args.host, args.port, args.seed))
    else:
        uvloop.run(_serve(profile, args.host, args.port, args.seed))
    return EXIT_OK


async def _serve(profile: Any, host: str, port: int, seed: int) -> None:
    from gateway.sim.server import start_sim

    try:
        server = await start_sim(profile, host=host, port=port, seed=seed)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(signum, stop.set)
    models = ", ".join(profile.served_model_names)
    print(f"canary sim: profile {profile.name} serving {models} on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
    print("canary sim: stopped", file=sys.stderr)
