"""The endpoint is declared once (domain.endpoint.CandidateSpec and Endpoint): the admin API's
view and patch body, the `endpoints` table, the CLI flags and the config file's `live_*` keys
follow from that declaration, so none of them can drift from it; a new field reaches each."""

from __future__ import annotations

import argparse
from typing import Annotated, Any

import msgspec
import msgspec.inspect
import pytest
from msgspec import Meta
from sqlalchemy import Integer

from domain.endpoint import MUTABLE_FIELDS, CandidatePatch, CandidateSpec, Endpoint
from gateway.cli.commands import candidates as cli
from gateway.config.sections import LiveConfig
from gateway.control.admin.openapi import openapi_document
from gateway.control.admin.schema import EndpointView
from storage.models import Base, endpoint_columns

mi = msgspec.inspect

SPEC = CandidateSpec.__struct_fields__


def test_endpoint_is_the_spec_plus_role_and_bookkeeping() -> None:
    assert Endpoint.__struct_fields__ == (*SPEC, "role", "version", "created_at", "updated_at")
    assert EndpointView.__struct_fields__ == Endpoint.__struct_fields__


def test_patch_is_every_field_but_the_name_plus_role() -> None:
    assert ("role", *(f for f in SPEC if f != "name")) == MUTABLE_FIELDS
    assert CandidatePatch.__struct_fields__ == MUTABLE_FIELDS
    patch = msgspec.json.decode(b'{"target_rps": null, "gpus": 2}', type=CandidatePatch)
    assert patch.changes() == {"target_rps": None, "gpus": 2}
    with pytest.raises(msgspec.ValidationError, match="gpus"):
        msgspec.json.decode(b'{"gpus": 0}', type=CandidatePatch)  # the spec's bounds apply
    with pytest.raises(msgspec.ValidationError, match="name"):
        msgspec.json.decode(b'{"name": "x"}', type=CandidatePatch)


def test_table_columns_are_the_endpoint_fields() -> None:
    table = Base.metadata.tables["endpoints"]
    assert [c.name for c in table.columns] == ["id", *Endpoint.__struct_fields__]
    nullable = {c.name for c in table.columns if c.nullable}
    optional = {f.name for f in _fields(Endpoint) if mi.NoneType() in _members(f.type)}
    dicts = {f.name for f in _fields(Endpoint) if isinstance(_bare(f.type), mi.DictType)}
    assert nullable == optional | dicts
    assert {"model", "target_rps", "credentials_env", "verdict"} <= nullable


def test_cli_flags_are_the_spec_fields() -> None:
    parser = argparse.ArgumentParser()
    cli._field_options(parser)
    flags = {a.dest for a in parser._actions if a.option_strings} - {"help"}
    assert flags == {*SPEC} - {"name", "url", "state"}


def test_openapi_bodies_and_view_carry_every_field() -> None:
    components = openapi_document()["components"]["schemas"]
    assert set(components["CandidateCreate"]["properties"]) == set(SPEC)
    assert set(components["CandidatePatch"]["properties"]) == set(MUTABLE_FIELDS)
    assert set(components["EndpointView"]["properties"]) == set(Endpoint.__struct_fields__)


def test_config_live_keys_have_the_endpoint_types() -> None:
    """`[live] <field>` of the config file is the live Endpoint's <field>, same declared type
    (url is checked by check_http_url, which admits what Url's pattern admits and more)."""
    live = {f.name: _bare(f.type) for f in _fields(LiveConfig)}
    ep = {f.name: _bare(f.type) for f in _fields(Endpoint)}
    assert live and all(k in ep for k in live)
    for key in live:
        if key != "url":
            assert live[key] == ep[key], key


def _fields(struct: type[msgspec.Struct]) -> tuple[msgspec.inspect.Field, ...]:
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    return info.fields


def _bare(t: Any) -> Any:
    """The type with its bounds, without descriptions (help texts may differ)."""
    if isinstance(t, msgspec.inspect.UnionType):
        return tuple(_bare(m) for m in t.types)
    return _bare(t.type) if isinstance(t, msgspec.inspect.Metadata) else t


def test_a_new_field_reaches_the_table_from_its_declaration() -> None:
    """What adding `max_tokens_cap` to CandidateSpec gives the table: a nullable INTEGER."""

    class Extended(Endpoint, frozen=True, kw_only=True):
        max_tokens_cap: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None

    (column,) = [c for c in endpoint_columns(Extended) if c.name == "max_tokens_cap"]
    assert isinstance(column.type, Integer) and column.nullable


def _members(t: Any) -> tuple[Any, ...]:
    return t.types if isinstance(t, mi.UnionType) else (t,)
