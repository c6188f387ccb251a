"""µs per tool-call check (gateway/mirror/toolcalls), and the two validators it was chosen from.

For each schema shape (small, typical, nested, with patterns) it times, on one answer with one
call: `Checker.check` with the schema cached (the common case), the same with a first compile
(a schema the cache has not seen), and the validation alone for jsonschema-rs (the choice) and
for `jsonschema` with RE2 plugged into `pattern`/`patternProperties` (the pure-Python candidate,
which needs `google-re2` from the dev extra). Prints a table; run on an idle host:

    .venv/bin/python bench/toolcalls.py [--n 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import jsonschema_rs
import re2
import referencing
from jsonschema import validators

from gateway.mirror.toolcalls import Checker, ToolCheck, ToolSpec

SMALL = {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["location"],
}
TYPICAL = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
        "lang": {"type": "string", "enum": ["en", "fr", "de", "ja"]},
        "safe": {"type": "boolean"},
        "sites": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "after": {"type": "string", "format": "date"},
    },
    "required": ["query"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "order": {"$ref": "#/$defs/order"},
        "notify": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/contact"}]},
    },
    "required": ["order"],
    "$defs": {
        "contact": {
            "type": "object",
            "properties": {"email": {"type": "string"}, "phone": {"type": "string"}},
            "additionalProperties": False,
        },
        "order": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "lines": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                            "options": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                        "required": ["sku", "qty"],
                    },
                },
                "ship": {"oneOf": [{"const": "standard"}, {"const": "express"}]},
            },
            "required": ["id", "lines"],
        },
    },
}
PATTERNS = {
    "type": "object",
    "properties": {
        "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"},
        "email": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$"},
        "ref": {"type": "string", "pattern": "^(INV|PO)-[0-9]{4,8}$"},
    },
    "patternProperties": {"^x-[a-z]+$": {"type": "string"}},
    "required": ["iban", "email"],
}
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "small (get_weather)": (SMALL, {"location": "Paris, FR", "unit": "c"}),
    "typical (search, 6 fields)": (
        TYPICAL,
        {"query": "canary deploys", "top_k": 5, "lang": "en", "sites": ["a.org", "b.org"]},
    ),
    "nested ($defs, anyOf, oneOf)": (
        NESTED,
        {
            "order": {
                "id": 42,
                "lines": [
                    {"sku": "A-1", "qty": 2},
                    {"sku": "B-7", "qty": 1, "options": {"c": "red"}},
                ],
                "ship": "express",
            },
            "notify": {"email": "a@b.co"},
        },
    ),
    "patterns (3 + patternProperties)": (
        PATTERNS,
        {
            "iban": "DE44500105175407324931",
            "email": "ops@example.com",
            "ref": "PO-12345",
            "x-t": "v",
        },
    ),
}


def _re2_keyword(kind: str) -> Callable[..., Iterator[jsonschema.ValidationError]]:
    def pattern(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(instance, str) and not re2.search(value, instance):
            yield jsonschema.ValidationError(f"does not match {value!r}")

    def pattern_properties(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not isinstance(instance, dict):
            return
        for pat, sub in value.items():
            for key, item in instance.items():
                if re2.search(pat, key):
                    yield from validator.descend(item, sub, path=key, schema_path=pat)

    return pattern if kind == "pattern" else pattern_properties


# The pure-Python candidate: jsonschema with RE2 for both regex keywords, no retrieval.
RE2Validator = validators.extend(
    jsonschema.Draft202012Validator,
    {"pattern": _re2_keyword("pattern"), "patternProperties": _re2_keyword("patternProperties")},
)
REGISTRY: referencing.Registry[Any] = referencing.Registry()


def per_call_us(fn: Callable[[], object], n: int) -> float:
    for _ in range(min(n, 500)):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n / 1000)
    return best


def spec_of(schema: dict[str, Any], salt: int = 0) -> ToolSpec:
    params = {**schema, "description": f"v{salt}"} if salt else schema
    raw = json.dumps({"type": "function", "function": {"name": "f", "parameters": params}})
    out = ToolSpec.from_request([raw.encode()], None, None)
    assert out is not None
    return out


def measure(schema: dict[str, Any], instance: dict[str, Any], n: int) -> tuple[float, ...]:
    arguments = json.dumps(instance)
    checker = Checker(cache_size=n + 1000)
    spec = spec_of(schema)
    call = [("f", arguments, "call_1")]
    verdict = checker.check(spec, call)
    assert verdict is not None and verdict.check is ToolCheck.VALID, verdict
    hit = per_call_us(lambda: checker.check(spec, call), n)
    # A first compile: every check sees a schema (a new description) the cache has not.
    m = max(n // 20, 200)
    fresh = iter([spec_of(schema, salt) for salt in range(1, 3 * m + 600)])
    first = per_call_us(lambda: checker.check(next(fresh), call), m)
    raw = [json.dumps({"type": "function", "function": {"name": "f", "parameters": schema}})]
    tools = [r.encode() for r in raw]
    build = per_call_us(lambda: ToolSpec.from_request(tools, None, None), m)
    rs = jsonschema_rs.validator_for(schema, validate_formats=False)
    py = RE2Validator(schema, registry=REGISTRY)
    assert rs.is_valid(instance) and py.is_valid(instance)
    rs_us = per_call_us(lambda: rs.is_valid(instance), n)
    py_us = per_call_us(lambda: py.is_valid(instance), max(n // 10, 200))
    py_build = per_call_us(lambda: RE2Validator(schema, registry=REGISTRY), m)
    return hit, first, build, rs_us, py_us, py_build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="calls per timing (best of 3)")
    args = parser.parse_args()
    n = args.n
    rows = [(label, *measure(schema, instance, n)) for label, (schema, instance) in CASES.items()]
    print(f"load: {os.getloadavg()}, n={n}")
    print(
        "| schema | check, cached (µs) | check, first compile (µs) | ToolSpec.from_request (µs) "
        "| jsonschema-rs is_valid (µs) | jsonschema+RE2 is_valid (µs) | jsonschema+RE2 build (µs) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, *nums in rows:
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in nums) + " |")


if __name__ == "__main__":
    main()
