"""Pairs kept for people (gateway.mirror.grading.lane with a grader's `label_rate`): the graded
pairs of the units under the rate are handed to the sink exactly as the grader was shown them,
chosen by unit before any verdict, and none at rate 0."""

from __future__ import annotations

import time
from pathlib import Path

from domain.endpoint import Endpoint, GraderSpec
from domain.records import LabelItem, is_labelled
from gateway.mirror.replay.sinks import InMemorySink
from tests.mirror.test_mirror_grading import PRODUCTION_ANSWER, _send, _settle, grader_server
from tests.mirror.test_mirror_lane import make_mirror, sim


class LabelledSink(InMemorySink):
    """The in-memory sink that also takes the pairs kept for labelling."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[LabelItem] = []

    def put_label_item(self, item: LabelItem) -> None:
        self.items.append(item)


async def _kept(label_rate: float, n: int) -> tuple[LabelledSink, list[str]]:
    async with grader_server("fair") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0, label_rate=label_rate)
        upgrade = await sim("baseline")
        sink = LabelledSink()
        ep = Endpoint(name="upgrade", url=upgrade.url, sample_rate=1.0, grader=spec)
        mirror = make_mirror([ep], sink)
        await mirror.start()
        try:
            for i in range(n):
                _send(mirror, i)
            await _settle(mirror, sink, n)
        finally:
            await mirror.close()
            await upgrade.close()
        prompts = [r["messages"][0]["content"] for r in stub.requests]
    return sink, prompts


async def test_kept_pairs_are_what_the_grader_saw() -> None:
    """At label_rate 1 every graded pair is kept, with the conversation and both answers the
    grader's prompt held, and its unit the session's hash; at 0 none is."""
    sink, prompts = await _kept(1.0, 4)
    assert len(sink.items) == 4
    for item in sink.items:
        assert item.reference_answer == PRODUCTION_ANSWER
        assert item.candidate_answer and item.candidate_answer != PRODUCTION_ANSWER
        assert any(item.conversation in p and item.candidate_answer in p for p in prompts)
        assert item.unit and item.unit != item.exchange_id
        assert is_labelled(item.unit, 1.0)
    none, _ = await _kept(0.0, 3)
    assert none.items == []


async def test_the_mirror_process_keeps_them_in_the_store(tmp_path: Path) -> None:
    """The mirror process's sink (the writer's, in plane.py) takes the kept pairs as it takes
    gradings, so a running gateway stores them in `label_items`."""
    from gateway.mirror.grading.lane import LabelSink
    from gateway.mirror.plane import _Stored
    from gateway.mirror.replay.splits import SplitWatch
    from storage import labels as lb
    from storage.engine import make_engine, upgrade
    from tests.graded_store import new_writer

    url = f"sqlite+aiosqlite:///{tmp_path / 'k.db'}"
    await upgrade(url)
    engine = make_engine(url)
    try:
        writer = new_writer(engine)
        await writer.start()
        sink = _Stored(writer, SplitWatch(engine, "r-mirror-1", every_s=5.0))
        assert isinstance(sink, LabelSink)
        item = LabelItem(
            exchange_id="ex-1", endpoint="upgrade", reference="prod", unit="u-1",
            graded_at=time.time(), conversation="user: hi", candidate_answer="a",
            reference_answer="b",
        )  # fmt: skip
        sink.put_label_item(item)
        await writer.close(5.0)
        assert await lb.units_of(engine, "upgrade") == {"ex-1": "u-1"}
    finally:
        await engine.dispose()
