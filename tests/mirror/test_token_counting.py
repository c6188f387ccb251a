"""Tokens counted, not events: on engines that pack 1-4 tokens into an SSE event at random (as a
busy vLLM does), identical answers get identical token counts on both arms of every pair,
streamed and not, with and without the client's `include_usage` (real `canary serve` with its
mirror process, the official OpenAI SDK, two engines on 127.0.0.1:0, a real SQLite file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import sqlalchemy as sa
from aiohttp import web

from storage.engine import make_engine
from tests.packing_engine import PackingEngine, tokenize
from tests.process.test_serve_cli import start_serve, stop

CONVERSATIONS = 24


async def _engine(seed: int) -> tuple[PackingEngine, web.AppRunner, str]:
    engine = PackingEngine(seed)
    runner = web.AppRunner(engine.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return engine, runner, f"http://127.0.0.1:{port}"


async def _traffic(url: str) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    try:
        for i in range(CONVERSATIONS):
            messages = [{"role": "user", "content": f"question {i}"}]
            mode = i % 3
            if mode == 0:  # not streamed
                await client.chat.completions.create(
                    model="m",
                    messages=messages,
                    max_tokens=40,  # type: ignore[arg-type]
                )
                continue
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=40,
                stream=True,
                stream_options={"include_usage": True} if mode == 2 else None,
            )
            async for _ in stream:
                pass
    finally:
        await client.close()


async def test_identical_texts_get_identical_counts_on_packing_engines(tmp_path: Path) -> None:
    """Production and a control that answer identically but pack events differently: every
    pair's two counts are equal (100 %), counted by the control's /tokenize, equal to the
    text's true token count; event counts differ in some pairs (the packing happened), and the
    engine's usage is kept beside them as information (one more id, EOS, when it stopped)."""
    live, live_runner, live_url = await _engine(1)
    control, ctl_runner, ctl_url = await _engine(2)
    config = tmp_path / "gateway.toml"
    config.write_text(
        "counters_flush_interval_s = 0.5\nregistry_poll_interval_s = 0.5\n"
        'mirror_priority = "normal"\n'
        "[[candidates]]\n"
        f'name = "ctl"\nkind = "control"\nurl = "{ctl_url}"\nsample_rate = 1.0\n'
    )
    try:
        proc, url = await start_serve(tmp_path, "--live", live_url, "--config", str(config))
        try:
            await _traffic(url)
            engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}")
            try:
                rows = await _until_stored(engine)
            finally:
                await engine.dispose()
        finally:
            code, err = await stop(proc)
        assert code == 0, err
    finally:
        await live_runner.cleanup()
        await ctl_runner.cleanup()
    by_exchange: dict[str, dict[str, sa.Row[tuple[object, ...]]]] = {}
    for row in rows:
        by_exchange.setdefault(row.exchange_id, {})[row.arm] = row
    assert len(by_exchange) == CONVERSATIONS
    differing_events = 0
    for arms in by_exchange.values():
        prod, ctl = arms["production"], arms["candidate"]
        assert prod.output_text == ctl.output_text
        assert prod.output_tokens == ctl.output_tokens == len(tokenize(prod.output_text))
        assert prod.token_counter == ctl.token_counter == "tokenize:ctl"
        eos = 1 if prod.finish_reason == "stop" else 0
        if prod.usage_tokens is not None:  # not streamed, or streamed with include_usage
            assert prod.usage_tokens == prod.output_tokens + eos
        if prod.token_events is not None:  # streamed
            assert prod.tpot_s is not None or prod.output_tokens <= 1
            differing_events += prod.token_events != ctl.token_events
    assert differing_events > 0, "the engines never packed differently: the test proves nothing"
    # Identical texts are counted once per tokenizer: one /tokenize per distinct text, and the
    # live engine is never asked.
    assert control.tokenize_calls == CONVERSATIONS and live.tokenize_calls == 0


async def _until_stored(engine: sa.ext.asyncio.AsyncEngine) -> list[sa.Row[tuple[object, ...]]]:
    query = sa.text(
        "SELECT exchange_id, arm, output_text, output_tokens, token_counter, usage_tokens, "
        "token_events, tpot_s, finish_reason FROM observations"
    )
    async with asyncio.timeout(60):
        while True:
            try:
                async with engine.connect() as conn:
                    rows = list((await conn.execute(query)).fetchall())
            except sa.exc.OperationalError:  # the table is not there yet
                rows = []
            if len(rows) >= 2 * CONVERSATIONS:
                return rows
            await asyncio.sleep(0.1)
