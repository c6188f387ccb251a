"""The simulator's prompt logprobs: how likely a simulated engine finds each token of a prompt.

Deterministic in the token ids and their position (one hash per position), so two engines of
the same profile (production's configuration and its control) give identical scores, and a
profile with `logprob_shift` (the quantized one) finds every prompt token that many nats less
likely; a token pushed below the best alternative loses its top-1 rank. Shaped like vLLM's
`prompt_logprobs`: None for the first position, then {token id: {logprob, rank,
decoded_token}} with the prompt's token and the top k. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xxhash

from gateway.sim.engine import VOCAB_SIZE

# How likely the baseline finds a prompt token: log p = -_SCALE * u (u uniform in [0, 1)), and
# the best alternative at that position sits _GAP * v below the most likely token.
_SCALE = 2.0
_GAP = 0.5


def _unit(*parts: int) -> float:
    return xxhash.xxh64_intdigest(b"".join(p.to_bytes(8, "little") for p in parts)) / 2.0**64


def prompt_logprobs(ids: Sequence[int], k: int, shift: float) -> list[dict[str, Any] | None]:
    """Per position of `ids`: the prompt token's logprob and rank, and the top k."""
    out: list[dict[str, Any] | None] = [None]
    for i in range(1, len(ids)):
        token = ids[i]
        h = (ids[i - 1] << 20) ^ token
        base = -_SCALE * _unit(h, i, 1)
        top_lp = min(base + _GAP * _unit(h, i, 2), -1e-3) if _unit(h, i, 3) < 0.3 else base
        mine = base - shift
        # The best alternative: above the prompt's token, or (where the prompt's token is the
        # most likely) a random gap below it, which a shift can close.
        best = top_lp if top_lp > base else base - _GAP * _unit(h, i, 4)
        alternatives = [((token + 1 + j * 7919) % VOCAB_SIZE, best - 0.7 * j) for j in range(k)]
        ranked = sorted([(token, mine), *alternatives], key=lambda e: -e[1])
        entry: dict[str, Any] = {}
        for rank, (tid, lp) in enumerate(ranked, start=1):
            if rank <= k or tid == token:
                entry[str(tid)] = {"logprob": lp, "rank": rank, "decoded_token": None}
        out.append(entry)
    return out
