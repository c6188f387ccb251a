"""The live page's "what people prefer" table (static/human.js, in a model upgrade's LLM grader
panel) in a real browser (the system's chromium, driven by Playwright) against a real gateway on
127.0.0.1:0 over a SQLite file: graded multi-turn sessions stored by the product's writer, the
pairs of a random share of sessions kept for people by the product's own choice
(`domain.records.is_labelled`), and two labellers labelling them blind through the labelling
API. The page shows people's prediction-powered estimate in pp as the report's JSON states it,
the confusion matrix of grader against people counted here from what was planted, the labels,
skips and the double-labelled pairs; a candidate without labels shows no such table.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from domain.endpoint import Endpoint, GraderSpec
from domain.records import (
    ExchangeRecord,
    GradingRecord,
    LabelItem,
    ObservationRecord,
    is_labelled,
)
from storage import queries
from storage.writer import ObservationWriter
from tests.browser.stack import chromium, new_page, read_after
from tests.control.test_admin_harness import TOKEN, auth, real_gateway

pytestmark = pytest.mark.timeout(90)

NAME = "upgrade"
PLAIN = "plain"  # a model upgrade with a grader and no labels
LIVE = "live"  # the gateway's live endpoint (`[live] name`)
LABELLERS = {"ann": "tok-labeller-ann-5e1b9c", "bob": "tok-labeller-bob-a07f3d"}
VIEWPORT = {"width": 1280, "height": 1000}
SESSIONS = 40
SPAN_S = 2.0  # the sessions' turns all arrive within this
# A session closes (and counts) `session_idle_s` after its last turn plus `grading_deadline_s`
# (after it a verdict is late); every verdict here is stored 10 ms after its pair.
CLOSING = {"session_idle_s": 1.0, "grading_deadline_s": 1.0}
LABEL_RATE = 0.5
DOUBLE_RATE = 0.3
CATEGORIES = ("candidate", "tie", "reference")
# The grader's verdicts: the candidate 55 %, tie 15 %, production 30 %. People agree with the
# grader on 55 % of pairs and otherwise lean to production: the grader is biased toward the
# candidate, as a grader favouring its longer answers is.
GRADER_P = (0.55, 0.15, 0.30)
PEOPLE_GIVEN_GRADER = {
    "candidate": (0.55, 0.15, 0.30),
    "tie": (0.20, 0.40, 0.40),
    "reference": (0.05, 0.15, 0.80),
}


def _history(t0: float) -> tuple[list[Any], dict[str, str], dict[str, str], dict[str, str]]:
    """Sessions of one to four turns from `t0` on, within `SPAN_S` (a report counts what
    arrived after the candidate was registered), each turn graded once; the records to write, the
    grader's verdict and people's planted answer per pair, and each kept pair's candidate
    answer (how a labeller here tells which of A and B is whose, as a person could not)."""
    rng = np.random.default_rng(7)
    records: list[Any] = []
    grader: dict[str, str] = {}
    people: dict[str, str] = {}
    cand_text: dict[str, str] = {}
    for s in range(SESSIONS):
        key = f"{s + 1:032x}"
        kept = is_labelled(key, LABEL_RATE)
        start = t0 + s * SPAN_S / SESSIONS
        for t in range(int(rng.integers(1, 5))):
            xid, at = f"x{s:03d}-{t}", start + t * SPAN_S / SESSIONS / 5
            answer, old = f"the new answer to {xid}, longer" * 2, f"the old answer to {xid}"
            records.append(ExchangeRecord(
                id=xid, received_at=at, route="/v1/chat/completions", model="m",
                temperature=0.0, targets=(NAME,), session_key=key, turn_index=t,
            ))  # fmt: skip
            for endpoint, arm, text in ((LIVE, "production", old), (NAME, "candidate", answer)):
                records.append(ObservationRecord(
                    exchange_id=xid, endpoint=endpoint, arm=arm, started_at=at, status=200,  # type: ignore[arg-type]
                    ttft_s=0.2, e2e_s=0.6, output_tokens=12, finish_reason="stop",
                    output_text=text,
                ))  # fmt: skip
            verdict = CATEGORIES[int(rng.choice(3, p=GRADER_P))]
            grader[xid] = verdict
            records.append(GradingRecord(
                exchange_id=xid, endpoint=NAME, reference=LIVE, graded_at=at + 0.01,
                candidate_first=bool(t % 2), swapped=False, outcome="graded", winner=verdict,  # type: ignore[arg-type]
                candidate_chars=len(answer), reference_chars=len(old), prompt_tokens=300,
                completion_tokens=5, latency_s=0.4,
            ))  # fmt: skip
            if kept:
                people[xid] = CATEGORIES[int(rng.choice(3, p=PEOPLE_GIVEN_GRADER[verdict]))]
                cand_text[xid] = answer
                records.append(LabelItem(
                    exchange_id=xid, endpoint=NAME, reference=LIVE, unit=key, graded_at=at + 0.01,
                    conversation=f"user: question {xid}?", candidate_answer=answer,
                    reference_answer=old,
                ))  # fmt: skip
    return records, grader, people, cand_text


async def _store(engine: Any, records: list[Any]) -> None:
    """Through the product's writer, as the mirror process writes them."""
    writer = ObservationWriter(
        engine, batch_size=200, flush_interval_s=0.02, queue_max=10_000, store_text=True,
        store_text_max_chars=4096,
    )  # fmt: skip
    put = {
        ExchangeRecord: writer.put_exchange,
        ObservationRecord: writer.put_observation,
        GradingRecord: writer.put_grading,
        LabelItem: writer.put_label_item,
    }
    await writer.start()
    for r in records:
        put[type(r)](r)
    await writer.close(10.0)
    stats = writer.stats()
    assert stats["written_gradings"] == sum(isinstance(r, GradingRecord) for r in records), stats


async def _label_all(
    http: aiohttp.ClientSession, url: str, who: str, answer_of: dict[str, str],
    cand_text: dict[str, str],
) -> list[str]:  # fmt: skip
    """`who` labels every pair the API offers, blind, by `answer_of`; the pairs labelled."""
    done: list[str] = []
    headers = auth(LABELLERS[who])
    while True:
        async with http.get(f"{url}/admin/labels/{NAME}/next", headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            pair = (await resp.json())["pair"]
        if pair is None:
            return done
        xid, choice = pair["exchange_id"], answer_of[pair["exchange_id"]]
        a_is_candidate = pair["answer_a"] == cand_text[xid]
        answer = {"tie": "tie", "skip": "skip"}.get(choice) or (
            "A" if (choice == "candidate") == a_is_candidate else "B"
        )
        body = {"exchange_id": xid, "order": pair["order"], "answer": answer}
        async with http.post(f"{url}/admin/labels/{NAME}", json=body, headers=headers) as resp:
            assert resp.status == 201, await resp.text()
        done.append(xid)


async def _report(http: aiohttp.ClientSession, url: str, name: str) -> dict[str, Any]:
    async with http.get(f"{url}/admin/candidates/{name}/report", headers=auth()) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


def pp(x: float) -> str:
    """As the reports write a net preference (evaluators/human/render.py)."""
    return f"{x * 100:+.1f} pp"


async def _table(page: Any, selector: str) -> list[list[str]]:
    rows: list[list[str]] = await page.locator(f"{selector} tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.innerText))"
    )
    return rows


async def test_people_panel_shows_the_reports_estimates_and_confusion(tmp_path: Path) -> None:
    """Ann labels every kept pair (one skipped) and Bob the double-labelled share, through the
    labelling API; the candidate's page shows the PPI estimate the report's JSON states, in pp
    with its interval and n, as the gating one (`preference_source = "human"`), the grader's
    and people's alone beside it, the confusion matrix counted here from the planted verdicts
    and Ann's labels, the skip and people's agreement; a model upgrade without labels shows
    its grader panel and no people's table."""
    labellers = ",".join(f"{k}:{v}" for k, v in LABELLERS.items())
    async with (
        real_gateway(tmp_path, admin_labeller_token=labellers, admin_label_double_rate=DOUBLE_RATE)
        as gw, chromium() as browser, aiohttp.ClientSession() as http,
    ):  # fmt: skip
        spec = GraderSpec(url="http://127.0.0.1:9/v1", model="judge", label_rate=LABEL_RATE)
        for name, verdict in ((NAME, {"preference_source": "human", "min_labels": 20}),
                              (PLAIN, {})):  # fmt: skip
            await queries.create_endpoint(gw.engine, Endpoint(
                name=name, url="http://127.0.0.1:9/", kind="model-upgrade", grader=spec,
                verdict={**CLOSING, **verdict},
            ))  # fmt: skip
        t0 = time.time()
        records, grader, people, cand_text = _history(t0)
        kept = sorted(people)
        assert len(kept) >= 20
        ann = {**people, kept[0]: "skip"}  # seen and not judged: counted as a skip
        bob = {x: ("tie" if i % 3 == 0 else c) for i, (x, c) in enumerate(sorted(people.items()))}
        await _store(gw.engine, records)
        assert sorted(await _label_all(http, gw.url, "ann", ann, cand_text)) == kept
        doubles = await _label_all(http, gw.url, "bob", bob, cand_text)
        assert 0 < len(doubles) < len(kept)
        closed_at = t0 + SPAN_S + sum(CLOSING.values()) + 0.5  # every session closed
        await asyncio.sleep(max(0.0, closed_at - time.time()))
        report = await _report(http, gw.url, NAME)
        res = report["metrics"]["human_preference"]
        d = res["detail"]
        assert res["role"] == "critical" and d["preference_source"] == "human"
        assert d["labels"] == len(kept) - 1 and d["label_skips"] == 1
        assert d["people_n"] == sum(ann[x] != "skip" for x in doubles)
        assert d["ppi_estimate"] is not None and res["estimate"] == d["ppi_estimate"]

        context, page = await new_page(browser, VIEWPORT)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            await page.goto(f"{gw.url}/admin/ui/#/c/{NAME}")
            await page.fill("#token", TOKEN)
            await read_after(page, lambda: page.click("#login-go"))
            assert await page.locator("#d-human").is_visible()
            rows = {r[0]: r[1:] for r in await _table(page, "#d-human-estimates")}
            ppi = rows["people, prediction-powered (PPI++)"]
            assert ppi[0] == pp(d["ppi_estimate"]), (ppi, d["ppi_estimate"])
            assert float(ppi[0].removesuffix(" pp")) == pytest.approx(
                100 * d["ppi_estimate"], abs=0.05
            )
            assert ppi[1] == f"[{pp(d['ppi_low'])}, {pp(d['ppi_high'])}]"
            assert ppi[2] == f"{len(kept) - 1} labels / {d['labelled_through_units']} graded units"
            assert ppi[3] == "gates"
            assert rows["people's labels alone"][0] == pp(d["human_estimate"])
            assert rows["the grader alone"][0] == pp(d["grader_estimate"])
            assert rows["the grader alone"][3] == "shown, not gating"

            # The confusion matrix, counted from what was planted: the grader's verdict
            # (rows) against Ann's label, the first of each pair (columns), skips left out.
            planted = Counter((grader[x], c) for x, c in ann.items() if c != "skip")
            matrix = await _table(page, "#d-human-confusion")
            assert [r[0] for r in matrix] == [f"grader: {g}" for g in CATEGORIES]
            shown = {(g, p): int(r[1 + j]) for g, r in zip(CATEGORIES, matrix, strict=True)
                     for j, p in enumerate(CATEGORIES)}  # fmt: skip
            assert shown == {(g, p): planted[g, p] for g in CATEGORIES for p in CATEGORIES}
            assert sum(shown.values()) == len(kept) - 1

            facts = dict(await _table(page, "#d-human-facts"))
            assert facts["labels / skipped / waiting"].startswith(f"{len(kept) - 1} / 1 / 0")
            assert f"n={d['people_n']} double-labelled pairs" in facts["people vs people"]
            assert f"n={len(kept) - 1} pairs" in facts["grader vs people"]
            assert facts["the grader's worth"].startswith(
                f"its {d['labelled_through_units']} verdicts were worth "
            )
            assert "<" not in await page.inner_text("#d-human")  # text, not markup

            # A model upgrade without labels: its grader panel, and no people's table.
            await read_after(page, lambda: page.goto(f"{gw.url}/admin/ui/#/c/{PLAIN}"))
            assert await page.locator("#d-grader-panel").is_visible()
            assert await page.locator("#d-human").is_hidden()
        finally:
            await context.close()
    assert errors == [], errors
