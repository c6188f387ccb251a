"""The token counter: every arm's answer counted by one tokenizer before it is stored.

An SSE event is not a token. vLLM puts several tokens into one event whenever its engine runs
ahead of its API server's stream, and that depends on each engine's load, which is exactly what
differs between production and a candidate fed copies: counting events made a control that
answered byte-for-byte like production look 15 % shorter. So the meter counts events and keeps
the engine's `usage` as information, and this stage counts the *output* of every observation
(production's and each candidate's) with one tokenizer, then sets `output_tokens`,
`token_counter` and TPOT (`domain.timing.tpot`) and hands the record on to the real sink.

What is counted: an answer's output tokens are tokens(text) + Σ (tokens(name) +
tokens(arguments)) over its tool calls, each piece counted alone, as the engine emitted it
(`tool_calls` is JSON text `[{"name", "arguments"}]`), by the same tokenizer for both arms, so
TPOT, length, decode speed and cost keep gating on agent traffic.

Which tokenizer (`mirror.token_counter`): `local:<path>`, the model's tokenizer.json read in
this process (`local_tokens.py`; recommended: no engine is asked), or the `/tokenize` endpoint
of one candidate engine (a candidate's name, or `auto`: the registered control, else the first
candidate by name), never the live engine: its API server is production's, where the packing
comes from, and the counter must not add load to it. `/tokenize` requests load the arm that
answers them, so they are counted per candidate (`requests`) and the report states them.
Identical pieces are counted once per tokenizer (an LRU by the piece's hash), so a control that
answers like production costs one count per pair, and identical texts get identical counts.

What it never does: delay or alter a copy or a measurement (it runs after both are over, in the
mirror process), ask the live engine, encode on the event loop (a local batch runs in one worker
thread), or guess. An answer it cannot count (text not stored, cut at `store_text_max_chars`, no
output, no tokenizer, the tokenizer failing, its queue full) is stored with `output_tokens` None
and counted by reason; the evaluators then leave that pair out of the token-derived metrics and
say so. Bounded: at most `tokenize_max_pending` records wait, `tokenize_concurrency` requests are
in flight (one local batch of at most `_BATCH_MAX` answers), `tokenize_cache_entries` counts are
remembered.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import msgspec
import xxhash

from domain.accounting import TOKENIZE_REQUESTS_KEY
from domain.exposition import Exposed, Family, integer
from domain.records import ExchangeRecord, ObservationRecord
from domain.timing import tpot
from gateway.config.sections import MirrorConfig
from gateway.lifecycle import finish_tasks
from gateway.mirror.replay.lane import Lane
from gateway.mirror.replay.local_tokens import LocalTokenizer
from gateway.server.hooks import ObservationSink
from gateway.server.meter import CLOCK_RESOLUTION_S
from gateway.server.upstream import UpstreamError

__all__ = ["OUTCOMES", "TokenCounter", "tokenizer_lane"]

AUTO: Final = "auto"
OFF: Final = "off"
# Every record the counter sees ends in exactly one of these (the Prometheus outcome label).
OUTCOMES: Final = (
    "counted",  # counted by the tokenizer (requests, a local batch, or the cache)
    "failed_answer",  # the answer failed: no text to count, and no pair uses it for tokens
    "no_text",  # no output at all: no text and no tool call
    "not_stored",  # the text is not kept (store_text = false)
    "text_cut",  # the text was cut at store_text_max_chars: its count would be short
    "calls_unreadable",  # `tool_calls` is not the JSON list of calls the meter writes
    "no_tokenizer",  # nothing to count with (token_counter off, or no candidate registered)
    "overflow",  # the counter's queue was full
    "shutdown",  # still waiting when the mirror process stopped (past its drain deadline)
    "tokenizer_failed",  # the tokenizer answered an error, garbage, or not in time
)
TOKEN_COUNTS: Final = Family(
    "canary_mirror_token_counts_total",
    "counter",
    "Observations by how their output tokens were counted (counted, or why not).",
    ("outcome",),
    fmt=integer,
)
TOKENIZE_REQUESTS: Final = Family(
    "canary_mirror_tokenize_requests_total",
    "counter",
    "Requests to a candidate engine's /tokenize by the token counter (cache hits need none).",
    ("candidate",),
    fmt=integer,
)
# Answers one local batch takes at most: the batch is encoded in one call that cannot be
# interrupted, so this bounds how late a shutdown (or a newly queued answer) waits for it.
_BATCH_MAX: Final = 256
_EMPTY_HASH: Final = xxhash.xxh3_128_hexdigest(b"")  # a streamed answer with no text at all
_decode_count: Final = msgspec.json.Decoder(dict[str, Any]).decode
_encode: Final = msgspec.json.Encoder().encode


class _Call(msgspec.Struct):
    name: str | None = None
    arguments: Any = None  # text as the engine emitted it (an object is counted as its JSON)


_decode_calls: Final = msgspec.json.Decoder(list[_Call]).decode
# (xxh3_128 of a piece of the output, the piece): what one count is asked for.
Piece = tuple[str, str]


def tokenizer_lane(choice: str, lanes: Mapping[str, Lane]) -> Lane | None:
    """The lane whose engine counts every arm's tokens: the named one, or (auto) the control,
    else the first candidate by name; None when off or none is registered."""
    if choice == OFF or not lanes:
        return None
    if choice != AUTO:
        return lanes.get(choice)
    controls = sorted(name for name, lane in lanes.items() if lane.is_control)
    return lanes[controls[0] if controls else min(lanes)]


def pieces_of(record: ObservationRecord) -> list[Piece] | None:
    """The non-empty pieces whose token counts add up to the answer's: its text, then each tool
    call's name and arguments; None when `tool_calls` cannot be read."""
    text = record.output_text or ""
    out: list[Piece] = []
    if text:
        out.append((record.output_hash or xxhash.xxh3_128_hexdigest(text.encode()), text))
    if record.tool_calls is None:
        return out
    try:
        calls = _decode_calls(record.tool_calls)
    except msgspec.DecodeError:
        return None
    for call in calls:
        args = call.arguments
        texts = (call.name, args if args is None or isinstance(args, str) else _json(args))
        out.extend((xxhash.xxh3_128_hexdigest(t.encode()), t) for t in texts if t)
    return out


def _json(value: Any) -> str:
    return _encode(value).decode()


class TokenCounter:
    """An `ObservationSink` in front of the real one that counts each answer's tokens first."""

    def __init__(
        self,
        sink: ObservationSink,
        config: MirrorConfig,
        *,
        resolution_s: float = CLOCK_RESOLUTION_S,
    ) -> None:
        self._sink = sink
        self._choice = config.token_counter
        self._local = LocalTokenizer.from_setting(config.token_counter)
        # One thread: a local batch is encoded off the event loop, one batch at a time.
        self._executor = (
            None
            if self._local is None
            else ThreadPoolExecutor(1, thread_name_prefix="mirror-tokenizer")
        )
        self._max = config.tokenize_max_pending
        self._concurrency = 1 if self._local is not None else config.tokenize_concurrency
        self._timeout_s = config.tokenize_timeout_s
        self._cache_max = config.tokenize_cache_entries
        self._resolution = resolution_s
        self._lane: Lane | None = None
        self._queue: deque[tuple[ObservationRecord, list[Piece]]] = deque()
        # (tokenizer label, xxh3_128 of a piece) -> tokens; bounded LRU.
        self._cache: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._inflight: dict[tuple[str, str], asyncio.Future[int | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.requests: dict[str, int] = {}  # /tokenize requests, by the candidate asked
        self.local_batches = 0
        self.cache_hits = 0

    @property
    def label(self) -> str | None:
        """How tokens are counted now (`token_counter` of the records), or None."""
        if self._local is not None:
            return self._local.label
        return None if self._lane is None else f"tokenize:{self._lane.name}"

    @property
    def pending(self) -> int:
        return len(self._queue)

    def choose(self, lanes: Mapping[str, Lane]) -> None:
        """Pick the tokenizer among the candidate lanes (at every change of the candidate set)."""
        self._lane = None if self._local is not None else tokenizer_lane(self._choice, lanes)

    def lane_counters(self, candidate: str) -> dict[str, int]:
        """The candidate's counters kept with its copy accounting (and so in its report): the
        /tokenize requests it answered; empty when it answered none."""
        n = self.requests.get(candidate, 0)
        return {TOKENIZE_REQUESTS_KEY: n} if n else {}

    # ------------------------------------------------------------------ ObservationSink

    def put_exchange(self, record: ExchangeRecord) -> None:
        self._sink.put_exchange(record)

    def put_observation(self, record: ObservationRecord) -> None:
        """Count the record's output (at once when the cache knows every piece), then pass it
        on."""
        why = self._uncountable(record)
        if why is not None:
            self._done(record, why)
            return
        pieces = pieces_of(record)
        if pieces is None:
            self._done(record, "calls_unreadable")
            return
        label = self.label
        assert label is not None
        total = self._cached_total(label, pieces)
        if total is not None:
            self._set(record, total, label)
            return
        if len(self._queue) >= self._max or self._closed:
            self._done(record, "shutdown" if self._closed else "overflow")
            return
        self._queue.append((record, pieces))
        if len(self._tasks) < self._concurrency:
            drain = self._drain_local() if self._local is not None else self._drain_engine()
            task = asyncio.get_running_loop().create_task(drain, name="mirror-tokens")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _uncountable(self, record: ObservationRecord) -> str | None:
        if record.error_kind is not None or record.status == 0:
            return "failed_answer"
        if record.output_text is None and record.output_hash not in (None, _EMPTY_HASH):
            return "not_stored"  # a text was there; a call-only answer is still counted
        if record.text_truncated:
            return "text_cut"
        if record.output_text is None and record.tool_calls is None:
            return "no_text" if record.output_hash is None else "not_stored"
        if self._local is None and self._lane is None:
            return "no_tokenizer"
        return None

    def _cached_total(self, label: str, pieces: list[Piece]) -> int | None:
        total = 0
        cache = self._cache
        for digest, _ in pieces:
            key = (label, digest)
            n = cache.get(key)
            if n is None:
                return None
            cache.move_to_end(key)
            total += n
        self.cache_hits += len(pieces)
        return total

    def _set(self, record: ObservationRecord, tokens: int, label: str) -> None:
        record.output_tokens = tokens
        record.token_counter = label
        if record.token_events is not None:  # TPOT is a streamed answer's figure
            record.tpot_s = tpot(record.ttft_s, record.e2e_s, tokens, self._resolution)
        self._done(record, "counted")

    def _done(self, record: ObservationRecord, outcome: str) -> None:
        if outcome != "counted":
            record.output_tokens = record.token_counter = record.tpot_s = None
        self.outcomes[outcome] += 1
        self._sink.put_observation(record)

    def _remember(self, key: tuple[str, str], tokens: int) -> None:
        self._cache[key] = tokens
        if len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)

    # ------------------------------------------------------------------ counting: local

    async def _drain_local(self) -> None:
        """Count what waits in batches of at most _BATCH_MAX answers, each batch's distinct
        uncached pieces in one call on the worker thread."""
        local, executor, queue = self._local, self._executor, self._queue
        assert local is not None and executor is not None
        label = local.label
        loop = asyncio.get_running_loop()
        while queue:
            batch = [queue.popleft() for _ in range(min(len(queue), _BATCH_MAX))]
            fresh: dict[str, int] = {}
            wanted: dict[str, str] = {}
            for _, pieces in batch:
                for digest, text in pieces:
                    n = self._cache.get((label, digest))
                    if n is not None:
                        fresh[digest] = n
                    else:
                        wanted.setdefault(digest, text)
            counts: list[int] | None = None
            try:
                if wanted:
                    self.local_batches += 1
                    counts = await loop.run_in_executor(
                        executor, local.count, list(wanted.values())
                    )
            except asyncio.CancelledError:  # at shutdown: stored uncounted, never lost
                for record, _ in batch:
                    self._done(record, "shutdown")
                raise
            except Exception:  # the library failed on this batch: its answers stay uncounted
                counts = None
            if wanted and counts is None:
                for record, _ in batch:
                    self._done(record, "tokenizer_failed")
                continue
            for digest, n in zip(wanted, counts or (), strict=True):
                fresh[digest] = n
                self._remember((label, digest), n)
            for record, pieces in batch:
                self._set(record, sum(fresh[digest] for digest, _ in pieces), label)

    # ------------------------------------------------------------------ counting: /tokenize

    async def _drain_engine(self) -> None:
        queue = self._queue
        while queue:
            record, pieces = queue.popleft()
            lane, label = self._lane, self.label
            if lane is None or label is None:
                self._done(record, "no_tokenizer")
                continue
            total, failed = 0, False
            try:
                for digest, text in pieces:
                    key = (label, digest)
                    n = self._cache.get(key)
                    if n is None:
                        n = await self._count(key, lane, text)
                    if n is None:
                        failed = True
                        break
                    total += n
            except asyncio.CancelledError:  # at shutdown: stored uncounted, never lost
                self._done(record, "shutdown")
                raise
            if failed:
                self._done(record, "tokenizer_failed")
            else:
                self._set(record, total, label)

    async def _count(self, key: tuple[str, str], lane: Lane, text: str) -> int | None:
        """The piece's count: one request per distinct piece, however many arms wait for it
        (both arms of a pair usually finish together, before either count is cached)."""
        waiting = self._inflight.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        tokens: int | None = None
        try:
            tokens = await self._ask(lane, text)
            if tokens is not None:
                self._remember(key, tokens)
        finally:
            del self._inflight[key]
            future.set_result(tokens)
        return tokens

    async def _ask(self, lane: Lane, text: str) -> int | None:
        body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
        if lane.model is not None:
            body["model"] = lane.model
        self.requests[lane.name] = self.requests.get(lane.name, 0) + 1
        try:
            async with asyncio.timeout(self._timeout_s):
                status, answer = await lane.post_json("/tokenize", _encode(body), purpose="tokens")
            if status != 200:
                return None
            doc = _decode_count(answer)
        except (UpstreamError, TimeoutError, OSError, msgspec.DecodeError):
            return None
        count, ids = doc.get("count"), doc.get("tokens")
        if isinstance(ids, list):
            return len(ids)
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    # ------------------------------------------------------------------ lifecycle, export

    async def wait_idle(self) -> None:
        """Return once no record waits to be counted."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self, timeout_s: float) -> None:
        """Count what waits for up to `timeout_s`; pass the rest on uncounted (`shutdown`)."""
        self._closed = True
        await finish_tasks(set(self._tasks), timeout_s)
        while self._queue:
            self._done(self._queue.popleft()[0], "shutdown")
        if self._executor is not None:  # a batch still encoding finishes in its thread
            self._executor.shutdown(wait=False, cancel_futures=True)

    def prometheus_lines(self) -> Iterable[Exposed]:
        yield TOKEN_COUNTS
        for outcome, n in self.outcomes.items():
            yield TOKEN_COUNTS.sample(n, outcome)
        yield TOKENIZE_REQUESTS
        for candidate, n in sorted(self.requests.items()):
            yield TOKENIZE_REQUESTS.sample(n, candidate)
