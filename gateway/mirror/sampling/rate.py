"""Sampling toward a target rate (`target_rps`): the controller's math (pure: no IO, no asyncio).

A candidate with `target_rps` asks for copies per second instead of a share of the traffic. Its
sampling probability is

    p = clamp(target_rps / reference_rps, P_FLOOR, sample_rate)

where `reference_rps` is the host's eligible request rate (requests on mirrored routes, sampled
or not) as the controller last settled it, one number per sampling mode for every candidate of
the host. The decision stays `xxh3_64(SALT + key) < p * 2**64`: deterministic per request or
session key, and nested, because every candidate of a mode divides by the same reference (a
lower target gets a subset of a higher one's sample at every moment, and two candidates with one
target and one ceiling get the same sample). `sample_rate` is the ceiling: p never exceeds it.

How the reference moves (`RateControl.tick`, once a second in the host's mirror process):

- the eligible rate is the sum of each source's latest reported rate (a worker reports its
  count about once a second; a source silent for `STALE_S` counts 0), smoothed by an EWMA that
  rises with `TAU_RISE_S` and falls with `TAU_FALL_S` (quick to see a burst, slow to trust a lull);
- hysteresis: the reference follows the estimate only once it leaves a band of +-`BAND` around
  it (request mode), +-`SESSION_BAND` for `SESSION_HOLD_S` in a row (session mode: a change
  cuts conversations or joins them mid-way, so changes are rare; the hold starts once the
  reference first settled, so the climb from the safe start is not slowed);
- bounded steps: one change moves the reference by at most a factor `STEP_MAX`, and it never
  goes below `REFERENCE_FLOOR_RPS` (an idle host would otherwise open every ceiling at once);
- a safe start: before any estimate the reference is `START_REFERENCE_RPS`, more than one host
  of this gateway serves, so a fresh mirror process or registration starts below the target
  and climbs (by `STEP_MAX` a second) rather than flooding the candidate.

Workers apply a new reference at the instant the controller names (`apply_at`, on the host's
monotonic clock), so every worker's threshold changes at the same moment.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Final, Literal

from domain.endpoint import Endpoint

__all__ = [
    "BAND",
    "P_FLOOR",
    "SESSION_BAND",
    "START_REFERENCE_RPS",
    "EligibleRates",
    "RateControl",
    "Reference",
    "effective_rate",
    "endpoint_rate",
]

Mode = Literal["request", "session"]

P_FLOOR: Final = 1e-6  # a target never starves to nothing (at most sample_rate, though)
START_REFERENCE_RPS: Final = 10_000.0  # eligible req/s assumed before the first estimate
REFERENCE_FLOOR_RPS: Final = 1.0
TAU_RISE_S: Final = 2.0
TAU_FALL_S: Final = 5.0
STALE_S: Final = 3.0
BAND: Final = 0.10
SESSION_BAND: Final = 0.25
SESSION_HOLD_S: Final = 10.0
STEP_MAX: Final = 4.0
TICK_S: Final = 1.0
APPLY_LEAD_S: Final = 0.25  # workers receive a change before the instant it applies


def effective_rate(target_rps: float | None, sample_rate: float, reference_rps: float) -> float:
    """The probability a candidate samples with: `sample_rate`, or the adaptive share of its
    `target_rps` under the ceiling `sample_rate` (the same function in every process)."""
    if target_rps is None:
        return sample_rate
    p = target_rps / max(reference_rps, REFERENCE_FLOOR_RPS)
    return min(sample_rate, max(P_FLOOR, p))


def endpoint_rate(endpoint: Endpoint, refs: tuple[float, float]) -> float:
    """The share `endpoint` samples with, given the (request, session) references."""
    ref = refs[1] if endpoint.sampling == "session" else refs[0]
    return effective_rate(endpoint.target_rps, endpoint.sample_rate, ref)


class EligibleRates:
    """The host's eligible request rate, summed over the sources that report it (workers)."""

    __slots__ = ("_latest",)

    def __init__(self) -> None:
        self._latest: dict[Hashable, tuple[float, float]] = {}  # source -> (rate, reported_at)

    def report(self, source: Hashable, count: int, interval_s: float, now: float) -> None:
        if interval_s > 0 and count >= 0:
            self._latest[source] = (count / interval_s, now)

    def forget(self, source: Hashable) -> None:
        self._latest.pop(source, None)

    def instant(self, now: float) -> float | None:
        """Requests per second now (None: no source has ever reported)."""
        if not self._latest:
            return None
        return sum(rate for rate, at in self._latest.values() if now - at <= STALE_S)


class Reference:
    """One sampling mode's reference rate: follows the estimate with hysteresis, bounded steps."""

    __slots__ = ("band", "hold_s", "out_since", "settled", "value")

    def __init__(self, band: float, hold_s: float) -> None:
        self.band = band
        self.hold_s = hold_s
        self.value = START_REFERENCE_RPS
        self.out_since: float | None = None
        self.settled = False  # the estimate was inside the band once: holds apply from now on

    def update(self, estimate: float, now: float) -> bool:
        """Move toward `estimate` if it left the band long enough; True when the value changed."""
        target = max(estimate, REFERENCE_FLOOR_RPS)
        ratio = target / self.value
        if 1.0 / (1.0 + self.band) <= ratio <= 1.0 + self.band:
            self.out_since = None
            self.settled = True
            return False
        if self.out_since is None:
            self.out_since = now
        if self.settled and now - self.out_since < self.hold_s:
            return False
        step = min(max(ratio, 1.0 / STEP_MAX), STEP_MAX)
        self.value = max(self.value * step, REFERENCE_FLOOR_RPS)
        self.out_since = None
        return True


class _Ewma:
    __slots__ = ("tau_fall", "tau_rise", "value")

    def __init__(self, tau_rise: float, tau_fall: float) -> None:
        self.tau_rise = tau_rise
        self.tau_fall = tau_fall
        self.value: float | None = None

    def update(self, x: float, dt: float) -> float:
        if self.value is None:
            self.value = x
        else:
            tau = self.tau_rise if x > self.value else self.tau_fall
            self.value += (1.0 - math.exp(-dt / tau)) * (x - self.value)
        return self.value


class RateControl:
    """The host's controller: eligible rate in, one reference per sampling mode out, plus each
    candidate's realized copies per second (for reporting)."""

    __slots__ = ("_last", "_realized", "_sampled", "eligible", "estimate", "references", "seq")

    def __init__(self) -> None:
        self.eligible = EligibleRates()
        self.estimate = _Ewma(TAU_RISE_S, TAU_FALL_S)
        self.references: dict[Mode, Reference] = {
            "request": Reference(BAND, 0.0),
            "session": Reference(SESSION_BAND, SESSION_HOLD_S),
        }
        self.seq = 0  # bumped by every change of a reference
        self._last: float | None = None
        self._sampled: dict[str, int] = {}
        self._realized: dict[str, _Ewma] = {}

    def reference(self, mode: Mode) -> float:
        return self.references[mode].value

    def refs(self) -> tuple[float, float]:
        """(request, session) references, as the wire carries them."""
        return self.references["request"].value, self.references["session"].value

    def tick(self, now: float, sampled: Iterable[tuple[str, int]] = ()) -> bool:
        """One control step at `now`; `sampled` is each candidate's cumulative sampled count.
        True when a reference changed (`seq` was bumped)."""
        last, self._last = self._last, now
        dt = TICK_S if last is None else now - last
        if dt <= 0:
            return False
        self._track_realized(sampled, dt)
        instant = self.eligible.instant(now)
        if instant is None:  # nothing measured yet: keep the safe start
            return False
        estimate = self.estimate.update(instant, dt)
        changed = False
        for ref in self.references.values():
            changed |= ref.update(estimate, now)
        if changed:
            self.seq += 1
        return changed

    def _track_realized(self, sampled: Iterable[tuple[str, int]], dt: float) -> None:
        seen: dict[str, int] = {}
        for name, total in sampled:
            seen[name] = total
            before = self._sampled.get(name)
            ewma = self._realized.setdefault(name, _Ewma(TAU_FALL_S, TAU_FALL_S))
            if before is not None and total >= before:
                ewma.update((total - before) / dt, dt)
        self._sampled = seen
        for name in [n for n in self._realized if n not in seen]:
            del self._realized[name]

    def realized(self, name: str) -> float | None:
        """Copies per second sampled for `name`, smoothed (None until two ticks saw it)."""
        ewma = self._realized.get(name)
        return None if ewma is None else ewma.value

    @property
    def eligible_rps(self) -> float | None:
        return self.estimate.value
