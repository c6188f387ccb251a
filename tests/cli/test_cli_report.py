"""`canary report`: formats, output file, time windows and the exit codes for bad input."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from domain.errors import UsageError
from evaluators.pairs import synthetic
from gateway.cli.commands.report import parse_time
from gateway.cli.main import main
from storage.engine import make_engine, upgrade
from tests.evaluators.test_eval_pairs import SCENARIO, register, store

TOP_LEVEL = {
    "schema_version",
    "token_counts",
    "token_metrics",
    "candidate",
    "kind",
    "verdict",
    "reasons",
    "pairs",
    "metrics",
    "accounting",
    "ttft_by_turn",
    "arms_load",
    "generated_at",
    "caveats",
}


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A migrated SQLite database holding 300 pairs of `cand` (and its control) from 1 h ago."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"

    async def setup() -> None:
        await upgrade(url)
        engine = make_engine(url)
        try:
            await register(engine)
            await store(engine, synthetic.pairs(SCENARIO, 300, seed=1, start=time.time() - 3600))
        finally:
            await engine.dispose()

    asyncio.run(setup())
    return url


def test_json_has_the_documented_top_level(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--format json prints one JSON document with exactly the documented top-level keys."""
    assert main(["report", "cand", "--db", db, "--since", "2h", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == TOP_LEVEL
    assert report["verdict"] in ("promote", "hold", "reject")
    assert report["pairs"]["n"] > 250 and report["pairs"]["control"] == "ctrl"
    assert report["reasons"][0]["metric"] == "verdict"


def test_text_fits_80_columns(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The text report leads with the verdict and fits an 80-column terminal."""
    assert main(["report", "cand", "--db", db, "--since", "2h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("canary report: cand (quantized): ")
    assert max(len(line) for line in out.splitlines()) <= 80
    for section in ("WHY", "METRICS", "COPY ACCOUNTING", "TTFT BY TURN", "LOAD OF EACH ARM"):
        assert section in out


def test_html_goes_to_the_out_file(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out writes one self-contained HTML page with inline SVG plots (four fixed ones and an
    interval-against-pairs plot per gating metric) and no external links."""
    out = tmp_path / "r.html"
    assert (
        main(["report", "cand", "--db", db, "--since", "2h", "--format", "html", "--out", str(out)])
        == 0
    )
    assert "report written to" in capsys.readouterr().out
    page = out.read_text()
    assert page.count("<svg") > 4 and "interval against pairs" in page
    assert "<script" not in page and 'src="http' not in page and "<link" not in page


def test_markdown_and_planned_look(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Markdown renders the same sections; a planned look is recorded in the report."""
    args = ["report", "cand", "--db", db, "--since", "2h", "--planned-look"]
    assert main([*args, "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# canary report: cand") and "## Copy accounting" in md
    assert main([*args, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"]["planned_look"] is True


def test_bad_input_exits_2(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown candidate, a bad --since, an unmigrated database and a bad --db exit 2."""
    assert main(["report", "ghost", "--db", db]) == 2
    assert "no candidate named 'ghost'" in capsys.readouterr().err
    assert main(["report", "cand", "--db", db, "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    (tmp_path / "empty.db").touch()  # an existing, never migrated file (a missing one: exit 2)
    empty = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    assert main(["report", "cand", "--db", empty]) == 2
    assert "canary db upgrade" in capsys.readouterr().err
    assert main(["report", "cand", "--db", "mysql://x"]) == 2


def test_parse_time_forms() -> None:
    """--since accepts epoch seconds, ISO 8601 (naive = UTC) and ages like 2h."""
    assert parse_time("1700000000") == 1_700_000_000.0
    assert parse_time("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_time("1.5d", now=200_000.0) == 200_000.0 - 129_600
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000.0
    with pytest.raises(UsageError):
        parse_time("soon")


def test_strict_flag_tightens_the_margins(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--strict judges with the strict preset: the failure margin becomes 0.1 pp."""
    assert main(["report", "cand", "--db", db, "--since", "2h", "--format", "json"]) == 0
    default = json.loads(capsys.readouterr().out)["metrics"]["errors"]["margin"]
    args = ["report", "cand", "--db", db, "--since", "2h", "--format", "json", "--strict"]
    assert main(args) == 0
    strict = json.loads(capsys.readouterr().out)["metrics"]["errors"]["margin"]
    assert (default, strict) == (0.01, 0.001)
