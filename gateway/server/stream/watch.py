"""What the proxy needs of a stream nobody stores: its first token's time and its final event.

When no copy of an answer is stored (mirroring off, a request not sampled, a ramp's candidate
arm), the worker still needs two things of an SSE answer: when its first token arrived (the TTFT
histogram, the ramp's record) and whether the client got its final event (`[DONE]`, or choice
0's finish reason, or a Responses stream's `response.completed` / `.incomplete` / `.failed`:
an answer, not a disconnect, when the client closes right after). The full
meter (`server/meter.py`) parses every event for the text, the gaps and the token events; this
watch hands it only the reads that can change those two answers, so a stream of hundreds of
events costs a few substring searches per read once its first token has passed.

Exact, not a heuristic: until the first token every whole event is metered, one by one; after
it, only the events that contain `[DONE]` or a `"finish_reason"` key not followed by `:null` are
metered (a raw `"finish_reason"` cannot occur inside a JSON string, where quotes are escaped, so
every non-null finish reason of any spelling is caught). Events are cut at their blank line, so
the meter only ever sees whole events; a stream with CR line endings, or an event longer than
the meter's line bound, is metered whole from there on.

It must never import asyncio or aiohttp and never keep more than one partial event (bounded by
`meter.MAX_LINE_BYTES`).
"""

from __future__ import annotations

from gateway.server.meter import MAX_LINE_BYTES, ResponseMeter

_KEY = b'"finish_reason"'
_NULL = b'"finish_reason":null'
_DONE = b"[DONE]"
_DONE_END = b"[DONE]\n\n"  # a read that ends with the stream's last event
_HITS_MAX = 8  # capital Ds looked at one by one before one substring search takes over
# A Responses API stream ends with one of these events, and has no `[DONE]`.
_RESPONSES_END = (
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
)


class StreamWatch:
    """First token and final event of an SSE answer; `feed` every chunk as it arrives."""

    __slots__ = ("_final", "_meter", "_steady", "_tail", "_whole")

    def __init__(self, t0: float) -> None:
        # The meter keeps no text: nothing of it is stored.
        self._meter = ResponseMeter(t0, is_sse=True, text_max_chars=0)
        self._tail = b""
        self._whole = False  # meter every byte from here on (CR line endings, an overlong event)
        self._steady = False  # past the first token with no partial event held
        self._final = False  # the meter's final_event_seen() after the last feed

    @property
    def first_token_at(self) -> float | None:
        return self._meter.first_token_at

    def final_event_seen(self) -> bool:
        """True once the stream carried its final event: `[DONE]` or choice 0's finish reason."""
        return self._final

    def feed(self, chunk: bytes, now: float) -> None:
        """Account one received chunk (any size, any boundary) at `now` (perf_counter)."""
        if self._steady and chunk[-2:] == b"\n\n" and b"\r" not in chunk:
            # Past the first token, no partial event held, a read of whole events: the usual
            # read costs two substring counts and a memchr.
            self._final_in(chunk, now)
            self._final = self._meter.final_event_seen()
            return
        self._feed(chunk, now)
        self._final = self._meter.final_event_seen()
        self._steady = not self._tail and not self._whole and self._meter.first_token_at is not None

    def _feed(self, chunk: bytes, now: float) -> None:
        meter = self._meter
        if self._whole:
            meter.feed(chunk, now)
            return
        data = self._tail + chunk if self._tail else chunk
        if b"\r" in data:
            self._whole = True
            self._tail = b""
            meter.feed(data, now)
            return
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > MAX_LINE_BYTES:  # the meter bounds it (and counts the error)
                self._whole = True
                self._tail = b""
                meter.feed(data, now)
            else:
                self._tail = data
            return
        end += 2
        self._tail = data[end:]
        whole = data[:end] if end < len(data) else data
        if meter.first_token_at is None:  # event by event up to the first token (one or two)
            start = 0
            while start < end:
                stop = data.find(b"\n\n", start, end) + 2
                meter.feed(data[start:stop], now)
                start = stop
                if meter.first_token_at is not None:
                    break
            else:
                return
            whole = data[start:end]
        self._final_in(whole, now)

    def _final_in(self, whole: bytes, now: float) -> None:
        """Meter the events of `whole` (whole events, past the first token) that can end the
        stream. A read that ends with `[DONE]` (an answer's last read; a whole answer in one
        read) meters its last event and is done; any other is searched whole: a finish reason
        that is not null, and `[DONE]` found by memchr for its capital D (`_has_done`), where a
        substring search of an answer's 50 KB cost half the watch."""
        if whole.endswith(_DONE_END):
            self._meter_ends(whole, now, False)
            if self._meter.final_event_seen():
                return
        if self._meter.responses:
            # A Responses stream (the meter saw its events up to the first token) ends with
            # its terminal event, the last of the read that carries it: only that is looked at.
            last = whole.rfind(b"\n\n", 0, len(whole) - 2) + 2
            if whole.startswith(_RESPONSES_END, last if last > 1 else 0):
                self._meter.feed(whole[last if last > 1 else 0 :], now)
            return
        ends = whole.count(_KEY) != whole.count(_NULL)  # a finish reason that is not null
        if ends or _has_done(whole):
            self._meter_ends(whole, now, ends)

    def _meter_ends(self, whole: bytes, now: float, ends: bool) -> None:
        """Meter the events of `whole` (whole events) that can end the stream, the last one
        first, until one does (choice 0's finish reason, or `[DONE]`)."""
        meter = self._meter
        stop = len(whole)
        while not meter.final_event_seen():
            at = whole.rfind(_DONE, 0, stop)
            if ends:
                key = whole.rfind(_KEY, 0, stop)
                while key >= 0 and whole.startswith(_NULL, key):
                    key = whole.rfind(_KEY, 0, key)
                ends = key >= 0
                at = max(at, key)
            if at < 0:
                return
            start = whole.rfind(b"\n\n", 0, at)
            start = 0 if start < 0 else start + 2
            meter.feed(whole[start:stop], now)
            stop = start


def _has_done(data: bytes) -> bool:
    """Whether `[DONE]` occurs in `data`: its capital D found by memchr and each hit looked at;
    past `_HITS_MAX` hits (a text of capitals) one substring search of the rest decides."""
    at = data.find(b"D", 1)
    hits = 0
    while at >= 0:
        if data.startswith(_DONE, at - 1):
            return True
        hits += 1
        if hits == _HITS_MAX:
            return data.find(_DONE, at) >= 0
        at = data.find(b"D", at + 1)
    return False
