"""The token counter: every arm's answer counted by one tokenizer before it is stored.

An SSE event is not a token. vLLM puts several tokens into one event whenever its engine runs
ahead of its API server's stream, and that depends on each engine's load, which is exactly what
differs between production and a candidate fed copies: counting events made a control that
answered byte-for-byte like production look 15 % shorter. So the meter counts events and keeps
the engine's `usage` as information, and this stage counts the *text* of every observation
(production's and each candidate's) with one tokenizer, then sets `output_tokens`,
`token_counter` and TPOT (`domain.timing.tpot`) and hands the record on to the real sink.

Which tokenizer: the `/tokenize` endpoint of one candidate engine (`mirror.token_counter`: a
candidate's name, or `auto`: the registered control, else the first candidate by name), never
the live engine: its API server is production's, where the packing comes from, and the counter
must not add load to it. A candidate of the same model tokenizes as production does; a local
tokenizer would need the model's files on the gateway host, which a proxy in front of an engine
does not have. Identical texts are counted once per tokenizer (an LRU by the text's hash), so a
control that answers like production costs one request per pair, and identical texts always get
identical counts.

What it never does: delay or alter a copy or a measurement (it runs after both are over, in the
mirror process), ask the live engine, or guess. A text it cannot count (not stored, cut at
`store_text_max_chars`, a tool call, no tokenizer, the tokenizer failing, its queue full) is
stored with `output_tokens` None and counted by reason; the evaluators then leave that pair out
of the token-derived metrics and say so. Bounded: at most `tokenize_max_pending` records wait,
`tokenize_concurrency` requests are in flight, `tokenize_cache_entries` counts are remembered.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from domain.exposition import Exposed, Family, integer
from domain.records import ExchangeRecord, ObservationRecord
from domain.timing import tpot
from gateway.config.sections import MirrorConfig
from gateway.lifecycle import finish_tasks
from gateway.mirror.replay.lane import Lane
from gateway.server.hooks import ObservationSink
from gateway.server.meter import CLOCK_RESOLUTION_S
from gateway.server.upstream import UpstreamError

__all__ = ["OUTCOMES", "TokenCounter", "tokenizer_lane"]

AUTO: Final = "auto"
OFF: Final = "off"
# Every record the counter sees ends in exactly one of these (the Prometheus outcome label).
OUTCOMES: Final = (
    "counted",  # counted by the tokenizer (a request, or the cache)
    "failed_answer",  # the answer failed: no text to count, and no pair uses it for tokens
    "no_text",  # no output text at all (no token, or only a tool call)
    "not_stored",  # the text is not kept (store_text = false)
    "text_cut",  # the text was cut at store_text_max_chars: its count would be short
    "no_tokenizer",  # no candidate engine to count with (token_counter off, or none registered)
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
    "Requests to the tokenizer engine's /tokenize (cache hits need none).",
    fmt=integer,
)
_decode_count: Final = msgspec.json.Decoder(dict[str, Any]).decode
_encode: Final = msgspec.json.Encoder().encode


def tokenizer_lane(choice: str, lanes: Mapping[str, Lane]) -> Lane | None:
    """The lane whose engine counts every arm's tokens: the named one, or (auto) the control,
    else the first candidate by name; None when off or none is registered."""
    if choice == OFF or not lanes:
        return None
    if choice != AUTO:
        return lanes.get(choice)
    controls = sorted(name for name, lane in lanes.items() if lane.is_control)
    return lanes[controls[0] if controls else min(lanes)]


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
        self._max = config.tokenize_max_pending
        self._concurrency = config.tokenize_concurrency
        self._timeout_s = config.tokenize_timeout_s
        self._cache_max = config.tokenize_cache_entries
        self._resolution = resolution_s
        self._lane: Lane | None = None
        self._queue: deque[ObservationRecord] = deque()
        # (tokenizer label, xxh3_128 of the full text) -> tokens; bounded LRU.
        self._cache: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._inflight: dict[tuple[str, str], asyncio.Future[int | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.requests = 0
        self.cache_hits = 0

    @property
    def label(self) -> str | None:
        """How tokens are counted now (`token_counter` of the records), or None."""
        return None if self._lane is None else f"tokenize:{self._lane.name}"

    @property
    def pending(self) -> int:
        return len(self._queue)

    def choose(self, lanes: Mapping[str, Lane]) -> None:
        """Pick the tokenizer among the candidate lanes (at every change of the candidate set)."""
        self._lane = tokenizer_lane(self._choice, lanes)

    # ------------------------------------------------------------------ ObservationSink

    def put_exchange(self, record: ExchangeRecord) -> None:
        self._sink.put_exchange(record)

    def put_observation(self, record: ObservationRecord) -> None:
        """Count the record's text (at once when the cache knows it), then pass it on."""
        why = self._uncountable(record)
        if why is not None:
            self._done(record, why)
            return
        text, label = record.output_text or "", self.label
        assert label is not None
        if not text:
            self._set(record, 0, label)
            return
        key = (label, record.output_hash or "")
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            self._set(record, cached, label)
            return
        if len(self._queue) >= self._max or self._closed:
            self._done(record, "shutdown" if self._closed else "overflow")
            return
        self._queue.append(record)
        if len(self._tasks) < self._concurrency:
            task = asyncio.get_running_loop().create_task(self._drain(), name="mirror-tokens")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _uncountable(self, record: ObservationRecord) -> str | None:
        if record.error_kind is not None or record.status == 0:
            return "failed_answer"
        if record.tool_calls is not None:  # its tokens are arguments, not the text counted
            return "no_text"
        if record.output_text is None:
            return "no_text" if record.output_hash is None else "not_stored"
        if record.text_truncated:
            return "text_cut"
        if self._lane is None:
            return "no_tokenizer"
        return None

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

    # ------------------------------------------------------------------ counting

    async def _drain(self) -> None:
        queue = self._queue
        while queue:
            record = queue.popleft()
            lane, label = self._lane, self.label
            if lane is None or label is None:
                self._done(record, "no_tokenizer")
                continue
            key = (label, record.output_hash or "")
            tokens = self._cache.get(key)
            if tokens is None:
                try:
                    tokens = await self._count(key, lane, record.output_text or "")
                except asyncio.CancelledError:  # at shutdown: stored uncounted, never lost
                    self._done(record, "shutdown")
                    raise
            if tokens is None:
                self._done(record, "tokenizer_failed")
            else:
                self._set(record, tokens, label)

    async def _count(self, key: tuple[str, str], lane: Lane, text: str) -> int | None:
        """The text's count: one request per distinct text, however many arms wait for it
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
        self.requests += 1
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

    def _remember(self, key: tuple[str, str], tokens: int) -> None:
        self._cache[key] = tokens
        if len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)

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
            self._done(self._queue.popleft(), "shutdown")

    def prometheus_lines(self) -> Iterable[Exposed]:
        yield TOKEN_COUNTS
        for outcome, n in self.outcomes.items():
            yield TOKEN_COUNTS.sample(n, outcome)
        yield TOKENIZE_REQUESTS
        yield TOKENIZE_REQUESTS.sample(self.requests)
