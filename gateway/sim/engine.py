"""Pure core of the engine simulator: tokenizer, chat template, KV caches, latency model and
deterministic answers.

The server asks an `Engine` what to answer (`plan`) and how long each step takes; it does the
sleeping and the writing itself. This module must never import asyncio or aiohttp, do IO, or
keep anything unbounded: both caches are LRUs with a fixed capacity.

Answers at temperature 0 depend only on the rendered prompt (never on the profile), so every
profile gives byte-identical text for the same prompt — except where a `divergence` coin,
itself drawn from the prompt hash, makes a quantized-like profile drift away at some token.
"""

from __future__ import annotations

import math
import random
import re
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import xxhash

from gateway.sim.calls import (
    ToolSpec,
    broken_arguments,
    call_arguments,
    call_hash,
    call_id,
    choose_calls,
    is_broken,
)
from gateway.sim.profiles import SimProfile

_encode = msgspec.json.Encoder().encode

BLOCK_SIZE = 16  # tokens per KV block, as in vLLM
VOCAB_SIZE = 32000
EMBEDDING_DIMS = 32

# Special tokens, then a word with at most one leading space, then one punctuation character with
# at most one leading space, then any other whitespace run. Every character matches one branch,
# so "".join(split_pieces(s)) == s.
_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>| ?\w+| ?[^\w\s]|\s+")

_WORDS = (
    "the model answer request token cache prefix session latency stream server engine queue "
    "batch decode prefill weight memory block layer value result first second next other "
    "simple small large fast slow early late steady quick careful clear short long good "
    "better best new old same different each every many few more most some any this that "
    "these those it they we you one two three four five time step path load sample copy "
    "candidate production traffic reply question user system data report test number "
    "signal window budget limit order state change point case fact way part place work "
    "is are was were has have can will may should would could does did makes takes gives "
    "shows keeps sends reads writes runs holds moves starts stops grows falls rises stays"
).split()

# A model upgrade's own words (`SimProfile.rephrase`): none of them is one of _WORDS, so every
# answer differs from the baseline's, and a simulated grader (gateway.sim.grader) can tell the
# two styles apart.
NEW_WORDS = (
    "a reply answer note query piece store prelude conduit delay flow host motor line group "
    "unroll fill ballast recall slab tier amount outcome initial later following another plain "
    "tiny big rapid sluggish prompt tardy constant swift thorough lucid brief lengthy fine "
    "finer finest fresh aged identical distinct all plenty handful further mostly several "
    "whichever here there them someone us yours single pair trio quartet quintet moment stage "
    "route burden specimen replica contender origin flux response inquiry client platform "
    "figures summary trial count cue pane allowance ceiling sequence status shift spot matter "
    "truth manner portion venue task becomes became owns owned may might ought forms brings "
    "offers reveals retains delivers parses records executes grips shifts begins halts expands "
    "drops climbs remains"
).split()

# Salts that give each hash-derived decision its own independent stream.
_S_LEN, _S_DIV, _S_AT, _S_ALT, _S_VAL, _S_SESSION, _S_NEW = 1, 2, 3, 4, 8, 9, 10


def split_pieces(text: str) -> list[str]:
    """Split text into token strings; joining them gives the text back."""
    pieces: list[str] = _TOKEN_RE.findall(text)
    return pieces


def token_id(piece: str) -> int:
    return xxhash.xxh32_intdigest(piece.encode()) % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    return [token_id(p) for p in split_pieces(text)]


def text_hash(text: str) -> int:
    return xxhash.xxh64_intdigest(text.encode())


def _mix(h: int, salt: int) -> int:
    return xxhash.xxh64_intdigest(h.to_bytes(8, "little"), seed=salt)


def _unit(h: int, salt: int) -> float:
    return _mix(h, salt) / 2.0**64


def session_of_text(first_user_message: str) -> str:
    """The session key used when a request names none: a hash of its first user message."""
    return f"h:{_mix(text_hash(first_user_message), _S_SESSION):016x}"


def chat_segments(
    messages: Sequence[tuple[str, str]], tools: str | None = None, *, continue_final: bool = False
) -> list[str]:
    """Render (role, text) messages through a fixed ChatML-like template, one string per
    message (and the generation prompt last); joined, they are the prompt.

    Each turn only appends to the previous rendering, so a growing conversation has a growing
    shared prefix: what prefix caches and session KV can reuse. `continue_final` (vLLM's
    `continue_final_message`) leaves the last message open instead of adding the generation
    prompt: the assistant's answer so far, to be continued or scored. Every segment starts with
    a special token, so no token crosses two (`TokenCache` relies on it).
    """
    parts = [f"<|im_start|>system\n# Tools\n{tools}<|im_end|>\n"] if tools else []
    if continue_final and messages:
        parts.extend(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages[:-1])
        role, text = messages[-1]
        parts.append(f"<|im_start|>{role}\n{text}")
        return parts
    parts.extend(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages)
    parts.append("<|im_start|>assistant\n")
    return parts


def render_chat(
    messages: Sequence[tuple[str, str]], tools: str | None = None, *, continue_final: bool = False
) -> str:
    """The prompt of `chat_segments`, joined."""
    return "".join(chat_segments(messages, tools, continue_final=continue_final))


def embed(text: str) -> list[float]:
    """A deterministic unit vector for the text."""
    rng = random.Random(text_hash(text))
    vec = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIMS)]
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


def _words(
    rng: random.Random,
    n: int,
    *,
    first: bool,
    capital: bool,
    run: int,
    vocabulary: Sequence[str] = _WORDS,
) -> list[str]:
    """n pieces of sentence-like text; `capital`/`run` carry the sentence state across calls."""
    pieces: list[str] = []
    for _ in range(n):
        if run >= 4 and rng.random() < 0.25:
            piece = "." if rng.random() < 0.6 else ","
            capital, run = piece == ".", 0
        else:
            word = rng.choice(vocabulary)
            word = word.capitalize() if capital else word
            piece = word if first else " " + word
            capital, run = False, run + 1
        first = False
        pieces.append(piece)
    return pieces


def _sentence_state(pieces: Sequence[str]) -> tuple[bool, int]:
    run = 0
    for piece in reversed(pieces):
        if piece in (".", ","):
            return piece == ".", run
        run += 1
    return not pieces, run


def _text(seed: int, length: int, vocabulary: Sequence[str] = _WORDS) -> list[str]:
    pieces = _words(
        random.Random(seed), length, first=True, capital=True, run=0, vocabulary=vocabulary
    )
    if length > 1 and pieces[-2] not in (".", ","):
        pieces[-1] = "."
    return pieces


def answer_pieces(profile: SimProfile, phash: int, sample_seed: int | None) -> list[str]:
    """The text answer, as token strings, before any max_tokens cut.

    Greedy (`sample_seed` None): seeded by the prompt hash only. With probability
    `profile.divergence` — a coin also drawn from the prompt hash, so reruns agree — the answer
    keeps the baseline's first k tokens and then continues differently.
    """
    span = profile.max_output_tokens - profile.min_output_tokens + 1
    seed = phash if sample_seed is None else _mix(phash, sample_seed)
    if profile.rephrase:  # a model upgrade: its own words throughout
        seed = _mix(seed, _S_NEW)
        return _text(seed, profile.min_output_tokens + _mix(seed, _S_LEN) % span, NEW_WORDS)
    base = _text(seed, profile.min_output_tokens + _mix(seed, _S_LEN) % span)
    if sample_seed is not None or _unit(phash, _S_DIV) >= profile.divergence or len(base) < 3:
        return base
    at = 1 + _mix(phash, _S_AT) % (len(base) - 2)
    alt_seed = _mix(phash, _S_ALT)
    rest = max(2, profile.min_output_tokens + alt_seed % span - at)
    capital, run = _sentence_state(base[:at])
    tail = _words(random.Random(alt_seed), rest, first=False, capital=capital, run=run)
    if tail[0] == base[at]:  # force the drift to start exactly at `at`
        tail[0] = " varies" if base[at] != " varies" else " differs"
    if rest > 1 and tail[-2] not in (".", ","):
        tail[-1] = "."
    return base[:at] + tail


def json_answer(pieces: Sequence[str], phash: int) -> str:
    """A valid JSON object built from the text answer (response_format json_object)."""
    text = "".join(pieces)
    obj = {"answer": text, "confidence": (_mix(phash, _S_VAL) % 100) / 100, "words": len(pieces)}
    return msgspec.json.encode(obj).decode()


class PrefixCache:
    """Automatic prefix caching: chain-hashed full blocks in an LRU of `capacity` blocks."""

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @staticmethod
    def block_hashes(tokens: Sequence[int], known: Sequence[int] = ()) -> list[int]:
        """One hash per full block; each covers every token from the start (chained via seed).
        `known`: the hashes of a prefix of `tokens` already hashed; they are continued."""
        hashes = list(known)
        h = hashes[-1] if hashes else 0
        step = BLOCK_SIZE * 4  # bytes of a block's ids
        view = memoryview(array("I", tokens[len(hashes) * BLOCK_SIZE :]).tobytes())
        for start in range(0, len(view) - step + 1, step):
            h = xxhash.xxh64_intdigest(view[start : start + step], h)
            hashes.append(h)
        return hashes

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks held (and refreshed)."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: Sequence[int]) -> None:
        if self.capacity <= 0:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()


class SessionStore:
    """Bi-directional KV: the token ids whose KV each session holds, LRU over sessions."""

    __slots__ = ("_held", "max_sessions")

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._held: OrderedDict[str, list[int]] = OrderedDict()

    def match(self, session: str, tokens: Sequence[int]) -> int:
        held = self._held.get(session)
        if held is None:
            return 0
        self._held.move_to_end(session)
        n = min(len(held), len(tokens))
        if held[:n] == list(tokens[:n]):
            return n
        return next(i for i in range(n) if held[i] != tokens[i])

    def store(self, session: str, tokens: list[int]) -> None:
        self._held[session] = tokens
        self._held.move_to_end(session)
        while len(self._held) > self.max_sessions:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        self._held.clear()


class Call(NamedTuple):
    """One tool call of an answer: its function's name and its id."""

    name: str
    id: str


class Plan:
    """Everything decided about one generation before it starts.

    A text answer is `pieces`, one per decode step. A call answer is `schedule`: per decode
    step, the index of the call it belongs to and the argument fragment it adds, or None for
    the step that announces the call (its name and id), as vLLM streams one call's name, then
    its arguments, then the next call's.
    """

    __slots__ = (
        "block_hashes",
        "cached_tokens",
        "calls",
        "eos",
        "finish_reason",
        "pieces",
        "prompt_ids",
        "schedule",
        "session",
    )

    def __init__(
        self,
        prompt_ids: list[int],
        cached_tokens: int,
        pieces: list[str],
        eos: bool,
        finish_reason: str,
        session: str | None,
        calls: tuple[Call, ...] = (),
        schedule: tuple[tuple[int, str | None], ...] = (),
    ) -> None:
        self.prompt_ids = prompt_ids
        self.cached_tokens = cached_tokens
        self.pieces = pieces  # a text answer's pieces (empty for a call answer)
        self.eos = eos  # an end-of-sequence step follows the pieces
        self.finish_reason = finish_reason  # "stop" | "length" | "tool_calls"
        self.session = session
        self.calls = calls
        self.schedule = schedule
        self.block_hashes: list[int] = []  # the prompt's, when a prefix cache hashed them

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def uncached_tokens(self) -> int:
        return len(self.prompt_ids) - self.cached_tokens

    @property
    def steps(self) -> int:
        """Decode steps = completion tokens."""
        return (len(self.schedule) if self.calls else len(self.pieces)) + self.eos

    def arguments(self) -> list[str]:
        """Each call's arguments as generated (cut short where max_tokens cut the answer)."""
        parts: list[list[str]] = [[] for _ in self.calls]
        for index, piece in self.schedule:
            if piece is not None:
                parts[index].append(piece)
        return ["".join(p) for p in parts]

    def generated(self, steps_done: int) -> list[str]:
        """The pieces of the first `steps_done` steps (a call's announcing step adds none)."""
        if not self.calls:
            return self.pieces[:steps_done]
        return [p for _, p in self.schedule[:steps_done] if p is not None]


def _call_schedule(calls: Sequence[Call], texts: Sequence[str]) -> list[tuple[int, str | None]]:
    schedule: list[tuple[int, str | None]] = []
    for index, text in enumerate(texts):
        schedule.append((index, None))
        schedule.extend((index, piece) for piece in split_pieces(text))
    return schedule


class TokenCache:
    """Token ids of rendered chat messages, by the hash of each message's text, in an LRU of
    `capacity` messages.

    An agent's conversation grows by appending messages, and every turn re-sends all of them:
    tokenizing each message once makes a turn's cost follow what it added, not its whole
    context. Safe because the template starts every message with a special token, so token
    boundaries never cross messages (tokens of a join == join of tokens).
    """

    __slots__ = ("_ids", "capacity", "evicted", "hits", "misses")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[int, array[int]] = OrderedDict()
        self.hits = self.misses = 0
        self.evicted = 0  # messages dropped for the bound (tokenized again if they return)

    def tokenize(self, segments: Sequence[str]) -> list[int]:
        out: list[int] = []
        held = self._ids
        for segment in segments:
            key = text_hash(segment)
            ids = held.get(key)
            if ids is None:
                self.misses += 1
                ids = array("I", tokenize(segment))
                if self.capacity > 0:
                    held[key] = ids
                    if len(held) > self.capacity:
                        held.popitem(last=False)
                        self.evicted += 1
            else:
                self.hits += 1
                held.move_to_end(key)
            out.extend(ids)
        return out

    def __len__(self) -> int:
        return len(self._ids)

    def clear(self) -> None:
        self._ids.clear()
        self.hits = self.misses = self.evicted = 0


class Engine:
    """One simulated engine: its profile, caches and seeded noise."""

    def __init__(self, profile: SimProfile, seed: int = 0) -> None:
        self.profile = profile
        self.seed = seed
        self._rng = random.Random(seed)
        self.prefix_cache = PrefixCache(profile.prefix_cache_blocks)
        self.sessions = SessionStore(profile.session_kv_max_sessions)
        self.tokens = TokenCache(profile.token_cache_messages)

    def reset(self) -> None:
        self._rng = random.Random(self.seed)
        self.prefix_cache.clear()
        self.sessions.clear()
        self.tokens.clear()

    def plan(
        self,
        prompt: str,
        *,
        prompt_ids: list[int] | None = None,
        session: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        json_mode: bool = False,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        named_tool: str | None = None,
        parallel_tool_calls: bool = True,
        answer: str | None = None,
    ) -> Plan:
        """Decide the answer and the cache hits for one request, and record its prefill.
        `prompt_ids`: the prompt's token ids when the caller has them (`TokenCache`).
        `answer`: the text decided elsewhere (a grader's verdict, gateway.sim.grader)."""
        if prompt_ids is None:
            prompt_ids = tokenize(prompt)
        phash = text_hash(prompt)
        sample_seed = None
        if temperature:  # None or 0.0 means greedy
            sample_seed = seed if seed is not None else self._rng.getrandbits(63)
        pieces = answer_pieces(self.profile, phash, sample_seed)
        if answer is not None:
            pieces = split_pieces(answer)
            tools = ()
        chosen = choose_calls(phash, tools, tool_choice, named_tool, parallel=parallel_tool_calls)
        budget = max_tokens if max_tokens is not None else self.profile.max_model_len
        if chosen:
            calls, schedule = self._calls(chosen, pieces, phash)
            eos = len(schedule) < budget
            finish = "tool_calls" if eos else "length"
            schedule = schedule[: max(budget, 0)]
            plan = Plan(prompt_ids, 0, [], eos, finish, session, calls, tuple(schedule))
        else:
            if json_mode and answer is None:
                pieces = split_pieces(json_answer(pieces, phash))
            eos = len(pieces) < budget
            plan = Plan(
                prompt_ids, 0, pieces[: max(budget, 0)], eos, "stop" if eos else "length", session
            )
        plan.cached_tokens = self._cached(plan)
        return plan

    def _calls(
        self, chosen: Sequence[ToolSpec], pieces: Sequence[str], phash: int
    ) -> tuple[tuple[Call, ...], list[tuple[int, str | None]]]:
        """The calls of a call answer and their decode schedule; with `break_calls`, one call
        of a broken answer carries wrong arguments."""
        words = [p.strip().lower() for p in pieces if p.strip() not in ("", ".", ",")]
        calls = tuple(Call(t.name, call_id(phash, i)) for i, t in enumerate(chosen))
        args = [call_arguments(t, words, call_hash(phash, i)) for i, t in enumerate(chosen)]
        texts = [_encode(a).decode() for a in args]
        if is_broken(phash, self.profile.break_calls):
            at = phash % len(chosen)
            texts[at] = broken_arguments(chosen[at], args[at], phash)
        return calls, _call_schedule(calls, texts)

    def _cached(self, plan: Plan) -> int:
        ids, cached = plan.prompt_ids, 0
        if self.prefix_cache.capacity > 0:
            hashes = plan.block_hashes = PrefixCache.block_hashes(ids)
            cached = self.prefix_cache.match(hashes) * BLOCK_SIZE
            self.prefix_cache.insert(hashes)
        if self.profile.session_kv and plan.session is not None:
            cached = max(cached, self.sessions.match(plan.session, ids))
            if len(ids) <= self.profile.max_model_len:  # the server rejects longer prompts
                self.sessions.store(plan.session, list(ids))
        # Like vLLM, the last prompt token is always computed to produce the first output.
        return max(0, min(cached, len(ids) - 1))

    def finish(self, plan: Plan, steps_done: int) -> None:
        """Record the KV of the tokens generated, for the caches' later turns."""
        if steps_done <= 0 or (self.prefix_cache.capacity <= 0 and not self.profile.session_kv):
            return
        generated = plan.generated(steps_done)
        if not generated:
            return
        ids = plan.prompt_ids + [token_id(p) for p in generated]
        if self.prefix_cache.capacity > 0:
            self.prefix_cache.insert(PrefixCache.block_hashes(ids, plan.block_hashes))
        if self.profile.session_kv and plan.session is not None:
            self.sessions.store(plan.session, ids)

    def _noise(self) -> float:
        sigma = self.profile.jitter
        return self._rng.lognormvariate(0.0, sigma) if sigma > 0 else 1.0

    def prefill_delay(self, uncached_tokens: int) -> float:
        """Seconds from admission to the first token."""
        p = self.profile
        base = p.overhead_s + p.prefill_s_per_token * uncached_tokens
        return base * self._noise() * p.time_scale if base > 0 else 0.0

    def decode_delay(self, other_active: int) -> float:
        """Seconds for one decode step with `other_active` other sequences in the batch."""
        p = self.profile
        base = p.decode_s_per_token + p.decode_s_per_extra_seq * max(other_active, 0)
        return base * self._noise() * p.time_scale if base > 0 else 0.0


# --- prompt logprobs (scoring) ----------------------------------------------------------------
# How likely a simulated engine finds each token of a prompt. Deterministic in the token ids and
# their position (one hash per position), so two engines of the same profile (production's
# configuration and its control) give identical scores, and a profile with `logprob_shift` (the
# quantized one) finds every prompt token that many nats less likely; a token pushed below the
# best alternative loses its top-1 rank. Shaped like vLLM's `prompt_logprobs`: None for the first
# position, then {token id: {logprob, rank, decoded_token}} with the prompt's token and the top k.

# How likely the baseline finds a prompt token: log p = -_SCALE * u (u uniform in [0, 1)), and
# the best alternative at that position sits _GAP * v below the most likely token.
_SCALE = 2.0
_GAP = 0.5


def _score_unit(*parts: int) -> float:
    return xxhash.xxh64_intdigest(b"".join(p.to_bytes(8, "little") for p in parts)) / 2.0**64


def prompt_logprobs(ids: Sequence[int], k: int, shift: float) -> list[dict[str, Any] | None]:
    """Per position of `ids`: the prompt token's logprob and rank, and the top k."""
    out: list[dict[str, Any] | None] = [None]
    for i in range(1, len(ids)):
        token = ids[i]
        h = (ids[i - 1] << 20) ^ token
        base = -_SCALE * _score_unit(h, i, 1)
        top_lp = (
            min(base + _GAP * _score_unit(h, i, 2), -1e-3) if _score_unit(h, i, 3) < 0.3 else base
        )
        mine = base - shift
        # The best alternative: above the prompt's token, or (where the prompt's token is the
        # most likely) a random gap below it, which a shift can close.
        best = top_lp if top_lp > base else base - _GAP * _score_unit(h, i, 4)
        alternatives = [((token + 1 + j * 7919) % VOCAB_SIZE, best - 0.7 * j) for j in range(k)]
        ranked = sorted([(token, mine), *alternatives], key=lambda e: -e[1])
        entry: dict[str, Any] = {}
        for rank, (tid, lp) in enumerate(ranked, start=1):
            if rank <= k or tid == token:
                entry[str(tid)] = {"logprob": lp, "rank": rank, "decoded_token": None}
        out.append(entry)
    return out
