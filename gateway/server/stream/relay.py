"""Direct relay of a streamed answer: each upstream read written to the client as it arrives.

A streamed answer is hundreds of small reads, one per SSE event from a live engine. Forwarded by
the handler's task, every read costs a wake-up: the body stream resolves a future, the loop
schedules the task, the task resumes through `readany`, writes, and parks on a new future. Once
an answer's head and first chunk have gone out through the task, the proxy turns its body
stream into a relay: each read the upstream connection's parser hands over is metered and
written to the client's transport right there, inside the connection's `data_received`, with
no future, no task step and no coroutine. The handler's task sleeps in `readany` until the
answer ends or fails, then finishes as before.

The task takes the stream back whenever relaying would be wrong, and gives it back to the relay
once the body stream is empty again, so the byte order never changes:
- the client's transport is paused (its buffer past the high-water mark: a client reading
  slower than the engine writes) or closing: the read is queued in the body stream as usual,
  which wakes the task; the task writes the queued reads, waits for the client to drain under
  the client-write deadline (`[limits] client_write_timeout_s`), and hands back;
- the answer cannot be framed by a plain write: compressed, or with a declared length; such an
  answer is never relayed.

What it costs per read: the meter's or the watch's `feed`, one `perf_counter`, one transport
write of the chunk framed for the client (`chunked` transfer coding, or raw for HTTP/1.0), and
three attribute checks. The task's path is unchanged for the first chunk and for every read
after a hand-back; `canary_proxy_stream_reads_total{path}` counts the reads each path carried.

A mirror lane needs less: nobody reads a copy's answer but its meter, so `MeterSink` feeds each
read to the meter from the same callback and drops it; the lane's task wakes only at the end.

Both take each read's time where it arrives (in `data_received`), not when a task gets to run:
a busy loop delays the forwarding, no longer the meter's clock.

They must never await, never buffer anything of their own and never be active on a connection
that went back to the pool (`stop` runs before the upstream connection is released or dropped).
"""

from __future__ import annotations

from time import perf_counter
from typing import Protocol

from aiohttp.http_writer import StreamWriter
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from gateway.server.deadlines import Watchdog
from gateway.server.upstream import UpstreamConnection


class _Feed(Protocol):
    """The meter's and the watch's common face (`ResponseMeter`, `StreamWatch`)."""

    def feed(self, chunk: bytes, now: float) -> None: ...

    def final_event_seen(self) -> bool: ...


class _RelayedReader(StreamReader):
    """An answer's body stream while it may be relayed: the same object (the class is swapped
    in place, the parser keeps its reference), whose `feed_data` offers each read to the
    connection's relay first."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        relay = self._protocol.relay  # type: ignore[attr-defined]
        if relay is None or not relay.on or not data or not relay.push(data):
            return StreamReader.feed_data(self, data)
        return False


class Relay:
    """The relay of one answer: from the upstream connection `source` to `client`'s transport,
    metered by `feed` (if any) under the exchange's watchdog `wd`."""

    __slots__ = (
        "_client", "_feed", "_reader", "_source", "_wd", "_writer", "chunked", "delivered",
        "on", "reads",
    )  # fmt: skip

    def __init__(
        self, source: UpstreamConnection, reader: StreamReader, writer: StreamWriter,
        client: RequestHandler, feed: _Feed | None, wd: Watchdog,
    ) -> None:  # fmt: skip
        self._source = source
        self._reader = reader
        self._writer = writer
        self._client = client
        self._feed = feed
        self._wd = wd
        self.chunked = writer.chunked
        self.on = False  # reads go to the client from the callback (else queued for the task)
        self.delivered = False  # the final event was written to the client by the relay
        self.reads = 0  # reads the relay carried

    @classmethod
    def attach(
        cls, source: object, reader: StreamReader, writer: object, client: object,
        feed: _Feed | None, wd: Watchdog,
    ) -> Relay | None:  # fmt: skip
        """A relay for this answer, or None when it cannot be relayed: the connection is not
        the pool's, the body stream is not aiohttp's plain one, or the response is compressed,
        has a declared length or hooks on its writes."""
        if not (
            isinstance(source, UpstreamConnection)
            and type(reader) is StreamReader
            and isinstance(writer, StreamWriter)
            and isinstance(client, RequestHandler)
        ):
            return None
        try:  # aiohttp's private state: a release without it gets no relay, not a failure
            plain = (
                writer.length is None
                and writer._compress is None
                and writer._on_chunk_sent is None
                and writer.on_body_write is None
                and writer._headers_written
                and isinstance(client._paused, bool)
                and reader._buffer is not None
            )
        except AttributeError:
            return None
        if not plain:
            return None
        relay = cls(source, reader, writer, client, feed, wd)
        reader.__class__ = _RelayedReader
        source.relay = relay
        return relay

    def push(self, data: bytes) -> bool:
        """Relay one read (called from the upstream's `data_received`); False when the client
        cannot take it now: the relay is off and the caller queues the read for the task."""
        transport = self._client.transport
        if self._client._paused or transport is None or transport.is_closing():
            self.on = False
            return False
        now = perf_counter()
        self._wd.last = now
        feed = self._feed
        if feed is not None:
            feed.feed(data, now)
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        transport.write(data)
        self._writer.output_size += len(data)
        self.reads += 1
        if feed is not None and not self.delivered:
            self.delivered = feed.final_event_seen()
        return True

    async def resume(self) -> None:
        """After the task wrote a queued read: wait for a paused client to drain (the
        client-write deadline applies), then relay again once nothing is queued."""
        client = self._client
        if client._paused:
            wd = self._wd
            wd.writing = perf_counter()
            await self._writer.drain()
            wd.writing = 0.0
        reader = self._reader
        transport = client.transport
        if (
            not reader._buffer
            and not reader.is_eof()
            and transport is not None
            and not transport.is_closing()
        ):
            self.on = True

    def stop(self) -> None:
        """Off for good: the answer ended or failed; the connection may be reused."""
        self.on = False
        if self._source.relay is self:
            self._source.relay = None


class MeterSink:
    """A copy's answer, metered read by read from the upstream connection's callback and not
    kept: the lane's `readany` wakes only when the answer ends (or fails)."""

    __slots__ = ("_feed", "_source", "_wd", "on", "reads")

    def __init__(self, source: UpstreamConnection, feed: _Feed, wd: Watchdog) -> None:
        self._source = source
        self._feed = feed
        self._wd = wd
        self.on = True
        self.reads = 0

    @classmethod
    def attach(
        cls, source: object, reader: StreamReader, feed: _Feed, wd: Watchdog
    ) -> MeterSink | None:
        """A sink for this answer, or None when the connection or the body stream is not the
        pool's plain one (the caller reads and meters it itself)."""
        if not (isinstance(source, UpstreamConnection) and type(reader) is StreamReader):
            return None
        sink = cls(source, feed, wd)
        reader.__class__ = _RelayedReader
        source.relay = sink
        return sink

    def push(self, data: bytes) -> bool:
        now = perf_counter()
        self._wd.last = now
        self._feed.feed(data, now)
        self.reads += 1
        return True

    def stop(self) -> None:
        self.on = False
        if self._source.relay is self:
            self._source.relay = None
