"""Passive response meter: watches a response's bytes as they pass, never copies the stream.

`ResponseMeter` is a pure, incremental parser: the proxy (and the mirror dispatcher, on candidate
responses) calls `feed(chunk, now)` on every chunk and `finish(now, status)` once, and gets a
`MeterResult` with TTFT, E2E, inter-event latency, the engine's usage, the token events, finish
reason, tool calls, the output text up to a bound and an xxh3_128 hash of all of it (vLLM
`bench serve` conventions; docs/metrics.md).

An SSE event is not a token: vLLM puts several tokens into one event whenever its engine runs
ahead of its API server's stream, and how often depends on the engine's load. So the meter
counts events (`token_events`) and keeps the engine's `usage` as information, and leaves
`output_tokens` and TPOT to the mirror plane's token counter, which counts every arm's text with
one tokenizer (gateway/mirror/replay/tokens.py). Gaps are between events (inter-event latency),
over the token span, not per read: several events that arrive in one read share one timestamp,
so the gap before a read is spread over the events it carried. When every event came in one
read the span is below the clock's resolution: the result says `timing_unresolved` and leaves
the inter-event gaps None, never 0.

It must never import asyncio or aiohttp, never block, never keep more than a bounded amount of
the response (a partial SSE line, the text up to its limit, a non-SSE body up to `json_max_bytes`).
"""

from __future__ import annotations

import time

import msgspec
import xxhash

from domain.observation import Measured


class MeterResult(Measured, kw_only=True):
    """What one response looked like: the measured quantities (`domain.observation.Measured`,
    every field but `queue_wait_s`) and what the meter saw on the way (for classification).
    """

    is_sse: bool
    last_byte_s: float | None = None
    # True when the answer carried more than one token event but they all reached the meter
    # within the clock's resolution (one read): the inter-event gaps are then unknown and left
    # None, never 0 (and TPOT, computed later from the counted tokens, is left None too).
    timing_unresolved: bool = False
    chunk_count: int = 0  # SSE events (or body chunks for non-SSE)
    token_chunk_count: int = 0
    text: str = ""  # output text, up to the meter's text limit (text_truncated says if cut)
    tool_calls: list[tuple[str, str]] | None = None  # (name, arguments JSON text), in order
    parse_errors: int = 0  # events that were not valid JSON (garbage)
    saw_done: bool = False  # `data: [DONE]` seen
    bytes_total: int = 0


# --- the few fields of an OpenAI response / stream chunk the meter reads (msgspec skips the rest)


class _Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    index: int | None = None
    function: _Function | None = None


class _Message(msgspec.Struct, gc=False):
    """A chat `delta` (stream) or `message` (whole response)."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: _Message | None = None
    message: _Message | None = None
    text: str | None = None  # /v1/completions
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Body(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


_DECODER = msgspec.json.Decoder(_Body)
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_DONE = b"[DONE]"
_SSE_FIELDS = (b"event", b"id", b"retry")  # recognised and ignored; `data` is handled apart
# A line this long without a newline is not SSE from an engine; dropped so memory stays bounded.
MAX_LINE_BYTES = 1 << 20
# Non-SSE bodies are kept (as references to the received chunks) up to this size for parsing.
JSON_MAX_BYTES = 16 << 20
# Gaps kept for the percentiles; count, mean and max stay exact past it.
MAX_GAPS = 1 << 16
# Two instants closer than this cannot be told apart (1 ns for perf_counter on Linux).
CLOCK_RESOLUTION_S = time.get_clock_info("perf_counter").resolution


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as vLLM reports)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class ResponseMeter:
    """Incremental meter of one response; `feed` every chunk, then `finish` once.

    Text, finish reason and tool calls are those of choice index 0; a chunk counts as carrying
    tokens when any choice has non-empty content, text, reasoning or a tool-call fragment.
    """

    __slots__ = (
        "_carry",
        "_data",
        "_first_byte",
        "_gap_count",
        "_gap_max",
        "_gap_sum",
        "_gaps",
        "_hasher",
        "_json_max",
        "_json_parts",
        "_json_size",
        "_last_byte",
        "_last_token",
        "_pending_cr",
        "_prev_read",
        "_read_tokens",
        "_resolution",
        "_tail",
        "_text_len",
        "_text_max",
        "_text_parts",
        "_tools",
        "bytes_total",
        "cached_tokens",
        "chunk_count",
        "completion_tokens",
        "finish_reason",
        "first_token_at",
        "is_sse",
        "parse_errors",
        "prompt_tokens",
        "saw_done",
        "t0",
        "text_truncated",
        "token_chunk_count",
    )

    def __init__(
        self,
        t0: float,
        *,
        is_sse: bool,
        text_max_chars: int,
        json_max_bytes: int = JSON_MAX_BYTES,
        resolution_s: float = CLOCK_RESOLUTION_S,
    ) -> None:
        self.t0 = t0
        self._resolution = resolution_s
        self.is_sse = is_sse
        self._text_max = text_max_chars
        self._json_max = json_max_bytes
        self._tail = b""
        self._pending_cr = False
        self._data: list[bytes] = []
        self._json_parts: list[bytes] = []
        self._json_size = 0
        self._first_byte: float | None = None
        self._last_byte: float | None = None
        self.first_token_at: float | None = None
        self._last_token = 0.0
        self._prev_read = 0.0  # time of the token-bearing read before the current one
        self._read_tokens = 0  # token events in the current read, not yet turned into gaps
        self._carry = -1  # token events of the first read past the first token; -1: none yet
        self._gaps: list[float] = []
        self._gap_count = 0
        self._gap_sum = 0.0
        self._gap_max = 0.0
        self._text_parts: list[str] = []
        self._text_len = 0
        self._hasher: xxhash.xxh3_128 | None = None  # set once the text outgrows its limit
        self._tools: dict[int, list[str]] | None = None  # index -> [name, arg fragments...]
        self.text_truncated = False
        self.bytes_total = 0
        self.chunk_count = 0
        self.token_chunk_count = 0
        self.parse_errors = 0
        self.saw_done = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None

    # ------------------------------------------------------------------ feeding

    def feed(self, chunk: bytes, now: float) -> None:
        """Account one received chunk (any size, any boundary) at `now` (perf_counter)."""
        if not chunk:
            return
        self.bytes_total += len(chunk)
        if self._first_byte is None:
            self._first_byte = now
        self._last_byte = now
        if not self.is_sse:
            self.chunk_count += 1
            size = self._json_size + len(chunk)
            if size <= self._json_max:
                self._json_parts.append(chunk)  # a reference, not a copy
            else:
                self._json_parts.clear()
            self._json_size = size
            return
        if self._pending_cr:  # a CRLF split across two chunks: drop its LF
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        data = self._tail + chunk if self._tail else chunk
        if b"\r" in data:
            self._pending_cr = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        elif not self._data and data[:6] == b"data: ":
            data = self._events(data, now)
            if not data:  # whole events only (the usual read): no line left to parse
                self._tail = b""
                return
        start = 0
        find = data.find
        while (nl := find(b"\n", start)) >= 0:
            if nl == start:
                self._dispatch(now)
            elif data[start] != 58:  # 58 == ord(":"), a comment line
                self._field(data[start:nl])
            start = nl + 1
        tail = data[start:]
        if len(tail) > MAX_LINE_BYTES:
            self.parse_errors += 1
            tail = b""
        self._tail = tail

    def _events(self, data: bytes, now: float) -> bytes:
        """The fast path for a read of whole one-line events (`data: <payload>` and a blank
        line, what engines send): split in one call, each payload decoded as `_dispatch` would,
        the read's token events timed together (they share `now`). Returns what is left for the
        line parser: the bytes after the last whole event, or all of `data` when it holds
        anything else (another field, a comment, a multi-line event)."""
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            return data
        payloads = data[6 : end - 2].split(b"\n\ndata: ")
        if data.count(b"\n", 0, end) != 2 * len(payloads):
            return data
        decode = _DECODER.decode
        content = self._content
        tokens = 0
        self.chunk_count += len(payloads)
        for payload in payloads:
            if payload == _DONE:
                self.saw_done = True
                continue
            try:
                body = decode(payload)
            except _DECODE_ERRORS:
                self.parse_errors += 1
                continue
            if content(body, True):
                tokens += 1
        if tokens:
            self._tokens(tokens, now)
        return data[end:]

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if name == b"data":
            self._data.append(value[1:] if value[:1] == b" " else value)
        elif not colon or name not in _SSE_FIELDS:
            self.parse_errors += 1  # not an SSE line at all: garbage

    def _dispatch(self, now: float) -> None:
        parts = self._data
        if not parts:
            return
        payload = parts[0] if len(parts) == 1 else b"\n".join(parts)
        parts.clear()
        self.chunk_count += 1
        if payload == _DONE:
            self.saw_done = True
            return
        try:
            body = _DECODER.decode(payload)
        except _DECODE_ERRORS:
            self.parse_errors += 1
            return
        self._account(body, now, streamed=True)

    def _account(self, body: _Body, now: float, *, streamed: bool) -> None:
        if self._content(body, streamed):
            if streamed:
                self._tokens(1, now)
            elif self.first_token_at is None:
                self.first_token_at = self._first_byte

    def _content(self, body: _Body, streamed: bool) -> bool:
        """Take usage, choice 0's text, tool calls and finish reason from one event (or a whole
        response); True when any choice carried tokens."""
        usage = body.usage
        if usage is not None:
            if usage.prompt_tokens is not None:
                self.prompt_tokens = usage.prompt_tokens
            if usage.completion_tokens is not None:
                self.completion_tokens = usage.completion_tokens
            details = usage.prompt_tokens_details
            if details is not None and details.cached_tokens is not None:
                self.cached_tokens = details.cached_tokens
        choices = body.choices
        if not choices:
            return False
        token = False
        for choice in choices:
            msg = choice.delta if streamed else choice.message
            text = choice.text
            if msg is not None:
                if msg.content:
                    text = msg.content if text is None else text + msg.content
                if msg.tool_calls or msg.reasoning_content or msg.reasoning:
                    token = True
                    if choice.index == 0 and msg.tool_calls:
                        self._add_tools(msg.tool_calls)
            if text:
                token = True
                if choice.index == 0:
                    self._add_text(text)
            if choice.finish_reason is not None and choice.index == 0:
                self.finish_reason = choice.finish_reason
        return token

    def _tokens(self, count: int, now: float) -> None:
        """`count` token events that arrived in one read at `now`."""
        self.token_chunk_count += count
        if self.first_token_at is None:
            self.first_token_at = now
            self._read_tokens = count
        elif now == self._last_token:  # the same read: its tokens arrived together
            self._read_tokens += count
        else:
            self._close_read()
            self._prev_read = self._last_token
            self._read_tokens = count
        self._last_token = now

    def _close_read(self) -> None:
        """Turn the current read's token events into inter-event gaps.

        Tokens that arrive in one read were generated over the time since the previous
        token-bearing read, so that interval is spread evenly over them (k gaps of d/k) instead
        of giving k-1 gaps of 0. The first read's extra tokens (those that came with the first
        token) have no interval of their own: they are carried into the next one. The gaps then
        sum to the token span and number token events - 1, so the mean inter-event latency
        equals the span per gap.
        """
        tokens = self._read_tokens
        if tokens == 0:
            return
        self._read_tokens = 0
        if self._carry < 0:  # the first read
            self._carry = tokens - 1
            return
        count = tokens + self._carry
        self._carry = 0
        span = self._last_token - self._prev_read
        gap = span / count
        self._gap_count += count
        self._gap_sum += span
        if gap > self._gap_max:
            self._gap_max = gap
        gaps = self._gaps
        if count == 1:  # one event a read, the usual case: no list to build
            if len(gaps) < MAX_GAPS:
                gaps.append(gap)
            return
        room = MAX_GAPS - len(gaps)
        if room > 0:
            gaps.extend([gap] * min(count, room))

    def final_event_seen(self) -> bool:
        """True once the stream carried its final event: `[DONE]` or choice 0's finish reason."""
        return self.saw_done or self.finish_reason is not None

    def _add_text(self, text: str) -> None:
        hasher = self._hasher
        if hasher is not None:  # past the limit: only the hash sees the rest
            hasher.update(text.encode())
            return
        room = self._text_max - self._text_len
        if len(text) <= room:
            self._text_parts.append(text)
            self._text_len += len(text)
            return
        if room > 0:
            self._text_parts.append(text[:room])
            self._text_len += room
        # The kept text is full: hash it once, then hash every later piece as it comes.
        hasher = self._hasher = xxhash.xxh3_128("".join(self._text_parts).encode())
        hasher.update(text[room:].encode() if room > 0 else text.encode())
        self.text_truncated = True

    def _add_tools(self, calls: list[_ToolCall]) -> None:
        tools = self._tools
        if tools is None:
            tools = self._tools = {}
        for pos, call in enumerate(calls):
            index = pos if call.index is None else call.index
            entry = tools.get(index)
            if entry is None:
                entry = tools[index] = [""]
            fn = call.function
            if fn is not None:
                if fn.name and not entry[0]:
                    entry[0] = fn.name
                if fn.arguments:
                    entry.append(fn.arguments)

    # ------------------------------------------------------------------ result

    def finish(self, now: float, status: int) -> MeterResult:
        """The result so far; call once, when the response is over (complete or not)."""
        t0 = self.t0
        if not self.is_sse:
            self._finish_json()
        res = MeterResult(
            status=status,
            is_sse=self.is_sse,
            chunk_count=self.chunk_count,
            token_chunk_count=self.token_chunk_count,
            parse_errors=self.parse_errors,
            saw_done=self.saw_done,
            bytes_total=self.bytes_total,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            finish_reason=self.finish_reason,
            text="".join(self._text_parts),
            text_truncated=self.text_truncated,
        )
        if self._last_byte is not None:
            res.last_byte_s = self._last_byte - t0
        if self.first_token_at is not None:
            res.ttft_s = self.first_token_at - t0
            res.e2e_s = (self._last_token if self.is_sse else self._last_byte or now) - t0
        elif self._last_byte is not None:
            res.e2e_s = self._last_byte - t0
        res.finished = (
            self.final_event_seen()
            if self.is_sse
            else bool(self.bytes_total and not self.parse_errors)
        )
        # The engine's count is kept as information; tokens are counted from the text later,
        # by one tokenizer for both arms (domain.observation: output_tokens, token_counter).
        res.usage_tokens = self.completion_tokens
        if self.is_sse:
            res.token_events = self.token_chunk_count
            if self.token_chunk_count > 1 and res.ttft_s is not None and res.e2e_s is not None:
                # Several token events, all within the clock's resolution (one read): no gap
                # between them can be told, so none is reported (never a gap of 0).
                res.timing_unresolved = res.e2e_s - res.ttft_s <= self._resolution
            self._close_read()
        if self._gap_count and not res.timing_unresolved:
            gaps = sorted(self._gaps)
            res.inter_event_count = self._gap_count
            res.inter_event_mean_s = self._gap_sum / self._gap_count
            res.inter_event_p50_s = _percentile(gaps, 0.5)
            res.inter_event_p99_s = _percentile(gaps, 0.99)
            res.inter_event_max_s = self._gap_max
        if self._hasher is not None:
            res.output_hash = self._hasher.hexdigest()
        elif self._text_parts or self.first_token_at is not None or self.finish_reason is not None:
            res.output_hash = xxhash.xxh3_128_hexdigest(res.text.encode())
        if self._tools:
            res.tool_calls = [
                (entry[0], "".join(entry[1:])) for _, entry in sorted(self._tools.items())
            ]
        return res

    def _finish_json(self) -> None:
        parts = self._json_parts
        if not parts or self._json_size > self._json_max:
            return
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        try:
            body = _DECODER.decode(payload)
        except _DECODE_ERRORS:
            self.parse_errors += 1
            return
        self._account(body, self._last_byte or 0.0, streamed=False)
