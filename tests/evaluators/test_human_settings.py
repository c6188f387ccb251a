"""`preference_source`, `min_labels` and `label_skip_max` through the admin API (422 naming the
field) and `canary plan --graded --labels` (a plan, or exit 2 naming the flag)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cli.test_cli_plan import canary
from tests.control.test_admin_harness import admin_server, call

BODY = {"name": "upgrade", "url": "http://127.0.0.1:9001/"}


@pytest.mark.parametrize(
    ("verdict", "words"),
    [
        ({"preference_source": "people"}, "preference_source must be one of grader, human"),
        ({"preference_source": 2}, "must be a string"),
        ({"min_labels": 0}, "min_labels must be in"),
        ({"label_skip_max": 1.5}, "label_skip_max must be in"),
    ],
)
async def test_admin_refuses_bad_people_settings(
    tmp_path: Path, verdict: dict[str, Any], words: str
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    async with admin_server(url) as srv, aiohttp.ClientSession() as http:
        status, body = await call(
            http, "POST", srv.admin + "/candidates", json={**BODY, "verdict": verdict}
        )
        assert status == 422, body
        assert body["error"]["field"] == "verdict" and words in body["error"]["message"]
        assert srv.registry.snapshot.candidates == ()
        ok = {**BODY, "verdict": {"preference_source": "human", "min_labels": 80}}
        status, body = await call(http, "POST", srv.admin + "/candidates", json=ok)
        assert status == 201, body
        assert body["verdict"] == {"preference_source": "human", "min_labels": 80}


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--labels"], "--labels"),
        (["--graded", "--labels", "--agreement", "1.5"], "--agreement"),
        (["--graded", "--labels", "--label-rate", "0"], "--label-rate"),
    ],
)
async def test_plan_labels_bad_input_exits_2(args: list[str], flag: str) -> None:
    code, _, err = await canary("plan", "--rate", "20", *args)
    assert code == 2 and flag in err and "Traceback" not in err, err


async def test_plan_labels_states_both_counts() -> None:
    code, out, err = await canary(
        "plan", "--rate", "20", "--graded", "--labels", "--preference-delta", "0.3",
        "--effect", "-0.5", "--grader-sd", "0.8", "--agreement", "0.8", "--label-rate", "0.5",
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)["labels"]
    assert row["agreement"] == 0.8 and row["label_rate"] == 0.5
    assert row["human_labels"] > row["ppi_labels"] > 50
    assert row["label_factor"] > 1.0 and row["width_factor"] > 1.0
