"""The observation is declared once (domain/observation.py): the meter's result, the record,
the table and the evaluators' columns all follow from that declaration, under one name each."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from sqlalchemy import String

from domain.observation import MEASURED, PER_PAIR, Measured, describe, kept_text
from domain.records import ObservationRecord
from evaluators.pairs.columns import ARM_FIELDS, pairset_from_pairs
from evaluators.pairs.types import ArmColumns, ArmObs, Pair
from gateway.mirror.replay.observe import observation
from gateway.server.meter import MeterResult
from storage.models import ObservationRow
from storage.textguard import observation_row

# A value of each declared type, distinct per field, so a value carried to the wrong field shows.
_SAMPLE: dict[type[Any], Any] = {float: 0.25, int: 3, bool: True, str: "usage"}


def _values() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, f in enumerate(describe(Measured)):
        value = _SAMPLE[f.type]
        out[f.name] = value + i if f.type in (float, int) and f.type is not bool else value
    return out


def test_every_form_of_the_observation_is_the_declared_one() -> None:
    """The meter's result, the record and the evaluators' row form subclass the declaration."""
    for cls in (MeterResult, ObservationRecord, ArmObs):
        assert issubclass(cls, Measured)
        assert {f.name for f in msgspec.structs.fields(cls)} >= set(MEASURED)


def test_the_record_is_the_meter_result_by_one_conversion() -> None:
    """Every measured field reaches the record unchanged, whatever is added to the declaration."""
    values = _values()
    result = MeterResult(**(values | {"status": 200}), is_sse=True, text="hello", saw_done=True)
    record = observation(
        "x", "live", "production", 1.0, result, None, store_text=True, max_chars=100
    )
    # The error kind is the observation's verdict on the answer (the transport's, else
    # `observe.classify`), never the meter's: this healthy answer has none.
    expected = values | {"status": 200, "queue_wait_s": None, "error_kind": None}
    assert {name: getattr(record, name) for name in MEASURED} == expected
    waited = observation(
        "x", "c", "candidate", 1.0, result, None, store_text=True, max_chars=100, queue_wait_s=0.5
    )
    assert waited.queue_wait_s == 0.5


def test_the_table_is_generated_from_the_declaration() -> None:
    """observations: a surrogate id, then one column per declared field, same type and NULL."""
    table = ObservationRow.__table__
    declared = describe(ObservationRecord)
    assert [c.name for c in table.columns] == ["id", *(f.name for f in declared)]
    for f in declared:
        column = table.c[f.name]
        assert column.nullable == f.nullable, f.name
        assert column.type.python_type is f.type, f.name
        if f.quantity.length:
            assert isinstance(column.type, String) and column.type.length == f.quantity.length


def test_the_evaluators_columns_are_the_per_pair_quantities() -> None:
    """Each per-pair quantity is an ArmColumns column by its declared name, loaded from the
    field of the same name."""
    assert set(PER_PAIR) <= set(ARM_FIELDS) and "ttft_s" in PER_PAIR
    values = {name: float(i + 1) for i, name in enumerate(PER_PAIR)}
    prod = ArmObs(**values)  # type: ignore[arg-type]
    ps = pairset_from_pairs(
        [Pair(exchange_id="e", received_at=1.0, production=prod, candidate=ArmObs())]
    )
    arm: ArmColumns = ps.production
    for name, value in values.items():
        assert getattr(arm, name)[0] == np.float32(value), name
    assert np.isnan(ps.candidate.ttft_s[0])


def test_stored_text_is_cut_in_one_place() -> None:
    """The record and the stored row keep text by the same rule (kept_text)."""
    assert kept_text("abcdef", False, store_text=True, max_chars=3) == ("abc", True)
    assert kept_text("abc", False, store_text=True, max_chars=3) == ("abc", False)
    assert kept_text("abc", True, store_text=False, max_chars=3) == (None, True)
    result = MeterResult(status=200, is_sse=True, text="abcdef", saw_done=True)
    record = observation("x", "l", "production", 1.0, result, None, store_text=True, max_chars=4)
    assert (record.output_text, record.text_truncated) == ("abcd", True)
    row = observation_row(record, store_text=True, max_chars=2)
    assert (row["output_text"], row["text_truncated"]) == ("ab", True)
