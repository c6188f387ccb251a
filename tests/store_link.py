"""A TCP forwarder between gateways and PostgreSQL that a test can cut and restore, for the
store-loss tests (tests/control/test_store_loss.py, tests/process/test_rollout_store_loss.py).

It listens on 127.0.0.1:0 and forwards every connection to the database's host and port. `cut`
resets every open connection and, until `restore`, resets each new one as soon as it is
accepted: what a client sees when the server's host goes away and comes back (errors at once,
not hangs). The machine's PostgreSQL server keeps running for everyone else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sqlalchemy.engine import make_url

_CHUNK = 65536


class StoreLink:
    """One forwarder; `url(db_url)` is `db_url` routed through it."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.up = True
        self.port = 0
        self.refused = 0  # connections reset while cut

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, db_url: str) -> str:
        """`db_url` with its host and port replaced by this forwarder's."""
        return make_url(db_url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def cut(self) -> None:
        """Reset every open connection; refuse new ones until `restore`."""
        self.up = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.up = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        if not self.up:  # cut while connecting
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        loop = asyncio.get_running_loop()
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = loop.create_task(self._pump(src, dst, (writer, up_writer)))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await src.read(_CHUNK):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end both (the other pump then sees EOF or a reset).
            for w in pair:
                self._writers.discard(w)
                w.transport.abort()


@contextlib.asynccontextmanager
async def store_link(db_url: str) -> AsyncIterator[StoreLink]:
    """A started forwarder to `db_url`'s server, closed (every connection reset) at the end."""
    url = make_url(db_url)
    link = StoreLink(url.host or "127.0.0.1", url.port or 5432)
    await link.start()
    try:
        yield link
    finally:
        await link.close()
