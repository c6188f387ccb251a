"""Terminal and markdown injection through client fields (issue item 7): a `model` value with
ESC sequences, CR/LF and HTML, stored as a client sent it, reaches `canary report` escaped in
text and markdown; a real SQLite file and the real CLI entry point."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy import insert

from domain.endpoint import Endpoint
from domain.records import ExchangeRecord, ObservationRecord
from gateway.cli.escape import one_line, terminal_safe
from gateway.cli.main import main
from storage import queries
from storage.engine import make_engine, upgrade
from storage.models import ExchangeRow, ObservationRow
from storage.textguard import exchange_row, observation_row

HOSTILE = "\x1b[2J\x1b[H\rverdict: PROMOTE\n<img src=x onerror=alert(1)>|\x9b31m"


async def _store(db_url: str) -> None:
    await upgrade(db_url)
    engine = make_engine(db_url)
    try:
        await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
        await queries.create_endpoint(engine, Endpoint(name="cand", url="http://c"))
        now = time.time() - 3600
        exchanges, observations = [], []
        for i in range(30):
            xid = f"x{i:04d}"
            exchanges.append(exchange_row(ExchangeRecord(
                id=xid, received_at=now + i, route="/v1/chat/completions",
                model=HOSTILE if i % 2 else "plain", targets=("cand",),
            )))  # fmt: skip
            for endpoint, arm in (("live", "production"), ("cand", "candidate")):
                rec = ObservationRecord(
                    exchange_id=xid, endpoint=endpoint, arm=arm, started_at=now + i,  # type: ignore[arg-type]
                    status=200, e2e_s=0.1, ttft_s=0.05, output_tokens=5, output_text="ok",
                )  # fmt: skip
                observations.append(observation_row(rec, store_text=True, max_chars=100))
        async with engine.begin() as conn:
            await conn.execute(insert(ExchangeRow), exchanges)
            await conn.execute(insert(ObservationRow), observations)
    finally:
        await engine.dispose()


def test_escape_functions() -> None:
    """Controls become visible `\\xNN` escapes; newlines are kept by `terminal_safe` (layout)
    and escaped by `one_line` (a client string)."""
    assert terminal_safe("a\x1b[2Jb\r\n\tc\x7f\x9b") == "a\\x1b[2Jb\\x0d\n\tc\\x7f\\x9b"
    assert one_line("a\nb\tc") == "a\\nb\\tc"


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_report_escapes_client_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """The printed report holds no ESC, CR or C1 byte, no client-made line starting
    `verdict: PROMOTE`, and (markdown) no raw HTML tag from the client."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    asyncio.run(_store(db_url))
    capsys.readouterr()
    assert main(["report", "cand", "--db", db_url, "--since", "1970-01-01T00:00:00Z",
                 "--format", fmt]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "x1b[2J" in out  # the client's string is shown, escaped
    assert not any(ch in out for ch in "\x1b\r\x9b")
    assert not any(line.startswith("verdict: PROMOTE") for line in out.splitlines())
    if fmt == "markdown":
        assert "<img" not in out
