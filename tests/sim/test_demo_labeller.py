"""The demo's simulated labeller (gateway.process.demo.labeller): it labels by the simulator's
planted truth with no position bias, and through the real labelling API (an open admin API on
127.0.0.1:0 over SQLite, as the demo runs it) every kept pair once, as a labeller would."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from domain.endpoint import Endpoint
from domain.records import LabelItem
from gateway.control.admin.labels import LabelSettings
from gateway.process.demo.labeller import choose, simulated_labeller
from gateway.sim.engine import NEW_WORDS
from gateway.sim.profiles import get_profile
from storage import labels as lb
from storage import queries
from tests.control.test_admin_harness import admin_server
from tests.control.test_admin_labels import _kept

# Production's style, written here: words the upgrade never uses.
OLD_WORDS = ("the", "model", "answer", "request", "token", "cache", "server", "latency")


def _text(words: tuple[str, ...], rng: random.Random) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))


def test_labels_plant_the_truth_without_position_bias() -> None:
    """Over 6,000 pairs in random positions the labels tie at the grader profile's tie rate,
    prefer the upgrade's words at its planted rate, and favour neither position."""
    taste = get_profile("grader")
    rng = random.Random(7)
    n, ties, new_wins, a_wins = 6000, 0, 0, 0
    for i in range(n):
        new, old = _text(NEW_WORDS, rng), _text(OLD_WORDS, rng)
        new_first = rng.random() < 0.5
        a, b = (new, old) if new_first else (old, new)
        label = choose(a, b, f"ex-{i}", seed=0)
        ties += label == "tie"
        new_wins += label == ("A" if new_first else "B")
        a_wins += label == "A"
    decisive = n - ties
    assert abs(ties / n - taste.grader_tie) < 0.02
    assert abs(new_wins / decisive - taste.grader_prefers_new) < 0.025
    assert abs(a_wins / decisive - 0.5) < 0.025
    # Reproducible: one pair, one label.
    assert choose("x y", "z", "ex-1", seed=3) == choose("x y", "z", "ex-1", seed=3)


async def test_it_labels_every_kept_pair_once_through_the_api(tmp_path: Path) -> None:
    """Stopped at once, it labels every kept pair (the drain), each once, under the open admin
    API's actor, with the order it was shown; with store_text off it says the API refused."""
    rng = random.Random(1)
    items = [
        LabelItem(
            exchange_id=f"ex-{i}",
            endpoint="upgrade",
            reference="live",
            unit=f"s-{i // 3}",
            graded_at=time.time(),
            conversation="user: hi",
            candidate_answer=_text(NEW_WORDS, rng),
            reference_answer=_text(OLD_WORDS, rng),
        )
        for i in range(24)
    ]
    url = f"sqlite+aiosqlite:///{tmp_path / 'd.db'}"
    async with admin_server(url, tokens={}, insecure=True) as srv:
        await queries.create_endpoint(
            srv.engine, Endpoint(name="upgrade", url="http://127.0.0.1:9/")
        )
        await _kept(srv.engine, items)
        stop = asyncio.Event()
        stop.set()
        done = await simulated_labeller(srv.url, stop, seed=0)
        labels = await lb.labels_of(srv.engine, "upgrade")
    assert done.total == len(labels) == len(items) and not done.refused
    assert sorted(r.exchange_id for r in labels) == sorted(i.exchange_id for i in items)
    assert {r.labeller for r in labels} == {"insecure-admin"}
    for r in labels:
        item = next(i for i in items if i.exchange_id == r.exchange_id)
        a, b = (
            (item.candidate_answer, item.reference_answer)
            if r.candidate_first
            else (item.reference_answer, item.candidate_answer)
        )
        said = choose(a, b, r.exchange_id, seed=0)  # as shown: A is the one shown first
        if said == "tie":
            assert r.choice == "tie"
        else:
            assert r.choice == ("candidate" if (said == "A") == r.candidate_first else "reference")
    assert "stand-in for a person" in done.line() and f"labelled {len(items)}" in done.line()

    url = f"sqlite+aiosqlite:///{tmp_path / 'n.db'}"
    off = LabelSettings(store_text=False)
    async with admin_server(url, tokens={}, insecure=True, labels=off) as srv:
        await queries.create_endpoint(
            srv.engine, Endpoint(name="upgrade", url="http://127.0.0.1:9/")
        )
        done = await simulated_labeller(srv.url, stop, seed=0)
    assert done.total == 0 and "storage.store_text" in done.refused
    assert "refused" in done.line()
