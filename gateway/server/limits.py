"""How many client and upstream connections fit the process's file descriptor limit.

A proxied request holds two descriptors: its client connection and one pooled connection to
the live endpoint. aiohttp serves one request at a time per client connection, so the live
endpoint's pool never holds more connections in use than there are client connections, and its
idle ones are closed after `upstream_keepalive_s`: the upstream pool needs at most as many
descriptors as the client connections it serves. `plan_limits` splits what the limit leaves
(after a reserve for listeners, the database, the mirror channel and logs) between the two so
that every client connection can have a request in flight, and never below a floor that keeps
the gateway useful (on a limit too small even for that, it says so). `fit_file_limit` first
raises the soft limit towards what the configuration asks when the hard limit allows.

Pure but for `fit_file_limit`'s two system calls; it must never be called per request.
"""

from __future__ import annotations

import contextlib
import resource
from typing import NamedTuple

# Descriptors kept for everything but client and upstream connections: the listeners, the
# database (an aiosqlite file or a PostgreSQL pool), the mirror channel, logs, the event loop's
# own. An eighth of the limit, at least 64 (a worker opens ~30 at start-up) and at most 256.
RESERVE_MIN = 64
RESERVE_MAX = 256
# Below these the gateway is of little use; on a limit too small for them it runs with them
# anyway (and says so) rather than serve one client at a time.
FLOOR_CLIENTS = 32
FLOOR_UPSTREAM = 16


class EdgeLimits(NamedTuple):
    """The limits in force, and the descriptor limit they were sized from."""

    nofile: int  # the soft RLIMIT_NOFILE in force
    max_connections: int  # client connections on the proxy listener
    upstream_max_connections: int  # the live endpoint's pool (0 = unlimited)
    admin_max_connections: int  # the admin listener's own (0: served under /admin)
    reserve: int  # descriptors kept for everything else
    lowered: bool  # a configured limit was lowered to fit
    enough: bool  # False when even the floor does not fit the descriptor limit


def reserve_for(nofile: int) -> int:
    return min(RESERVE_MAX, max(RESERVE_MIN, nofile // 8))


def descriptors_wanted(max_connections: int, upstream: int, admin: int) -> int:
    """Descriptors the configured limits need at most, reserve included."""
    pool = min(upstream or max_connections, max_connections)
    return max_connections + pool + admin + RESERVE_MAX


def plan_limits(nofile: int, *, max_connections: int, upstream: int, admin: int) -> EdgeLimits:
    """Connection limits that fit `nofile` descriptors.

    `upstream` is `upstream_max_connections` (0 = unlimited), `admin` the admin listener's limit
    (0 when the admin API is served under /admin). When the configuration fits, it is kept.
    Otherwise the pool is capped to what client connections can use and the rest split so that
    clients get at least half: `clients + pool + admin + reserve <= nofile`.
    """
    reserve = reserve_for(nofile)
    usable = nofile - reserve - admin
    pool_need = min(upstream or max_connections, max_connections)
    if max_connections + pool_need <= usable:
        return EdgeLimits(nofile, max_connections, upstream, admin, reserve, False, True)
    clients = min(max_connections, max(usable - pool_need, usable // 2))
    pool = min(pool_need, usable - clients)
    enough = clients >= FLOOR_CLIENTS and pool >= FLOOR_UPSTREAM
    clients, pool = max(clients, FLOOR_CLIENTS), max(pool, FLOOR_UPSTREAM)
    return EdgeLimits(nofile, clients, pool, admin, reserve, True, enough)


def fit_file_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `needed` when the hard limit allows; return the
    soft limit now in force (connections beyond it would fail accept() for everyone)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return needed
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return needed if soft == resource.RLIM_INFINITY else soft
