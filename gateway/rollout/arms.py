"""The ramp's routing core: which arm (0 production, 1 candidate) serves a session, for its life.

`SessionArms` is the host's session memory: a fixed-size table in a named shared-memory file,
created by the supervisor before it spawns the workers and opened by path in each of them (they
are spawned, not forked: an anonymous mapping would not be inherited). `ArmRouter` holds the
split as one immutable `Split` snapshot that the control plane swaps whole, and answers
`arm_for(session_key)` synchronously, in O(1), from the key alone.

The rules: a session stays on the arm it started on; only new sessions follow the weight, which
only rises within a rollout; a rollback is a new generation at weight 0, which sends every
session to production at once without touching the table. Sessions that started before a
rollout began stay on production: the router records every session, even with no rollout (a
table entry of another generation means production). That costs ~1.2 µs for a known session and
~3.5 µs for a new one (bench/arms.py), against a hash alone's 0.1 µs; forgetting them would move
a share of the sessions in flight to the candidate the moment a ramp starts, mid-conversation.

`ArmGuard` is a worker's fast guard on the candidate's outcomes (consecutive failures, a burst
of them): it says when to send everything back to production without waiting for a report.

Pure Python over mmap and xxhash: no asyncio, no aiohttp, no IO after `create`/`open`, nothing
allocated per request but the key's bytes and a bucket's tuple. It must never block nor log.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from dataclasses import dataclass, field, replace
from typing import Literal

import xxhash

from domain.errors import CanaryError, ConfigError, UsageError

# 2**20 slots of 8 bytes: an 8 MiB file for ~1 M live sessions. A replica rarely starts more than
# a few hundred sessions a second and the slots of sessions idle past the TTL are reused first, so
# 1 M live ones is an hour of 300 new sessions a second. With two buckets per session, no live
# session is forgotten up to 75 % full, ~0.6 % of them at 90 % (measured on 2**16 slots); past
# that the stalest of a new session's 16 slots is (`evicted`, the table-full count). A forgotten
# session is decided again from the same hash, so it moves only if it was on production and the
# weight rose since. 8 MiB of /dev/shm is nothing against an engine's memory; a host expecting
# more live sessions raises `slots`.
DEFAULT_SLOTS = 1 << 20
# A session unseen for this long is gone: its slot may be reused without counting an eviction.
DEFAULT_TTL_S = 3600.0
# The last-seen stamp counts ticks of this many seconds in 16 bits, so it wraps after ~6 days,
# far beyond any TTL; a coarse tick also means a session's slot is rewritten at most once a tick,
# not once a request (fewer cache lines bounced between the workers' cores).
TICK_S = 8.0
# One bucket is 8 slots = 64 bytes, one cache line: a lookup reads at most two lines.
BUCKET = 8

_MAGIC = b"CNRYARM1"
_HEADER = struct.Struct("@8sQQQ")  # magic, slots, ttl in ticks, bucket size
_BUCKET_WORDS = struct.Struct(f"@{BUCKET}Q")  # native: each word copied whole, never torn
# An odd 32-bit constant (the golden ratio's) spreading a fingerprint over the bucket indexes.
_SPREAD = 0x9E3779B1
_HEADER_SIZE = 64  # keeps the slots cache-line aligned (the mapping itself is page-aligned)

# One slot, one native 64-bit word (an aligned 8-byte load or store is atomic on x86-64 and
# aarch64; memoryview's "Q" items are copied as one word): 0 = empty, else
#   bits 32-63 fingerprint (the high half of the session hash; never 0)
#   bits 17-31 generation of the rollout the session started in (mod 2**15)
#   bit  16    arm
#   bits 0-15  last-seen tick (mod 2**16)
_STAMP_MASK = 0xFFFF
_GEN_MASK = 0x7FFF
_KEEP_ALL_BUT_STAMP = ~_STAMP_MASK & 0xFFFF_FFFF_FFFF_FFFF

Arm = Literal[0, 1]
PRODUCTION: Arm = 0
CANDIDATE: Arm = 1

SplitState = Literal["idle", "ramping", "rolled_back"]


def _map(fd: int, size: int) -> mmap.mmap:
    # MAP_POPULATE (Linux) maps every page at once, so no request pays a minor fault either.
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)


def tick(now: float | None = None) -> int:
    """The coarse stamp of `now` (CLOCK_MONOTONIC, shared by every process of the host)."""
    return int((time.monotonic() if now is None else now) / TICK_S) & _STAMP_MASK


class SessionArms:
    """The host's session -> (generation, arm) memory, shared by every worker through one file.

    Races between workers are benign by construction: two workers inserting the same new session
    write the same word (same fingerprint, generation and arm, computed from the same snapshot);
    a store that overwrites another worker's fresh entry loses only that memory, and the session
    is decided again from the same hash (so it changes arm only if the weight rose meanwhile and
    it was on production). Counters are this process's own plain ints.
    """

    __slots__ = (
        "_bucket_mask",
        "_mm",
        "_owner",
        "_ttl",
        "_words",
        "evicted",
        "inserted",
        "path",
        "reclaimed",
        "slots",
    )

    def __init__(self, path: str, mm: mmap.mmap, *, owner: bool) -> None:
        magic, slots, ttl, bucket = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC or bucket != BUCKET or len(mm) != _HEADER_SIZE + 8 * slots:
            mm.close()
            raise CanaryError(f"{path} is not a session-arms table")
        self.path = path
        self.slots: int = slots
        self._mm = mm
        self._owner = owner
        self._ttl: int = ttl
        self._bucket_mask = (slots - 1) & ~(BUCKET - 1)
        self._words = memoryview(mm)[_HEADER_SIZE:].cast("Q")
        self.inserted = 0  # sessions first seen by this process
        self.evicted = 0  # live sessions forgotten because their bucket was full
        self.reclaimed = 0  # slots of sessions idle past the TTL, reused

    @classmethod
    def create(
        cls, path: str, *, slots: int = DEFAULT_SLOTS, ttl_s: float = DEFAULT_TTL_S
    ) -> SessionArms:
        """Create the table's file (it must not exist) and map it; `close` will unlink it."""
        if slots < 2 * BUCKET or slots & (slots - 1):
            raise ConfigError(
                f"session arms: slots must be a power of two >= {2 * BUCKET}: {slots}"
            )
        ttl = int(ttl_s / TICK_S)
        if not 1 <= ttl < _STAMP_MASK // 2:
            raise ConfigError(f"session arms: ttl_s must be {TICK_S} s to ~3 days: {ttl_s}")
        size = _HEADER_SIZE + 8 * slots
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Zero-filled (every slot empty) and allocated now: a sparse tmpfs file would take
            # its page faults on the hot path, and a full /dev/shm would kill a worker with
            # SIGBUS on first write instead of failing here.
            os.posix_fallocate(fd, 0, size)
            mm = _map(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        _HEADER.pack_into(mm, 0, _MAGIC, slots, ttl, BUCKET)
        return cls(path, mm, owner=True)

    @classmethod
    def open(cls, path: str) -> SessionArms:
        """Map an existing table by its path (a worker's side); `close` leaves the file."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER_SIZE:
                raise CanaryError(f"{path} is not a session-arms table")
            mm = _map(fd, size)
        finally:
            os.close(fd)
        return cls(path, mm, owner=False)

    def close(self) -> None:
        """Unmap; the creator also removes the file."""
        if self._mm.closed:
            return
        self._words.release()
        self._mm.close()
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> SessionArms:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def remember(self, h: int, generation: int, stamp: int, arm: int) -> int:
        """The arm of session `h` as of `generation`: its own if it started in that generation,
        production if it started in another; a session unknown (or idle past the TTL) starts now
        on `arm`. Stamps the session as seen at `stamp`."""
        fp = (h >> 32) or 1
        first = h & self._bucket_mask
        # Two buckets per session (the second derived from the fingerprint, as in cuckoo
        # hashing): a new session goes where there is room, so buckets overflow only near a
        # full table instead of at half of it.
        second = first ^ (((fp * _SPREAD) & self._bucket_mask) or BUCKET)
        ttl = self._ttl
        mm = self._mm
        unpack = _BUCKET_WORDS.unpack_from
        for start in (first, second):
            i = start
            bucket: tuple[int, ...] = unpack(mm, _HEADER_SIZE + 8 * start)
            for w in bucket:
                if w >> 32 == fp:
                    age = (stamp - w) & _STAMP_MASK
                    if age <= ttl:
                        if age:
                            self._words[i] = (w & _KEEP_ALL_BUT_STAMP) | stamp
                        if (w >> 17) & _GEN_MASK == generation & _GEN_MASK:
                            return (w >> 16) & 1
                        return PRODUCTION
                i += 1
        self._insert(
            first, second, (fp << 32) | ((generation & _GEN_MASK) << 17) | (arm << 16), stamp
        )
        return arm

    def _insert(self, first: int, second: int, entry: int, stamp: int) -> None:
        """Store a new session in an empty or dead slot of the emptier of its two buckets (the
        balanced-allocation choice); if all 16 slots are live, in place of the stalest."""
        words = self._words
        ttl = self._ttl
        stalest = first
        stalest_age = -1
        best = -1
        best_room = 0
        mm = self._mm
        for start in (first, second):
            room = 0
            slot = -1
            i = start
            bucket: tuple[int, ...] = _BUCKET_WORDS.unpack_from(mm, _HEADER_SIZE + 8 * start)
            for w in bucket:
                age = (stamp - w) & _STAMP_MASK
                if not w or age > ttl:
                    room += 1
                    if slot < 0:
                        slot = i
                elif age > stalest_age:
                    stalest_age = age
                    stalest = i
                i += 1
            if room > best_room:
                best_room = room
                best = slot
        self.inserted += 1
        if best < 0:
            best = stalest
            self.evicted += 1
        elif words[best]:
            self.reclaimed += 1
        words[best] = entry | stamp

    def live(self, stamp: int) -> int:
        """How many sessions the table holds at `stamp` (a scan: for tests and gauges only)."""
        ttl = self._ttl
        return sum(1 for w in self._words if w and (stamp - w) & _STAMP_MASK <= ttl)


@dataclass(frozen=True, slots=True)
class Split:
    """One state of the ramp, swapped whole. `generation` changes when a rollout starts and when
    it is rolled back or aborted, never between steps; `salt` seeds the hash that splits new
    sessions; `weight` is the share of new sessions sent to `candidate` (any object the proxy
    routes to: the table stores only the arm)."""

    generation: int
    salt: int = 0
    weight: float = 0.0
    candidate: object = None
    state: SplitState = "idle"
    # A new session goes to the candidate when its salted 64-bit hash is below this.
    threshold: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise UsageError(f"rollout weight must be within [0, 1]: {self.weight}")
        if self.weight and (self.candidate is None or self.state != "ramping"):
            raise UsageError("a rollout weight above 0 needs a candidate and state 'ramping'")
        object.__setattr__(self, "threshold", round(self.weight * 2**64))

    def step(self, weight: float) -> Split:
        """The next step of this rollout: same generation and salt, a weight that only rises."""
        if weight < self.weight:
            raise UsageError(f"a rollout's weight only rises ({self.weight} -> {weight})")
        return replace(self, weight=weight)

    def held(self) -> Split:
        """New sessions to production while the store is lost (`gateway.control.registry`); the
        same generation, so sessions already on the candidate keep it."""
        return replace(self, weight=0.0)

    def rolled_back(self) -> Split:
        """Everything back to production at once: a new generation at weight 0."""
        return Split(self.generation + 1, state="rolled_back")


class ArmRouter:
    """Per request: `arm_for(session_key)`. Per control-plane change: `swap(rollout)`.

    The snapshot is one attribute, read once per call: a swap from the event loop's thread is
    atomic with respect to every decision.
    """

    __slots__ = ("_rollout", "_table", "candidate", "production")

    def __init__(self, table: SessionArms, rollout: Split | None = None) -> None:
        self._table = table
        self._rollout = rollout if rollout is not None else Split(0)
        self.production = 0  # decisions per arm
        self.candidate = 0

    @property
    def rollout(self) -> Split:
        return self._rollout

    def swap(self, rollout: Split) -> None:
        """Install the control plane's new snapshot. Within a generation the weight only rises
        and the salt and candidate stay (a forgotten session is decided again by the same hash,
        and the table's arm means the same target), except to 0 (a hold: `Split.held`); a
        generation never goes back."""
        current = self._rollout
        same = rollout.generation == current.generation
        if rollout.generation < current.generation or (
            same
            and (
                0 < rollout.weight < current.weight
                or rollout.salt != current.salt
                or rollout.candidate != current.candidate
            )
        ):
            raise UsageError(
                f"rollout {rollout.generation} at {rollout.weight} cannot follow "
                f"{current.generation} at {current.weight} (same generation: the weight only "
                "rises, salt and candidate stay)"
            )
        self._rollout = rollout

    def arm_for(self, session_key: str) -> int:
        """0 (production) or 1 (candidate) for this session, sticky for its life."""
        r = self._rollout
        key = session_key.encode("utf-8", "surrogateescape")  # a header's wire bytes
        h = xxhash.xxh3_64_intdigest(key)  # unsalted: where the session lives, in any rollout
        stamp = int(time.monotonic() / TICK_S) & _STAMP_MASK  # tick(), inlined
        if not r.threshold:
            # No rollout, or rolled back: production, but remember the session so that a ramp
            # starting later leaves it there. Held: a session already on the candidate keeps it.
            if self._table.remember(h, r.generation, stamp, PRODUCTION) and r.candidate is not None:
                self.candidate += 1
                return CANDIDATE
            self.production += 1
            return PRODUCTION
        new_arm = xxhash.xxh3_64_intdigest(key, r.salt) < r.threshold
        if self._table.remember(h, r.generation, stamp, new_arm):
            self.candidate += 1
            return CANDIDATE
        self.production += 1
        return PRODUCTION

    def counters(self) -> dict[str, int]:
        """This process's counts, for /metrics."""
        t = self._table
        return {
            "production": self.production,
            "candidate": self.candidate,
            "new_sessions": t.inserted,
            "evicted": t.evicted,
            "reclaimed": t.reclaimed,
        }


# Guard trip reasons (the `reason` label of canary_rollout_rollbacks_total and of the trip).
GUARD_CONSECUTIVE = "guard_consecutive"
GUARD_BURST = "guard_burst"


class ArmGuard:
    """A worker's fast guard on the candidate arm: `consecutive` failures in a row, or `burst`
    failing sessions among its last `window` counted requests, trip it, once per generation. It
    only counts: the caller swaps the router to `rolled_back()` and reports the trip. A failure
    is the candidate's (5xx, connect, reset, timeout), never a client going away.

    The consecutive guard sees every request, so a dead candidate (every request failing) trips
    it within `consecutive` requests. The burst guard counts sessions: a later failure of a
    session whose failure is still in the window is neither a failure nor a success for it (a
    failing three-turn session is one failing session, not three), so its false trips stay
    within the rollout's error budget (`evaluators.rollout.guards`). A request without a
    session (`session=None`) is its own session.
    """

    __slots__ = (
        "_failing",
        "_generation",
        "_last",
        "_pos",
        "_ring",
        "_seen",
        "_streak",
        "burst",
        "consecutive",
        "tripped",
        "window",
    )

    def __init__(self, *, consecutive: int, window: int, burst: int) -> None:
        if min(consecutive, window, burst) < 1 or burst > window:
            raise ConfigError(
                f"rollout guard: need 1 <= burst ({burst}) <= window ({window}) and "
                f"consecutive ({consecutive}) >= 1"
            )
        self.consecutive = consecutive
        self.window = window
        self.burst = burst
        # The last `window` counted requests: None for a success, else the failing session's
        # hash (a unique object for a request without one); the oldest is overwritten.
        self._ring: list[object] = [None] * window
        # The sessions whose failure is in the ring (at most `window`: bounded with it).
        self._failing: set[object] = set()
        self._generation = -1
        self._pos = 0
        self._seen = 0
        self._streak = 0
        self.tripped = 0  # trips of this process, all generations
        self._last = (0, 0, 0)

    def observe(self, generation: int, failed: bool, session: int | None = None) -> str | None:
        """Count one candidate outcome of `generation` for `session` (its hash); the trip's
        reason the first time the guard trips for it, else None (also once it has tripped)."""
        if generation < self._generation:
            # A stream of an older rollout ending after a newer one began: generations only
            # grow, and an old outcome must not reset (or trip) the newer one's guard.
            return None
        if generation != self._generation:
            self._generation = generation
            self._ring = [None] * self.window
            self._failing.clear()
            self._pos = self._seen = self._streak = 0
        elif self._streak < 0:  # tripped for this generation already
            return None
        self._streak = self._streak + 1 if failed else 0
        failing = self._failing
        key: object = object() if session is None else session
        if not (failed and key in failing):
            ring = self._ring
            pos = self._pos
            old = ring[pos]
            if old is not None:
                failing.discard(old)
            ring[pos] = key if failed else None
            if failed:
                failing.add(key)
            self._pos = pos + 1 if pos + 1 < self.window else 0
            self._seen += 1
        if self._streak >= self.consecutive:
            reason = GUARD_CONSECUTIVE
        elif len(failing) >= self.burst:
            reason = GUARD_BURST
        else:
            return None
        self.tripped += 1
        self._last = (self._streak, len(failing), min(self._seen, self.window))
        self._streak = -1
        return reason

    def evidence(self) -> dict[str, object]:
        """What the last trip saw, for the rollback's record."""
        streak, failures, seen = self._last
        return {
            "consecutive_failures": streak,
            "window_failures": failures,
            "window_requests": seen,
            "consecutive_limit": self.consecutive,
            "burst_limit": self.burst,
            "burst_window": self.window,
        }
