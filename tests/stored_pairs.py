"""Pairs as the gateway stores them: the one place tests turn an evaluator `Pair` into the
`ExchangeRecord` of its production request."""

from __future__ import annotations

from domain.records import ExchangeRecord
from evaluators.pairs.types import Pair


def exchange_record(p: Pair, targets: tuple[str, ...]) -> ExchangeRecord:
    """The exchange the gateway records for a pair's production request, mirrored to `targets`."""
    return ExchangeRecord(
        id=p.exchange_id,
        received_at=p.received_at,
        route="/v1/chat/completions",
        model=p.model,
        stream=p.stream,
        temperature=p.temperature,
        session_key=p.session_key,
        turn_index=p.turn_index,
        json_requested=p.json_requested,
        tools_requested=p.tools_requested,
        replica=p.replica,
        targets=targets,
    )
