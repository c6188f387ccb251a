"""The worker <-> mirror-process wire: frame kinds are distinct, every message type round-trips
through msgpack as the two sides encode and decode it, a STATS frame from a mirror process
without adaptive-sampling rates still decodes (workers and mirror restart independently), and a
RAMP frame carries one request of a rollout exactly, in a fixed struct-packed layout."""

from __future__ import annotations

import msgspec
import pytest

from domain.observation import describe
from domain.records import RolloutRequest
from gateway.mirror.channel import frames

_encode = msgspec.msgpack.Encoder().encode


def test_frame_kinds_are_distinct() -> None:
    """Each frame kind has its own byte."""
    kinds = [getattr(frames, n) for n in frames.__all__ if n.startswith("KIND_")]
    assert len(kinds) == len(set(kinds)) == 10
    assert all(0 < k < 256 for k in kinds)


def test_header_layout() -> None:
    """A frame header is 9 bytes: kind, meta length, body length (network order)."""
    head = frames.frame_header(frames.KIND_RATES, 300, 0)
    assert len(head) == 9 and frames.FRAME.unpack(head) == (frames.KIND_RATES, 300, 0)


def test_rates_and_eligible_round_trip() -> None:
    """RATES and ELIGIBLE carry exactly what was sent, as compact arrays."""
    rates = frames.RatesMeta(seq=7, apply_at=12345.678, request_rps=201.5, session_rps=180.0)
    raw = _encode(rates)
    assert msgspec.msgpack.decode(raw, type=frames.RatesMeta) == rates
    assert msgspec.msgpack.decode(raw) == [7, 12345.678, 201.5, 180.0, {}]  # no capacity limit
    eligible = frames.EligibleMeta(count=1234, interval_s=1.002, channel_fill=0.25)
    raw = _encode(eligible)
    assert msgspec.msgpack.decode(raw, type=frames.EligibleMeta) == eligible
    assert len(raw) < 24  # the once-a-second counter frame stays tiny
    # A frame without the channel's fill (an older worker) reads as an empty channel.
    old = msgspec.msgpack.encode([1234, 1.002])
    assert msgspec.msgpack.decode(old, type=frames.EligibleMeta).channel_fill == 0.0


def test_stats_with_and_without_rates() -> None:
    """STATS carries each candidate's rate view; one without it decodes to an empty view."""
    stats = frames.StatsMeta(
        pid=1,
        priority="normal",
        counters={"c": {"sampled": 3}},
        process={},
        writer={},
        prometheus="",
        rates={"c": {"target_rps": 20.0, "effective_sample_rate": 0.1, "sessions_cut": 2}},
    )
    assert msgspec.msgpack.decode(_encode(stats), type=frames.StatsMeta) == stats
    old = {"pid": 1, "priority": "normal", "counters": {}, "process": {}, "writer": {}}
    decoded = msgspec.msgpack.decode(_encode({**old, "prometheus": ""}), type=frames.StatsMeta)
    assert decoded.rates == {}


@pytest.mark.parametrize(
    ("error_kind", "decoded"),
    [
        (None, None),
        ("http_5xx", "http_5xx"),
        ("client_disconnect", "client_disconnect"),
        ("not-a-kind", "other"),
    ],
)
def test_rollout_frame_round_trip(error_kind: str | None, decoded: str | None) -> None:
    """A RAMP frame is one fixed-size header + meta, no body, and decodes to what was sent
    (signed 64-bit session and generation, a missing latency back as None, an unknown error kind
    as `other`)."""
    session = -(2**63) + 1
    sent = RolloutRequest(
        status=503, error_kind=error_kind, ttft_s=0.25, e2e_s=None, finished=False,
        generation=2**40, arm=1, session=session, at=1.5e9,
    )  # fmt: skip
    raw = frames.rollout_frame(sent)
    kind, mlen, blen = frames.FRAME.unpack_from(raw)
    assert (kind, mlen, blen) == (frames.KIND_ROLLOUT, frames.ROLLOUT_META.size, 0)
    # 9 header bytes, then each declared field at its width: a float 8, a flag or an error
    # kind's code 1, an integer its declared bits (32 by default); no padding.
    widths = {float: 8, bool: 1, str: 1}
    declared = sum(
        widths.get(f.type) or (f.quantity.bits or 32) // 8 for f in describe(RolloutRequest)
    )
    assert len(raw) == frames.FRAME.size + frames.ROLLOUT_META.size == 9 + declared
    got = RolloutRequest(**frames.ROLLOUT_LAYOUT.fields(raw[frames.FRAME.size :]))  # type: ignore[arg-type]
    assert got == msgspec.structs.replace(sent, error_kind=decoded)
