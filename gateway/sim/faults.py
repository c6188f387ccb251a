"""The injected faults that replace an answer or misuse the socket.

A fault profile exists so proxy tests can prove isolation: a candidate that hangs, resets the
connection, streams garbage, answers 500 or stalls reading must not disturb production. The
`reset-mid-stream` and `slow-drip` faults live in the generation loop (they need its timing);
everything that replaces the answer outright lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct

from aiohttp import web

from gateway.sim import protocol
from gateway.sim.state import ClientGone, SimState, pause

MAX_BODY_BYTES = 64 * 1024 * 1024  # long prompts are legitimate; beyond this answer 413
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
_GARBAGE_CHUNKS, _GARBAGE_CHUNK_BYTES = 8, 256
_NOT_LINE_BREAKS = bytes(b for b in range(256) if b not in b"\r\n")


def json_error(status: int, message: str, type_: str = "BadRequestError") -> web.Response:
    """An OpenAI-shaped error response."""
    body = protocol.error_body(message, type_, status)
    return web.Response(body=body, status=status, content_type="application/json")


async def read_body(request: web.Request, st: SimState) -> bytes:
    """The request body; `slow-read` takes it one byte at a time with a sleep after each."""
    if st.profile.fault != "slow-read":
        return await request.read()
    delay = st.scaled(st.profile.slow_read_s_per_byte)
    buf = bytearray()
    while byte := await request.content.read(1):
        buf += byte
        if len(buf) > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=len(buf))
        if delay > 0:
            await asyncio.sleep(delay)
    return bytes(buf)


async def reset_connection(request: web.BaseRequest) -> None:
    """Abort the TCP connection with a RST (SO_LINGER 0), not a clean FIN."""
    # Give the client a moment to read what was already sent: a RST makes the peer's kernel
    # drop data still queued for it.
    await asyncio.sleep(0.02)
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def replace_answer(request: web.Request, st: SimState) -> web.StreamResponse | None:
    """Answer a generation route with the profile's fault, or None to answer normally."""
    fault = st.profile.fault
    if fault == "error-500":
        st.stats.faulted += 1
        return json_error(500, "simulated engine failure", "InternalServerError")
    if fault == "garbage":
        st.stats.faulted += 1
        return await _garbage(request, st)
    if fault == "hang":
        st.enter()
        try:
            await pause(request, math.inf)
        except asyncio.CancelledError:  # the server cancels handlers whose client left
            st.stats.aborted += 1
            raise
        except ClientGone:
            st.stats.aborted += 1
        finally:
            st.stats.active -= 1
        return web.Response()
    return None


async def _garbage(request: web.Request, st: SimState) -> web.StreamResponse:
    """A 200 event stream whose body is random bytes with no line breaks: never a valid event."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    gap = st.scaled(0.01)
    with contextlib.suppress(ConnectionError, ClientGone):
        for _ in range(_GARBAGE_CHUNKS):
            chunk = bytes(st.rng.choices(_NOT_LINE_BREAKS, k=_GARBAGE_CHUNK_BYTES))
            await resp.write(chunk)
            await pause(request, gap)
        await resp.write_eof()
    return resp
