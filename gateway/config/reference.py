"""The configuration reference: every setting with its type, default, description and
variables, from the declaration (docs/gen_config.py renders it as docs/configuration.md)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from gateway.config.names import ENV_PREFIX, FLAT_KEYS
from gateway.config.sections import SECTIONS, GatewayConfig


class ConfigKey(msgspec.Struct, frozen=True, kw_only=True):
    """One setting as the reference documents it."""

    section: str  # "" for the top-level tables `verdict` and `candidates`
    key: str
    type: str
    default: Any
    description: str
    env: str | None  # the sectioned variable; None: not settable from the environment
    flat: str | None  # its flat name of before the sections


_JSON_TYPES: Final = {
    "integer": "int",
    "number": "float",
    "string": "str",
    "boolean": "bool",
    "null": "unset",
    "object": "table",
}


def _number(value: float) -> str:
    """A bound as the docs show it: 0 and 0.0 alike, whichever the schema emits."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _type_text(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(f'"{v}"' for v in prop["enum"])
    if "anyOf" in prop:
        return " | ".join(_type_text(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return "table"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list[{_type_text(prop.get('items', {}))}]"
    text = _JSON_TYPES.get(kind, kind)
    bounds = [
        f"{op} {_number(prop[name])}"
        for name, op in (
            ("exclusiveMinimum", ">"),
            ("minimum", ">="),
            ("exclusiveMaximum", "<"),
            ("maximum", "<="),
        )
        if name in prop
    ]
    if "pattern" in prop:
        bounds.append(f"matching {prop['pattern']}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def reference() -> list[ConfigKey]:
    """Every setting with its type, default and description, from the declaration above."""
    schema = msgspec.json.schema(GatewayConfig)
    defs = schema["$defs"]
    flat_of = {dotted: old for old, dotted in FLAT_KEYS.items()}
    defaults = msgspec.to_builtins(GatewayConfig())
    out: list[ConfigKey] = []
    for section, cls in SECTIONS.items():
        for key, prop in defs[cls.__name__]["properties"].items():
            dotted = f"{section}.{key}"
            out.append(
                ConfigKey(
                    section=section,
                    key=key,
                    type=_type_text(prop),
                    default=defaults[section].get(key),
                    description=prop.get("description", ""),
                    env=f"{ENV_PREFIX}{section.upper()}_{key.upper()}",
                    flat=flat_of.get(dotted),
                )
            )
    top = defs[GatewayConfig.__name__]["properties"]
    out += [
        ConfigKey(
            section="",
            key=key,
            type="table" if key == "verdict" else "array of tables",
            default=defaults[key],
            description=top[key].get("description", ""),
            env=None,
            flat=None,
        )
        for key in ("verdict", "candidates")
    ]
    return out
