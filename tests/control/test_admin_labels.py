"""The labelling API (docs/grading.md, People check the grader): blind offers, labels durable
before the 2xx, undo, JSONL export and import, the labeller role, and a clear error naming the
field for each bad input; the kept pairs written by the real writer, none with store_text off."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint, GraderSpec
from domain.records import LabelItem, is_labelled
from gateway.control.admin.labels import LabelSettings
from storage import labels as lb
from storage import queries
from tests.control.test_admin_harness import admin_server, auth, call
from tests.graded_store import kept_pair, write_records

LABELLER = "tok-label-5d2e9a01"
CAND = "cand"


def _item(i: int, name: str = CAND) -> LabelItem:
    return kept_pair(i, name, f"user: question {i}", f"CANDIDATE-{i}", f"REFERENCE-{i}")


async def _kept(engine: AsyncEngine, items: list[LabelItem], store_text: bool = True) -> None:
    """The pairs kept for people, written by the real writer (none with store_text off)."""
    await write_records(engine, label_items=items, store_text=store_text)


def test_label_selection_is_by_unit_and_nested() -> None:
    """Every pair of a unit is kept or none; a unit kept at a rate is kept at every higher one,
    and the kept share is the rate."""
    units = [f"u{i}" for i in range(20_000)]
    at10 = {u for u in units if is_labelled(u, 0.1)}
    at20 = {u for u in units if is_labelled(u, 0.2)}
    assert at10 <= at20
    assert abs(len(at10) / len(units) - 0.1) < 0.01
    assert not any(is_labelled(u, 0.0) for u in units[:100])


async def test_labelling_round_trip_and_bad_input(tmp_path: Path) -> None:
    """A labeller is offered each pair once, blind, in both orders across pairs; labels are
    stored before the 201 with the shown order; undo deletes the last; export and import
    round-trip; an unknown pair, a second label, a deleted candidate and a labeller token on
    another route get 404, 409, 404 and 403 naming the field, losing nothing."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    labellers = {LABELLER: "ann"}
    async with admin_server(url, labellers=labellers) as srv, aiohttp.ClientSession() as http:
        await queries.create_endpoint(srv.engine, Endpoint(name=CAND, url="http://127.0.0.1:9/"))
        await _kept(srv.engine, [_item(i) for i in range(6)])
        base = srv.admin + f"/labels/{CAND}"
        # The shown order is drawn afresh at each offer, half each way: 40 offers show both
        # (all one way: 2 in 2^40).
        drawn = set()
        for _ in range(40):
            status, body = await call(http, "GET", base + "/next", headers=auth(LABELLER))
            drawn.add(body["pair"]["order"])
        assert drawn == {"ca", "rc"}
        seen: list[str] = []
        orders: set[str] = set()
        for _ in range(6):
            status, body = await call(http, "GET", base + "/next", headers=auth(LABELLER))
            assert status == 200
            pair = body["pair"]
            assert set(pair) == {"exchange_id", "conversation", "answer_a", "answer_b", "order"}
            # Neither the verdict nor the arms: the answers only, A and B.
            assert "winner" not in str(body) and "reference" not in str(sorted(body))
            seen.append(pair["exchange_id"])
            orders.add(pair["order"])
            label = {"exchange_id": pair["exchange_id"], "order": pair["order"], "answer": "A"}
            status, _ = await call(http, "POST", base, json=label, headers=auth(LABELLER))
            assert status == 201
            # Durable before the 2xx: the row is there on a fresh read.
            assert pair["exchange_id"] in {
                r.exchange_id for r in await lb.labels_of(srv.engine, CAND)
            }
        assert sorted(seen) == sorted(f"ex-{i}" for i in range(6))  # each offered once
        assert orders <= {"ca", "rc"}
        stored = await lb.labels_of(srv.engine, CAND)
        # "A" means the candidate exactly when the candidate was shown first.
        assert all((r.choice == "candidate") == r.candidate_first for r in stored)
        status, body = await call(http, "GET", base + "/next", headers=auth(LABELLER))
        assert body["pair"] is None and body["progress"]["mine"] == 6

        # A second label of the same pair by the same labeller: 409 naming exchange_id.
        again = {"exchange_id": "ex-0", "order": "ca", "answer": "B"}
        status, body = await call(http, "POST", base, json=again, headers=auth(LABELLER))
        assert status == 409 and body["error"]["field"] == "exchange_id"
        # An unknown pair: 404 naming exchange_id; a bad answer: 422 naming answer.
        unknown = {"exchange_id": "nope", "order": "ca", "answer": "A"}
        status, body = await call(http, "POST", base, json=unknown, headers=auth(LABELLER))
        assert status == 404 and body["error"]["field"] == "exchange_id"
        bad = {"exchange_id": "ex-1", "order": "ca", "answer": "C"}
        status, body = await call(http, "POST", base, json=bad, headers=auth(LABELLER))
        assert status == 422 and body["error"]["field"] == "answer"
        # The labeller role reaches nothing else.
        for method, path in (("GET", "/candidates"), ("POST", f"/candidates/{CAND}/promote"),
                             ("GET", f"/candidates/{CAND}/labels")):  # fmt: skip
            status, body = await call(http, method, srv.admin + path, headers=auth(LABELLER))
            assert status == 403 and body["error"]["field"] == "Authorization", path
        assert len(await lb.labels_of(srv.engine, CAND)) == 6  # nothing lost

        # Undo deletes the latest label, and the pair is offered again.
        last = (await lb.labels_of(srv.engine, CAND))[-1].exchange_id
        status, body = await call(http, "POST", base + "/undo", headers=auth(LABELLER))
        assert status == 200 and body["undone"] == last
        status, body = await call(http, "GET", base + "/next", headers=auth(LABELLER))
        assert body["pair"]["exchange_id"] == last

        # Export, then import into a fresh candidate's store: the same labels, twice idempotent.
        async with http.get(srv.admin + f"/candidates/{CAND}/labels", headers=auth()) as resp:
            assert resp.status == 200
            jsonl = await resp.read()
        assert len(jsonl.splitlines()) == 5
        status, body = await call(
            http, "POST", srv.admin + f"/candidates/{CAND}/labels", data=jsonl
        )
        assert status == 200 and body == {"stored": 0, "already": 5}
        status, body = await call(
            http, "POST", srv.admin + f"/candidates/{CAND}/labels", data=b'{"x": 1}\n'
        )
        assert status == 422 and body["error"]["field"] == "line 1"

        # The candidate deleted mid-labelling: 404 naming candidate; its labels stay.
        await queries.delete_endpoint(srv.engine, CAND)
        status, body = await call(http, "GET", base + "/next", headers=auth(LABELLER))
        assert status == 404 and body["error"]["field"] == "candidate"
        label = {"exchange_id": last, "order": "ca", "answer": "tie"}
        status, body = await call(http, "POST", base, json=label, headers=auth(LABELLER))
        assert status == 404 and body["error"]["field"] == "candidate"
        assert len(await lb.labels_of(srv.engine, CAND)) == 5


async def test_store_text_off_keeps_nothing_and_refuses(tmp_path: Path) -> None:
    """With store_text = false the writer keeps no pair's text and labelling answers 409
    naming storage.store_text."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'n.db'}"
    settings = LabelSettings(store_text=False)
    async with admin_server(url, labels=settings) as srv, aiohttp.ClientSession() as http:
        await queries.create_endpoint(srv.engine, Endpoint(name=CAND, url="http://127.0.0.1:9/"))
        await _kept(srv.engine, [_item(1)], store_text=False)
        assert await lb.units_of(srv.engine, CAND) == {}
        status, body = await call(http, "GET", srv.admin + f"/labels/{CAND}/next")
        assert status == 409 and body["error"]["field"] == "storage.store_text"


async def test_retention_deletes_the_kept_text(tmp_path: Path) -> None:
    """Pairs kept longer than the retention are deleted; their labels stay."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    async with admin_server(url) as srv:
        old = _item(1)
        old.graded_at -= 3600
        await _kept(srv.engine, [old, _item(2)])
        assert await lb.purge(srv.engine, retention_s=60) == 1
        assert set(await lb.units_of(srv.engine, CAND)) == {"ex-2"}
    await asyncio.sleep(0)


async def test_offer_states_rubric_and_target_and_refuses_unknown_tokens(tmp_path: Path) -> None:
    """The offer carries the rubric the candidate's grader was given (its own prompt's text
    before the pair, else the default rubric) and its `min_labels` as the target; without a
    token, or with one the gateway does not know, every labelling call is 401 and stores
    nothing."""
    url = f"sqlite+aiosqlite:///{tmp_path / 't.db'}"
    prompt = (
        "Which reply is kinder? {{strict}}\n[Conversation]\n{conversation}\n{answer_a}\n{answer_b}"
    )
    grader = GraderSpec(url="http://127.0.0.1:9/v1", model="judge", prompt=prompt)
    async with (
        admin_server(url, labellers={LABELLER: "ann"}) as srv,
        aiohttp.ClientSession() as http,
    ):
        await queries.create_endpoint(
            srv.engine,
            Endpoint(
                name=CAND, url="http://127.0.0.1:9/", grader=grader, verdict={"min_labels": 120}
            ),
        )
        await queries.create_endpoint(srv.engine, Endpoint(name="other", url="http://127.0.0.1:9/"))
        await _kept(srv.engine, [_item(1), _item(2, "other")])
        status, body = await call(
            http, "GET", srv.admin + f"/labels/{CAND}/next", headers=auth(LABELLER)
        )
        assert status == 200 and body["target"] == 120
        assert body["rubric"] == "Which reply is kinder? {strict}"
        status, body = await call(
            http, "GET", srv.admin + "/labels/other/next", headers=auth(LABELLER)
        )
        assert body["target"] == 50 and body["rubric"].startswith("You are comparing two")
        assert "[Conversation]" not in body["rubric"] and "Reply with" not in body["rubric"]

        label = {"exchange_id": "ex-1", "order": "ca", "answer": "A"}
        for headers in ({}, auth("tok-unknown-0000000000")):
            for method, path, payload in (("GET", "/next", None), ("POST", "", label),
                                          ("POST", "/undo", None)):  # fmt: skip
                status, _ = await call(
                    http, method, srv.admin + f"/labels/{CAND}{path}", json=payload, headers=headers
                )
                assert status == 401, (headers, path)
        assert await lb.labels_of(srv.engine, CAND) == []
