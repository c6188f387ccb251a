"""Agent-shaped copies for bench/mirror_rate.py `--agent`: tools declared, tool calls answered.

Each copy's request declares three functions with JSON-Schema parameters (required fields, an
enum, a bounded integer, a pattern) and `tool_choice: "auto"`, streamed. Both arms answer with
a streamed chat answer whose `tool_calls` deltas carry the call's id and name, then its
arguments in fragments, as vLLM's tool parsers stream them (`sse_events`, one declaration for
both arms):

- production: its RESULT frame holds what the worker's meter makes of that answer (the real
  `ResponseMeter` fed event by event, 50 ms to the first and 12 ms between events);
- the candidate: nginx serves the same events (`nginx_conf`), chosen and filled in from the
  `X-Canary-Mirror` header the mirror sends (the exchange id, `bench-<pid>-<copy>`), so its
  arguments differ from copy to copy as production's do. `/tokenize` answers a count, so the
  token counter counts every call's name and arguments.

Which answer a copy gets follows the copy number's last digit (`VARIANTS`): 0 and 5 two
parallel calls (20 %), 3 a refund, 7 a refund whose candidate arguments break the schema
(10 %: the candidate's answers are judged `schema`, production's `valid`), the rest one lookup.
A benchmark's stand-in, never a test oracle: it must never be imported by the product.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
from mirror_instructions import _HEADERS, CANDIDATE, Setup  # siblings, found through sys.path
from overhead import Procs, free_port

from gateway.mirror.channel import frames
from gateway.server.meter import MeterResult, ResponseMeter

_OBJECT = {"type": "object", "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {
        "name": "search_orders",
        "description": "Find the customer's orders matching a query.",
        "parameters": {**_OBJECT, "properties": {
            "query": {"type": "string", "minLength": 1},
            "status": {"type": "string", "enum": ["open", "shipped", "delivered", "cancelled"]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        }, "required": ["query"]},
    }},
    {"type": "function", "function": {
        "name": "get_order",
        "description": "One order by its id, with its items when asked.",
        "parameters": {**_OBJECT, "properties": {
            "order_id": {"type": "string", "pattern": "^ord_[a-z0-9-]+$"},
            "include_items": {"type": "boolean"},
        }, "required": ["order_id"]},
    }},
    {"type": "function", "function": {
        "name": "refund_order",
        "description": "Refund part or all of an order.",
        "parameters": {**_OBJECT, "properties": {
            "order_id": {"type": "string"},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 100000},
            "reason": {"type": "string", "enum": ["damaged", "late", "wrong_item", "other"]},
        }, "required": ["order_id", "amount_cents", "reason"]},
    }},
]  # fmt: skip

ID = "@ID@"  # the exchange id's place in an answer: filled in per copy (nginx: from the header)
# (name, argument fragments as streamed); `ID` is never split across fragments.
SEARCH = ("search_orders", ['{"query": "', ID, '", "status": "open"', ', "limit": 10}'])
LOOKUP = ("get_order", ['{"order_id": "', "ord_", ID, '", "include_items": ', "true}"])
_ORDER = ['{"order_id": "ord_', ID, '", "amount_cents": ']
REFUND = ("refund_order", [*_ORDER, "2500", ', "reason": "damaged"}'])
# Below `minimum` and outside the enum: the checker reports the first error (a `schema` verdict).
BAD_REFUND = ("refund_order", [*_ORDER, "0", ', "reason": "broken"}'])
# By the copy number's last digit: (production's calls, the candidate's calls).
VARIANTS: dict[str, tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]] = {
    "05": ([SEARCH, LOOKUP], [SEARCH, LOOKUP]),
    "3": ([REFUND], [REFUND]),
    "7": ([REFUND], [BAD_REFUND]),
}
DEFAULT = ([LOOKUP], [LOOKUP])

_SYSTEM = (
    "You are the order desk's assistant. Look orders up with the tools before answering; "
    "never guess an order id. Refunds over 100 dollars need a human."
)
_PREFIX, _SUFFIX = json.dumps(
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": "Where is my order? It was due on Monday. Ticket @N@"},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 256,
    },
    separators=(",", ":"),
).split("@N@")
_PREFIX_B, _SUFFIX_B = _PREFIX.encode(), _SUFFIX.encode()
_encode = msgspec.msgpack.Encoder().encode
_dumps = json.JSONEncoder(separators=(",", ":")).encode
FIRST_S, EVERY_S = 0.05, 0.012  # production's answer: time to the first event, between events


def body(i: int) -> bytes:
    """Copy `i`'s request: a distinct ticket number, so no two copies are duplicates."""
    return _PREFIX_B + str(i).encode() + _SUFFIX_B


def variant(i: int) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    last = str(i % 10)
    return next((v for digits, v in VARIANTS.items() if last in digits), DEFAULT)


def sse_events(calls: list[tuple[str, list[str]]]) -> list[str]:
    """A streamed chat answer (SSE events, `ID` unfilled) whose choice makes `calls` in
    parallel: per call a delta with its index, id and name, then one per argument fragment;
    then finish_reason tool_calls, the usage chunk and [DONE]."""

    def chunk(choices: list[object], usage: object = None) -> str:
        doc: dict[str, object] = {"id": f"chatcmpl-{ID}", "object": "chat.completion.chunk",
                                  "created": 1, "model": "m", "choices": choices}  # fmt: skip
        if usage is not None:
            doc["usage"] = usage
        return f"data: {_dumps(doc)}\n\n"

    def delta(d: dict[str, object], finish: str | None = None) -> str:
        return chunk([{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}])

    out = [delta({"role": "assistant", "content": ""})]
    for k, (name, fragments) in enumerate(calls):
        head = {"id": f"call-{ID}-{k}", "type": "function", "index": k,
                "function": {"name": name, "arguments": ""}}  # fmt: skip
        out.append(delta({"tool_calls": [head]}))
        out.extend(
            delta({"tool_calls": [{"index": k, "function": {"arguments": f}}]}) for f in fragments
        )
    out.append(delta({}, "tool_calls"))
    n = sum(2 + len(f) for _, f in calls)  # a plausible count: the meter keeps it, the mirror
    usage = {"prompt_tokens": 412, "completion_tokens": n, "total_tokens": 412 + n}  # recounts
    out.append(chunk([], usage))
    out.append("data: [DONE]\n\n")
    return out


_PRODUCTION = {digits: sse_events(v[0]) for digits, v in [*VARIANTS.items(), ("", DEFAULT)]}


def production_result(i: int, exchange_id: str) -> MeterResult:
    """What the worker's meter makes of production's answer to copy `i`."""
    last = str(i % 10)
    events = next((e for d, e in _PRODUCTION.items() if last in d), _PRODUCTION[""])
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=16384)
    now = FIRST_S
    for event in events:
        meter.feed(event.replace(ID, exchange_id).encode(), now)
        now += EVERY_S
    return meter.finish(now, 200)


def copy_frames(i: int) -> Iterator[bytes]:
    """Copy `i` as a worker sends it (COPY: meta + agent body), then production's RESULT."""
    exchange = f"bench-{os.getpid()}-{i}"
    data = body(i)
    meta = _encode(
        frames.CopyMeta(exchange, "POST", "/v1/chat/completions", f"req-{i}", time.time(),
                        "live", "bench-worker", _HEADERS, [CANDIDATE])
    )  # fmt: skip
    yield frames.frame_header(frames.KIND_COPY, len(meta), len(data)) + meta + data
    meta = _encode(frames.ResultMeta(exchange, None, production_result(i, exchange)))
    yield frames.frame_header(frames.KIND_RESULT, len(meta), 0) + meta


def _nginx_string(text: str) -> str:
    """`text` as a single-quoted nginx string, `ID` as the mirror header's value."""
    quoted = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return "'" + quoted.replace(ID, "${http_x_canary_mirror}") + "'"


TOKENIZE = '{"count":12,"max_model_len":32768,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12]}'


def nginx_conf(tmp: Path, port: int) -> str:
    """nginx as the candidate: each copy's streamed answer picked by the last digit of the
    exchange id in `X-Canary-Mirror` (the candidate's side of `VARIANTS`), `/tokenize` a count."""
    picks = [
        f'    "~[{d}]$" {_nginx_string("".join(sse_events(v[1])))};' for d, v in VARIANTS.items()
    ]
    default = _nginx_string("".join(sse_events(DEFAULT[1])))
    return "\n".join([
        "worker_processes 1;",
        f"pid {tmp}/nginx.pid;",
        f"error_log {tmp}/nginx-error.log warn;",
        "events { worker_connections 1024; }",
        "http {",
        "  access_log off;",
        "  keepalive_requests 1000000;",
        "  map $http_x_canary_mirror $agent_answer {",
        *picks,
        f"    default {default};",
        "  }",
        "  server {",
        f"    listen 127.0.0.1:{port} reuseport;",
        f"    location = /tokenize {{ default_type application/json; return 200 '{TOKENIZE}'; }}",
        "    location / { default_type text/event-stream; return 200 $agent_answer; }",
        "  }",
        "}",
        "",
    ])  # fmt: skip


class AgentSetup(Setup):
    """`Setup` with nginx answering as an agent's engine (`nginx_conf`)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs = Procs()
        port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(nginx_conf(tmp, port))
        self.procs.start("nginx", "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "err.log"),
                         "-g", "daemon off;", port=port)  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.script = tmp / "plane.py"  # written by the caller
        self.runs = 0
