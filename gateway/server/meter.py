"""Passive response meter: watches a response's bytes as they pass, never copies the stream.

`ResponseMeter` is a pure, incremental parser: the proxy (and the mirror dispatcher, on candidate
responses) calls `feed(chunk, now)` on every chunk and `finish(now, status)` once, and gets a
`MeterResult` with TTFT, E2E, inter-event latency, the engine's usage, the token events, finish
reason, tool calls, the output text up to a bound and an xxh3_128 hash of all of it (vLLM
`bench serve` conventions; docs/metrics.md). It reads chat and text completions and the
Responses API (`/v1/responses`: its events and shapes in `server/stream/responses.py`) alike,
so it needs no route: a streamed event with an `event:` line is a Responses event (chat and
completions chunks have none), a whole answer with `output` a Responses answer.

An SSE event is not a token: vLLM puts several tokens into one event whenever its engine runs
ahead of its API server's stream, and how often depends on the engine's load. So the meter
counts events (`token_events`) and keeps the engine's `usage` as information, and leaves
`output_tokens` and TPOT to the mirror plane's token counter, which counts every arm's text with
one tokenizer (gateway/mirror/replay/tokens.py). Gaps are between events (inter-event latency),
over the token span, not per read: several events that arrive in one read share one timestamp,
so the gap before a read is spread over the events it carried (`server/stream/gaps.py`). When every
event came in one read the span is below the clock's resolution: the result says
`timing_unresolved` and leaves the inter-event gaps None, never 0.

It must never import asyncio or aiohttp, never block, never keep more than a bounded amount of
the response (a partial SSE line, the text up to its limit, a non-SSE body up to `json_max_bytes`).
"""

from __future__ import annotations

import time

import msgspec
import xxhash

from domain.observation import Measured
from gateway.server.stream import responses as rsp
from gateway.server.stream.chat import CHUNK_DECODER, WHOLE_DECODER, Body, ToolCall
from gateway.server.stream.gaps import TokenTimes
from gateway.server.stream.responses import Details, Event, Item, Usage


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
    # (name, arguments as emitted, call id or None), in index order: chat's `tool_calls[i]`
    # (the id from the call's first delta, or `message.tool_calls[i].id`), or the Responses
    # API's `function_call` items in output order (their `call_id`).
    tool_calls: list[tuple[str, str, str | None]] | None = None
    parse_errors: int = 0  # events that were not valid JSON (garbage)
    saw_done: bool = False  # `data: [DONE]` seen
    bytes_total: int = 0


_EVENT_DECODER = msgspec.json.Decoder(Event)
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_DONE = b"[DONE]"
_SSE_FIELDS = (b"event", b"id", b"retry")  # recognised and ignored; `data` is handled apart
# A line this long without a newline is not SSE from an engine; dropped so memory stays bounded.
MAX_LINE_BYTES = 1 << 20
# Non-SSE bodies are kept (as references to the received chunks) up to this size for parsing.
JSON_MAX_BYTES = 16 << 20
# Two instants closer than this cannot be told apart (1 ns for perf_counter on Linux).
CLOCK_RESOLUTION_S = time.get_clock_info("perf_counter").resolution


class ResponseMeter(TokenTimes):
    """Incremental meter of one response; `feed` every chunk, then `finish` once.

    Text, finish reason and tool calls are those of choice index 0; a chunk counts as carrying
    tokens when any choice has non-empty content, text, reasoning or a tool-call fragment.
    """

    __slots__ = (
        "_data",
        "_first_byte",
        "_hasher",
        "_items",
        "_json_max",
        "_json_parts",
        "_json_size",
        "_kind",
        "_last_byte",
        "_pending_cr",
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
        "is_sse",
        "parse_errors",
        "prompt_tokens",
        "responses",
        "saw_done",
        "t0",
        "text_truncated",
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
        super().__init__()
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
        self._text_parts: list[str] = []
        self._text_len = 0
        self._hasher: xxhash.xxh3_128 | None = None  # set once the text outgrows its limit
        # index -> [name, call id, argument fragments...] ("" while unknown)
        self._tools: dict[int, list[str]] | None = None
        self._items: dict[str, int] | None = None  # a Responses item id -> its output index
        self._kind: bytes | None = None  # the current event's `event:` line (Responses)
        self.responses = False  # a Responses API event was seen: the stream is one
        self.text_truncated = False
        self.bytes_total = 0
        self.chunk_count = 0
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
        elif not self._data and data[:6] == b"data: " and self._kind is None:
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
        decode = CHUNK_DECODER.decode
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
        elif name == b"event":
            kind = value[1:] if value[:1] == b" " else value
            # Only the Responses API's names select its decoder (`message` is SSE's default).
            if kind[:9] == b"response." or kind == b"error":
                self._kind = kind
        elif not colon or name not in _SSE_FIELDS:
            self.parse_errors += 1  # not an SSE line at all: garbage

    def _dispatch(self, now: float) -> None:
        parts = self._data
        if not parts:
            self._kind = None
            return
        payload = parts[0] if len(parts) == 1 else b"\n".join(parts)
        parts.clear()
        self.chunk_count += 1
        kind = self._kind
        if kind is not None:  # a Responses event
            self._kind = None
            self.responses = True
            if kind in rsp.SKIPPED:  # carries nothing the meter reads: not decoded
                return
            try:
                event = _EVENT_DECODER.decode(payload)
            except _DECODE_ERRORS:
                self.parse_errors += 1
                return
            if event.usage is not None:
                self._usage(event.usage)
            if self._event(event):
                self._tokens(1, now)
            return
        if payload == _DONE:
            self.saw_done = True
            return
        try:
            body = CHUNK_DECODER.decode(payload)
        except _DECODE_ERRORS:
            self.parse_errors += 1
            return
        self._account(body, now, streamed=True)

    def _account(self, body: Body, now: float, *, streamed: bool) -> None:
        if self._content(body, streamed):
            if streamed:
                self._tokens(1, now)
            elif self.first_token_at is None:
                self.first_token_at = self._first_byte

    def _content(self, body: Body, streamed: bool) -> bool:
        """Take usage, choice 0's text, tool calls and finish reason from one event (or a whole
        response); True when any choice carried tokens."""
        usage = body.usage
        if usage is not None:
            self._usage(usage)
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

    def _usage(self, usage: Usage) -> None:
        prompt = usage.prompt_tokens if usage.input_tokens is None else usage.input_tokens
        if prompt is not None:
            self.prompt_tokens = prompt
        out = usage.completion_tokens if usage.output_tokens is None else usage.output_tokens
        if out is not None:
            self.completion_tokens = out
        details = usage.prompt_tokens_details or usage.input_tokens_details
        if details is not None and details.cached_tokens is not None:
            self.cached_tokens = details.cached_tokens

    # ------------------------------------------------------------------ the Responses API

    def _event(self, body: Event) -> bool:
        """One Responses stream event; True when it carried output (a delta)."""
        kind = body.type
        if kind in rsp.TOKEN_EVENTS:
            if kind in rsp.TEXT_DELTAS:
                if body.delta:
                    self._add_text(body.delta)
            elif kind == rsp.ARGUMENT_DELTA and body.delta:
                self._call(body.output_index, body.item_id).append(body.delta)
            return True
        if kind == rsp.ITEM_ADDED or kind == rsp.ITEM_DONE:
            item = body.item
            if item is not None and item.type == rsp.FUNCTION_CALL:
                entry = self._call(body.output_index, item.id)
                self._named(entry, item, final=kind == rsp.ITEM_DONE)
        elif kind == rsp.ARGUMENTS_DONE:
            if body.arguments:
                entry = self._call(body.output_index, body.item_id)
                del entry[2:]
                entry.append(body.arguments)
        elif kind in rsp.TERMINAL:
            response = body.response
            if response is None:  # a terminal event without its response: it still ends it
                self.finish_reason = rsp.FAILED if kind == "response.failed" else "stop"
                return False
            if response.usage is not None:
                self._usage(response.usage)
            self._finished(response.output, response.status, response.incomplete_details)
        elif kind == rsp.ERROR_EVENT and self.finish_reason is None:
            self.finish_reason = rsp.FAILED
        return False

    def _call(self, index: int | None, item_id: str | None) -> list[str]:
        """The entry of the function call at `index` (or, without one, of item `item_id`)."""
        tools = self._tools
        if tools is None:
            tools = self._tools = {}
        items = self._items
        if items is None:
            items = self._items = {}
        if index is None:
            index = items.get(item_id or "", len(tools))
        if item_id and item_id not in items:
            items[item_id] = index
        entry = tools.get(index)
        if entry is None:
            entry = tools[index] = ["", ""]
        return entry

    def _named(self, entry: list[str], item: Item, *, final: bool) -> None:
        """Name and call id from a `function_call` item; its arguments when it is the final one
        (`output_item.done`, or a whole answer's) and carries any."""
        if item.name and not entry[0]:
            entry[0] = item.name
        if item.call_id and not entry[1]:
            entry[1] = item.call_id
        if final and item.arguments:
            del entry[2:]
            entry.append(item.arguments)

    def _finished(
        self, output: list[Item] | None, status: str | None, details: Details | None
    ) -> None:
        """The finish reason from a response's status; calls it lists that no event announced
        (a stream that skipped them) are taken from its output."""
        calls = bool(self._tools)
        if output:
            for index, item in enumerate(output):
                if item.type == rsp.FUNCTION_CALL:
                    calls = True
                    if self._tools is None or index not in self._tools:
                        self._named(self._call(index, item.id), item, final=True)
        reason = rsp.finish_reason(status, details, calls)
        self.finish_reason = reason if reason is not None else self.finish_reason

    def _response(self, output: list[Item], status: str | None, details: Details | None) -> bool:
        """A whole (non-streamed) Responses answer: its text, calls and status; True when it
        carried output."""
        token = False
        for item in output:
            if item.type == rsp.MESSAGE:
                text = rsp.item_text(item)
                if text:
                    token = True
                    self._add_text(text)
            elif item.type == rsp.FUNCTION_CALL or item.type == "reasoning":
                token = True
        self._finished(output, status, details)
        return token

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

    def _add_tools(self, calls: list[ToolCall]) -> None:
        tools = self._tools
        if tools is None:
            tools = self._tools = {}
        for pos, call in enumerate(calls):
            index = pos if call.index is None else call.index
            entry = tools.get(index)
            if entry is None:
                entry = tools[index] = ["", ""]
            if call.id and not entry[1]:
                entry[1] = call.id
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
        if not res.timing_unresolved:
            self._put_gaps(res)
        if self._hasher is not None:
            res.output_hash = self._hasher.hexdigest()
        elif self._text_parts or self.first_token_at is not None or self.finish_reason is not None:
            res.output_hash = xxhash.xxh3_128_hexdigest(res.text.encode())
        if self._tools:
            res.tool_calls = [
                (entry[0], "".join(entry[2:]), entry[1] or None)
                for _, entry in sorted(self._tools.items())
            ]
        return res

    def _finish_json(self) -> None:
        parts = self._json_parts
        if not parts or self._json_size > self._json_max:
            return
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        try:
            body = WHOLE_DECODER.decode(payload)
        except _DECODE_ERRORS:
            self.parse_errors += 1
            return
        if body.output is not None:  # a Responses answer
            if body.usage is not None:
                self._usage(body.usage)
            if self._response(body.output, body.status, body.incomplete_details):
                self.first_token_at = self._first_byte
            return
        self._account(body, self._last_byte or 0.0, streamed=False)
