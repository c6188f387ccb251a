"""Passive response meter: watches a response's bytes as they pass, never copies the stream.

(MeterResult is fixed here; the incremental ResponseMeter lands with the proxy work.)
"""

from __future__ import annotations

import msgspec


class MeterResult(msgspec.Struct, kw_only=True):
    """What one response looked like, by vLLM `bench serve` conventions (DESIGN.md §6).

    Durations are seconds from the moment the request was sent upstream.
    """

    status: int
    is_sse: bool
    ttft_s: float | None = None  # first chunk carrying a token (content, text or tool call)
    e2e_s: float | None = None  # last token-carrying chunk (SSE) or last byte (plain JSON)
    last_byte_s: float | None = None
    itl_count: int = 0
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    tpot_s: float | None = None  # (e2e - ttft) / (output_tokens - 1), output_tokens > 1
    chunk_count: int = 0  # SSE events (or body chunks for non-SSE)
    token_chunk_count: int = 0
    output_tokens: int | None = None
    output_tokens_source: str | None = None  # "usage" | "chunks"
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""  # output text, up to the meter's text limit
    text_truncated: bool = False
    text_hash: str | None = None  # hex xxh3_128 of the full output text (all of it, not truncated)
    tool_calls: list[tuple[str, str]] | None = None  # (name, arguments JSON text), in order
    parse_errors: int = 0  # events that were not valid JSON (garbage)
    saw_done: bool = False  # `data: [DONE]` seen
    bytes_total: int = 0
