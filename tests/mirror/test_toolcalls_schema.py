"""Safe schema compilation (gateway/mirror/toolcalls/schema.py): bounds, references, patterns,
the cache, and agreement with the reference validator `jsonschema` on generated tool schemas."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing

from domain.outcomes import ToolCheck
from gateway.mirror.toolcalls import Checker, ToolSpec


def one_tool(params: Any, name: str = "f") -> ToolSpec:
    raw = json.dumps({"type": "function", "function": {"name": name, "parameters": params}})
    s = ToolSpec.from_request([raw.encode()], None, None)
    assert s is not None
    return s


def verdict(checker: Checker, params: Any, args: Any) -> ToolCheck:
    out = checker.check(one_tool(params), [("f", json.dumps(args), "c1")])
    assert out is not None
    return out.check


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


@pytest.mark.timeout(20)
def test_catastrophic_backtracking_pattern_runs_in_linear_time() -> None:
    """'^(a+)+$' against 'aaaa…b' finishes (linear engine) and is a SCHEMA failure, not a hang."""
    checker = Checker()
    params = obj(s={"type": "string", "pattern": "^(a+)+$"})
    assert verdict(checker, params, {"s": "a" * 200_000 + "b"}) is ToolCheck.SCHEMA
    assert verdict(checker, params, {"s": "a" * 200_000}) is ToolCheck.VALID
    params = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}}
    assert verdict(checker, params, {"a" * 50_000 + "!": "x"}) is ToolCheck.VALID


@pytest.mark.parametrize("pattern", [r"^(a)\1$", "^(?=a)a$", "(?<!x)y", "a{1000}{1000}"])
def test_patterns_a_linear_engine_cannot_run_are_uncheckable(pattern: str) -> None:
    """Backreferences, lookaround and huge compiled patterns make a schema UNCHECKABLE(pattern)."""
    checker = Checker()
    for params in (
        obj(s={"type": "string", "pattern": pattern}),
        {"type": "object", "patternProperties": {pattern: {}}},
    ):
        assert verdict(checker, params, {"s": "a"}) is ToolCheck.UNCHECKABLE
    assert checker.counters["uncheckable_pattern"] == 2


def test_pattern_over_the_length_bound_is_uncheckable() -> None:
    """A pattern longer than max_pattern_chars is refused before it is compiled."""
    checker = Checker(max_pattern_chars=10)
    assert verdict(checker, obj(s={"pattern": "^[a-z]{1,3}$"}), {}) is ToolCheck.UNCHECKABLE
    assert verdict(checker, obj(s={"pattern": "^[a-z]$"}), {}) is ToolCheck.VALID
    assert checker.schemas.refused["pattern"] == 1


def test_remote_refs_are_refused_without_any_connection(tmp_path: Path) -> None:
    """A $ref to a live HTTP listener, a file or a relative URI is UNCHECKABLE(remote_ref); the
    listener never sees a connection and the file is never read into a verdict."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    local = tmp_path / "s.json"
    local.write_text(json.dumps({"type": "string"}))
    checker = Checker()
    try:
        for ref in (f"http://127.0.0.1:{port}/s.json", local.as_uri(), "s.json", "other#/x"):
            assert verdict(checker, obj(a={"$ref": ref}), {"a": "x"}) is ToolCheck.UNCHECKABLE
        meta = {"$schema": f"http://127.0.0.1:{port}/meta", "type": "object"}
        assert verdict(checker, meta, {}) is ToolCheck.UNCHECKABLE
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert checker.counters["uncheckable_remote_ref"] == 5


def test_local_refs_and_defs_resolve() -> None:
    """$ref into $defs, into definitions and to the root itself resolve inside the schema."""
    checker = Checker()
    params = {
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/place"}, "work": {"$ref": "#/definitions/p"}},
        "$defs": {"place": {"type": "object", "required": ["city"]}},
        "definitions": {"p": {"type": "string", "maxLength": 5}},
        "required": ["home"],
    }
    assert verdict(checker, params, {"home": {"city": "Oslo"}, "work": "HQ"}) is ToolCheck.VALID
    out = checker.check(one_tool(params), [("f", '{"home": {}}', "c1")])
    assert out is not None and out.check is ToolCheck.SCHEMA and out.pointer == "/home"
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    args = {"kids": [{"kids": [{"kids": 3}]}]}
    out = checker.check(one_tool(tree), [("f", json.dumps(args), "c1")])
    assert (
        out is not None and out.check is ToolCheck.SCHEMA and out.pointer == "/kids/0/kids/0/kids"
    )


def test_schemas_over_the_byte_or_depth_bound_are_uncheckable() -> None:
    """A schema over max_schema_bytes or deeper than max_schema_depth is refused uncompiled."""
    checker = Checker(max_schema_bytes=2048, max_schema_depth=8)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200)}}
    assert verdict(checker, wide, {}) is ToolCheck.UNCHECKABLE
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(6):
        deep = {"type": "object", "properties": {"x": deep}}
    assert verdict(checker, deep, {}) is ToolCheck.UNCHECKABLE
    assert verdict(checker, obj(a={"type": "string"}), {"a": "x"}) is ToolCheck.VALID
    very_deep = '{"type": "object", "properties": {"x": ' * 2000 + "{}" + "}}" * 2000
    raw = b'{"type": "function", "name": "f", "parameters": ' + very_deep.encode() + b"}"
    s = ToolSpec.from_request([raw], None, None)
    out = checker.check(s, [("f", "{}", "c1")], api="responses")
    assert out is not None and out.check is ToolCheck.UNCHECKABLE
    counters = checker.counters
    assert counters["uncheckable_too_big"] == 1 and counters["uncheckable_too_deep"] == 2


@pytest.mark.parametrize("params", [{"type": "objec"}, {"minimum": "one"}, [1, 2], 3])
def test_invalid_schemas_are_uncheckable(params: Any) -> None:
    """A schema that is not a valid JSON Schema is UNCHECKABLE(invalid_schema)."""
    checker = Checker()
    assert verdict(checker, params, {}) is ToolCheck.UNCHECKABLE
    assert checker.counters["uncheckable_invalid_schema"] == 1


def test_format_is_an_annotation() -> None:
    """`format` is not asserted (as OpenAI does): a non-date under format date-time is valid."""
    params = obj(when={"type": "string", "format": "date-time"}, mail={"format": "email"})
    assert verdict(Checker(), params, {"when": "tomorrow", "mail": "nobody"}) is ToolCheck.VALID


def test_one_compile_per_schema_and_the_cache_bound() -> None:
    """Equal schemas (any key order) compile once; past cache_size the oldest is evicted."""
    checker = Checker(cache_size=2)
    a = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    a_reordered = {"required": ["x"], "properties": {"x": {"type": "integer"}}, "type": "object"}
    for params in (a, a_reordered, a):
        assert verdict(checker, params, {"x": 1}) is ToolCheck.VALID
    assert checker.counters["compiled"] == 1 and checker.counters["cache_hits"] == 2
    for n in range(3):
        assert verdict(checker, obj(**{f"k{n}": {"type": "string"}}), {}) is ToolCheck.VALID
    counters = checker.counters
    assert counters["compiled"] == 4 and counters["evicted"] == 2 and counters["cached"] == 2
    assert verdict(checker, a, {"x": "1"}) is ToolCheck.SCHEMA  # evicted: compiled again
    assert checker.counters["compiled"] == 5


# Cross-check: an independent generator of tool-shaped (schema, instance) pairs, judged by the
# checker (jsonschema-rs) and by `jsonschema` with a registry that retrieves nothing.

WORDS = ["alpha", "beta", "gamma", "delta", "Paris", "", "x1", "ZZ"]
PATTERNS = ["^[a-z]+$", "^[A-Z][a-z]*$", "[0-9]", "^x[0-9]$", "^(ab|cd)*$"]


def gen_schema(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum", "const", "nullable"]
    if depth < 3:
        kinds += ["object", "object", "array", "anyOf", "oneOf", "ref"]
    kind = rng.choice(kinds)
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.4:
            s["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.4:
            s["maxLength"] = rng.randint(2, 6)
        if rng.random() < 0.4:
            s["pattern"] = rng.choice(PATTERNS)
        return s
    if kind in ("integer", "number"):
        s = {"type": kind}
        if rng.random() < 0.6:
            s["minimum"] = rng.randint(-5, 5)
        if rng.random() < 0.6:
            s["maximum"] = rng.randint(5, 20)
        if rng.random() < 0.3:
            s["exclusiveMinimum"] = rng.randint(-10, 0)
        if kind == "integer" and rng.random() < 0.3:
            s["multipleOf"] = rng.randint(2, 4)
        return s
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["c", "f", 1, 2.5, None, True, "k"], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["on", 0, False])}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer"]), "null"]}
    if kind == "array":
        a: dict[str, Any] = {"type": "array", "items": gen_schema(rng, depth + 1)}
        if rng.random() < 0.4:
            a["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.4:
            a["maxItems"] = rng.randint(1, 4)
        if rng.random() < 0.2:
            a["uniqueItems"] = True
        return a
    if kind in ("anyOf", "oneOf"):
        return {kind: [gen_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if kind == "ref":
        return {"$ref": "#/$defs/shared"}
    return gen_object(rng, depth)


def gen_object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(["location", "unit", "query", "top_k", "tags", "when", "n"], 3)
    props = {name: gen_schema(rng, depth + 1) for name in names}
    o: dict[str, Any] = {"type": "object", "properties": props}
    o["required"] = [n for n in names if rng.random() < 0.5]
    if rng.random() < 0.5:
        o["additionalProperties"] = rng.choice([False, {"type": "integer"}])
    return o


def gen_instance(rng: random.Random, schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A value shaped after `schema`, wrong on purpose at some nodes."""
    if rng.random() < 0.08:
        return rng.choice([None, "stray", -3, 7.5, [], {}, True])
    if "$ref" in schema:
        return gen_instance(rng, defs["shared"], defs)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return gen_instance(rng, rng.choice(schema[key]), defs)
    kind = schema["type"]
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "string":
        return rng.choice(WORDS) * rng.randint(1, 2)
    if kind == "integer":
        return rng.randint(-12, 25) * rng.choice([1, 1, 2])
    if kind == "number":
        return rng.choice([rng.randint(-12, 25), rng.uniform(-12, 25), 3.0])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [gen_instance(rng, schema["items"], defs) for _ in range(rng.randint(0, 4))]
    out = {
        name: gen_instance(rng, sub, defs)
        for name, sub in schema["properties"].items()
        if name in schema["required"] or rng.random() < 0.7
    }
    if rng.random() < 0.1:
        out["extra"] = rng.randint(0, 3)
    return out


def test_agrees_with_jsonschema_on_generated_tool_schemas() -> None:
    """On 4,000 generated tool-shaped (schema, arguments) pairs the checker's valid/invalid verdict
    equals `jsonschema`'s (Draft 2020-12, no retrieval), with both outcomes well represented."""
    rng = random.Random(20261205)
    checker = Checker(cache_size=512)
    registry: referencing.Registry[Any] = referencing.Registry()
    counts = {ToolCheck.VALID: 0, ToolCheck.SCHEMA: 0}
    for _ in range(400):
        defs = {"shared": gen_object(rng, 2)}
        schema = {**gen_object(rng, 0), "$defs": defs}
        reference = jsonschema.Draft202012Validator(schema, registry=registry)
        spec = one_tool(schema)
        for _ in range(10):
            args = gen_instance(rng, schema, defs)
            if not isinstance(args, dict):
                args = {}
            out = checker.check(spec, [("f", json.dumps(args), "c1")])
            assert out is not None and out.check in counts, (schema, args, out)
            expected = ToolCheck.VALID if reference.is_valid(args) else ToolCheck.SCHEMA
            assert out.check is expected, (schema, args, out)
            counts[out.check] += 1
    assert min(counts.values()) > 1000, counts
