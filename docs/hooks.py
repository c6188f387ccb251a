"""mkdocs hooks: the pages that are generated from a declaration instead of written twice.

- `index.md` is README.md, the landing page, with its links rewritten for the site;
- `reference/api.md` is rendered from the admin API's OpenAPI document
  (`gateway.control.admin.openapi.openapi_document`): every path, method, summary, parameter,
  request field and response;
- `reference/cli.md` is the `canary` command's own `--help`, for every subcommand.

Nothing here is written into docs/: the pages exist only in the built site. The render
functions are plain (no mkdocs types) so that tests/test_docs.py checks them directly.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("index.md", "reference/api.md", "reference/cli.md")
_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
_METHODS = ("get", "post", "put", "patch", "delete")


# --- index.md: the README, as the site's landing page -----------------------------------------


def render_index(readme: str) -> str:
    """README.md with links into docs/ made site-relative and links to other repository files
    shown as their paths (the site holds only docs/)."""

    def link(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if "://" in target or target.startswith("#"):
            return m.group(0)
        if target.startswith("docs/"):
            return f"[{label}]({target.removeprefix('docs/')})"
        return f"{label} (`{target}`)"

    return _LINK.sub(link, readme)


# --- reference/api.md: the admin API from its OpenAPI document --------------------------------


def _schema_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def _type(schema: dict[str, Any]) -> str:
    """A short human form of a JSON Schema: `string`, `integer | null`, `EndpointView`, …"""
    name = _schema_name(schema)
    if name is not None:
        return f"[{name}](#{name.lower()})"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(_type(s) for s in schema[key])
    kind = schema.get("type", "any")
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type(schema['items'])}"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields(schema: dict[str, Any]) -> list[str]:
    """A table of an object schema's properties: name, type, required, description."""
    props: dict[str, Any] = schema.get("properties", {})
    if not props:
        return [f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", ()))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in props.items():
        described = _cell(prop.get("description", ""))
        mark = "yes" if name in required else ""
        rows.append(f"| `{name}` | {_type(prop)} | {mark} | {described} |")
    return [*rows, ""]


def render_api(doc: dict[str, Any]) -> str:
    """The admin API reference: one section per path and method, then every schema it names."""
    info = doc["info"]
    base = doc.get("servers", [{"url": ""}])[0]["url"]
    out = [
        "# Admin API reference",
        "",
        f"Generated from the OpenAPI {doc['openapi']} document the gateway serves at "
        f"`{base}/openapi.json` ({info['title']}, version {info['version']}); this page is "
        "rebuilt with the site, so it cannot drift from the handlers.",
        "",
        info.get("description", ""),
        "",
        "Every operation needs `Authorization: Bearer TOKEN` unless it says otherwise.",
        "",
    ]
    schemas: dict[str, Any] = doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method in _METHODS:
            op = ops.get(method)
            if op is None:
                continue
            out += [f"## {method.upper()} {base}{path}", "", f"{op['summary']}.", ""]
            out += [f"Operation id: `{op['operationId']}`."]
            if op.get("security") == []:
                out += [" No token needed."]
            out += [""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | description |"]
                out += ["|---|---|---|---|---|"]
                for p in params:
                    mark = "yes" if p.get("required") else ""
                    described = _cell(p.get("description", ""))
                    out += [
                        f"| `{p['name']}` | {p['in']} | {_type(p['schema'])} | {mark} "
                        f"| {described} |"
                    ]
                out += [""]
            body = op.get("requestBody")
            if body is not None:
                schema = body["content"]["application/json"]["schema"]
                name = _schema_name(schema)
                need = "required" if body.get("required") else "optional"
                out += [f"Request body ({need}, JSON): {_type(schema)}", ""]
                out += _fields(schemas[name] if name else schema)
            out += ["| status | meaning | body |", "|---|---|---|"]
            for code, resp in op["responses"].items():
                content = resp.get("content", {}).get("application/json")
                shape = _type(content["schema"]) if content else ""
                out += [f"| {code} | {_cell(resp['description'])} | {shape} |"]
            out += [""]
    out += ["## Schemas", ""]
    for name, schema in schemas.items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        out += _fields(schema)
    return "\n".join(out)


# --- reference/cli.md: the canary command from its parser -------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render_cli(parser: argparse.ArgumentParser) -> str:
    """`canary --help` and every subcommand's `--help`, nested ones included, in order."""
    out = [
        "# Command reference",
        "",
        "Generated from the `canary` command's own argument parser when the site is built: "
        "each section is what `--help` prints.",
        "",
    ]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; a fixed width for the page
    try:
        stack: list[tuple[str, argparse.ArgumentParser]] = [("canary", parser)]
        while stack:
            name, sub = stack.pop(0)
            level = "#" * min(2 + name.count(" "), 4)
            out += [f"{level} `{name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
            stack = [(f"{name} {n}", p) for n, p in _subcommands(sub).items()] + stack
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(out)


# --- mkdocs events ----------------------------------------------------------------------------


def generated_pages() -> dict[str, str]:
    """Each generated page's path under docs/ and its markdown."""
    from gateway.cli.main import build_parser
    from gateway.control.admin.openapi import openapi_document

    return {
        "index.md": render_index((ROOT / "README.md").read_text(encoding="utf-8")),
        "reference/api.md": render_api(openapi_document()),
        "reference/cli.md": render_cli(build_parser()),
    }


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (mkdocs' `on_files` event)."""
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
