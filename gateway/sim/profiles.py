"""Named configurations of the engine simulator.

A `SimProfile` holds every knob of the simulated engine: the latency model, the KV caches, how
often its answers diverge from the baseline's, and which fault (if any) it injects. Profiles are
frozen and validated on construction; `get_profile` is the one way to look one up by name and
override knobs (the CLI's `--time-scale`, tests' small delays).

Latency defaults are of the order of an 8B-class model on one modern GPU: 0.05 ms of prefill per
uncached prompt token, 8 ms per decode step plus 0.5 ms for every other sequence in the batch.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.errors import UsageError

FAULTS: tuple[str, ...] = (
    "hang",  # reads the request, never answers until the client goes away
    "reset-mid-stream",  # headers and a few chunks, then a TCP reset
    "error-500",  # an OpenAI-shaped 500
    "slow-drip",  # one chunk per `slow_drip_s_per_chunk`
    "garbage",  # 200 text/event-stream carrying random non-SSE bytes
    "slow-read",  # reads its request one byte at a time, then answers normally
)


class SimProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every knob of one simulated engine. All delays are in seconds before `time_scale`."""

    name: str = "baseline"
    # Latency model.
    # Per uncached prompt token: 20k tokens a second, an 8B-class model on one H100 (an agent's
    # 10k-token context then costs 0.2 s of TTFT uncached).
    prefill_s_per_token: float = 0.00005
    decode_s_per_token: float = 0.008  # base decode step
    decode_s_per_extra_seq: float = 0.0005  # added per other sequence decoding concurrently
    overhead_s: float = 0.002  # scheduling + detokenisation, added once to every TTFT
    jitter: float = 0.08  # sigma of multiplicative lognormal noise on every delay (seeded)
    time_scale: float = 1.0  # multiplies every delay; tests use small values
    # Capacity: requests beyond `max_num_seqs` queue for a slot, which shows up in TTFT.
    max_num_seqs: int = 256
    max_model_len: int = 32768  # an agent's context outgrows 8k within ten turns
    served_model_names: tuple[str, ...] = ("sim-model",)
    # KV caches.
    prefix_cache_blocks: int = 0  # LRU capacity in 16-token blocks (0 = no prefix cache)
    session_kv: bool = False  # bi-kv: keep each session's KV between turns
    session_kv_max_sessions: int = 4096  # bound on the sessions whose KV is retained
    # Token ids of chat messages kept between turns (engine.TokenCache): a turn re-sends its
    # whole conversation, and only its new messages are tokenized. 1024 holds every message
    # of a few dozen agent sessions in flight (~8 MB at 2k tokens a message); older ones fall
    # off (counted) and are tokenized again if they come back.
    token_cache_messages: int = 1024
    # Answers.
    divergence: float = 0.0  # probability an answer diverges from the baseline's
    min_output_tokens: int = 16
    max_output_tokens: int = 64
    # SSE events: each carries 1..max_tokens_per_event tokens at random (1 = one token per
    # event). Real vLLM packs several tokens into one event whenever its engine runs ahead of
    # its API server's stream; an A/A with packing on shows that tokens are counted, not events.
    max_tokens_per_event: int = 1
    # Scoring (prompt logprobs, gateway/sim/engine.py): whether the engine answers them (False:
    # an older engine, 400), the most top-k it allows (vLLM's max_logprobs), and how many nats
    # each prompt token's logprob is lowered by (a quantized checkpoint's damage; 0 = baseline).
    prompt_logprobs: bool = True
    max_logprobs: int = 20
    logprob_shift: float = 0.0
    # The share of call answers with wrong arguments (gateway.sim.calls.BREAKS: a required
    # argument missing, a wrong type, an enum value outside the set, not JSON), drawn from the
    # prompt hash so reruns agree; 0 for production and the control.
    break_calls: float = 0.0
    # A model upgrade: every answer in its own words (gateway.sim.engine.NEW_WORDS).
    rephrase: bool = False
    # As an LLM grader (a pairwise request with a json_schema response_format, gateway.sim.grader):
    # pick the answer shown first with probability grader_first; else tie with probability
    # grader_tie; else prefer the upgrade's words with probability grader_prefers_new. The net
    # preference it plants for an upgrade: (1 - first)(1 - tie)(2 prefers_new - 1).
    grader_first: float = 0.0
    grader_tie: float = 0.2
    grader_prefers_new: float = 0.5
    # Faults.
    fault: str | None = None
    slow_drip_s_per_chunk: float = 1.0
    slow_read_s_per_byte: float = 0.001

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("profile name must not be empty")
        if self.fault is not None and self.fault not in FAULTS:
            raise UsageError(f"unknown fault {self.fault!r}; valid faults: {', '.join(FAULTS)}")
        for key in (
            "divergence",
            "break_calls",
            "grader_first",
            "grader_tie",
            "grader_prefers_new",
        ):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise UsageError(f"{key} must be in [0, 1], got {getattr(self, key)}")
        delays = {
            "prefill_s_per_token": self.prefill_s_per_token,
            "decode_s_per_token": self.decode_s_per_token,
            "decode_s_per_extra_seq": self.decode_s_per_extra_seq,
            "overhead_s": self.overhead_s,
            "jitter": self.jitter,
            "time_scale": self.time_scale,
            "slow_drip_s_per_chunk": self.slow_drip_s_per_chunk,
            "slow_read_s_per_byte": self.slow_read_s_per_byte,
            "logprob_shift": self.logprob_shift,
        }
        for key, value in delays.items():
            if not value >= 0.0:  # also rejects NaN
                raise UsageError(f"{key} must be >= 0, got {value}")
        if self.token_cache_messages < 0:
            raise UsageError("token_cache_messages must be >= 0")
        if self.prefix_cache_blocks < 0 or self.session_kv_max_sessions < 1:
            raise UsageError("prefix_cache_blocks must be >= 0 and session_kv_max_sessions >= 1")
        if self.max_num_seqs < 1 or self.max_model_len < 16:
            raise UsageError("max_num_seqs must be >= 1 and max_model_len >= 16")
        if not 1 <= self.min_output_tokens <= self.max_output_tokens:
            raise UsageError("need 1 <= min_output_tokens <= max_output_tokens")
        if not 1 <= self.max_tokens_per_event <= 64:
            raise UsageError("max_tokens_per_event must be in [1, 64]")
        if not self.served_model_names:
            raise UsageError("served_model_names must name at least one model")


_BASELINE = SimProfile(name="baseline")

PROFILES: dict[str, SimProfile] = {
    # Production as it runs today: no prefix caching, plain fp16 weights.
    "baseline": _BASELINE,
    # The same configuration under another name: an A/A control that must come out "no change".
    "control": msgspec.structs.replace(_BASELINE, name="control"),
    # Bi-directional KV transfer: each session's KV is kept between turns, and a shared
    # automatic prefix cache holds 8192 blocks (131k tokens).
    "bi-kv": msgspec.structs.replace(
        _BASELINE, name="bi-kv", session_kv=True, prefix_cache_blocks=8192
    ),
    # A quantized checkpoint: decode 0.6× as long, prefill a little faster, 30 % of answers
    # drift away from the baseline's at some token, and every token is 0.1 nats less likely.
    "quantized": msgspec.structs.replace(
        _BASELINE,
        name="quantized",
        prefill_s_per_token=0.0000375,
        decode_s_per_token=0.0048,
        decode_s_per_extra_seq=0.0003,
        divergence=0.3,
        logprob_shift=0.1,
    ),
    # A model upgrade (a new checkpoint): the baseline's speed, every answer in other words.
    "upgrade": msgspec.structs.replace(_BASELINE, name="upgrade", rephrase=True),
    # An LLM grader serving pairwise verdicts, indifferent between the styles but picking the
    # answer shown first a quarter of the time (a typical position bias).
    "grader": msgspec.structs.replace(_BASELINE, name="grader", grader_first=0.25),
    # No delays at all, for benchmarks of the gateway itself.
    "fast": msgspec.structs.replace(
        _BASELINE,
        name="fast",
        prefill_s_per_token=0.0,
        decode_s_per_token=0.0,
        decode_s_per_extra_seq=0.0,
        overhead_s=0.0,
        jitter=0.0,
        max_num_seqs=65536,
    ),
}
for _fault in FAULTS:
    PROFILES[_fault] = msgspec.structs.replace(_BASELINE, name=_fault, fault=_fault)


def get_profile(name: str, **overrides: Any) -> SimProfile:
    """Return the named profile with `overrides` applied (the name itself stays unless given).

    Raises `UsageError` naming the valid profiles (unknown name) or fields (unknown knob), or
    saying which knob is out of range.
    """
    try:
        base = PROFILES[name]
    except KeyError:
        raise UsageError(
            f"unknown sim profile {name!r}; valid profiles: {', '.join(PROFILES)}"
        ) from None
    if not overrides:
        return base
    unknown = sorted(set(overrides) - set(SimProfile.__struct_fields__))
    if unknown:
        raise UsageError(
            f"unknown SimProfile field(s) {', '.join(unknown)}; "
            f"valid fields: {', '.join(SimProfile.__struct_fields__)}"
        )
    if "served_model_names" in overrides:
        overrides["served_model_names"] = tuple(overrides["served_model_names"])
    return msgspec.structs.replace(base, **overrides)
