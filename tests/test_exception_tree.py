"""One exception tree (domain/errors.py): every exception class our packages declare descends
from `CanaryError`, and each boundary maps the tree in its own convention."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from domain import errors
from domain.errors import CanaryError, UsageError
from gateway.cli.client import AdminAPIError, AdminUnreachable
from gateway.cli.errors import cli_errors
from gateway.control.admin.boundary import ApiError, map_exception
from gateway.control.reports import ReportDoc

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "gateway", "evaluators", "storage")


def _module_names() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            if rel.name == "__main__":  # runs the CLI when imported
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.append(".".join(parts))
    return names


def test_every_exception_class_is_in_the_tree() -> None:
    """Importing every module of ours, each exception class it defines is a CanaryError, and
    the tree's docstring names it."""
    found: dict[str, type[BaseException]] = {}
    for name in _module_names():
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[f"{name}.{cls_name}"] = cls
    outside = sorted(n for n, cls in found.items() if not issubclass(cls, CanaryError))
    assert not outside, f"exception classes outside domain.errors.CanaryError: {outside}"
    doc = errors.__doc__ or ""
    undocumented = sorted(n for n in found if n.rsplit(".", 1)[1] not in doc)
    assert not undocumented, f"not in the tree's docstring: {undocumented}"
    assert len(found) >= 20  # the scan saw the plane-local families too


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (errors.EndpointNotFound("x"), 404),
        (errors.DuplicateName("x"), 409),
        (errors.PromotionConflict("no", reason="r"), 409),
        (errors.StorageUnavailable("down"), 503),
        (errors.InvalidEndpoint("url: too long"), 422),
        (errors.SchemaBehind("run canary db upgrade"), 503),
        (UsageError("bad flag"), 422),
        (errors.ConfigError("bad key"), 422),
        (CanaryError("something"), 500),
    ],
)
def test_admin_boundary_maps_the_tree_to_statuses(exc: CanaryError, status: int) -> None:
    mapped = map_exception(exc)
    assert isinstance(mapped, ApiError) and mapped.status == status


def test_cli_exit_codes_follow_the_tree() -> None:
    """The CLI's own errors carry their exit code: a refusal is the operator's (2), a server
    failure or no answer is 1."""
    assert AdminAPIError(422, "bad").exit_code == 2
    assert AdminAPIError(409, "conflict").exit_code == 2
    assert AdminAPIError(503, "down").exit_code == 1
    assert AdminUnreachable("refused").exit_code == 1
    assert UsageError("x").exit_code == 2 and CanaryError("x").exit_code == 1


# One row of the tree's docstring table: the class, its exit code, admin status and code.
_ROW = re.compile(r"^[\s│├└─]*(\w+)\s+exit (\d+)\s+admin (\d{3}) (\w+)", re.MULTILINE)
# A value for each constructor parameter the tree's classes take, by its annotation.
_ARGS: dict[str, object] = {
    "str": "x",
    "int": 500,  # a status (ApiError, AdminAPIError): the instance's own, the table's default
    "bool": False,
    "ReportDoc": ReportDoc("hold", b'{"verdict": "hold", "reasons": []}'),
    "type_": "internal_error",  # ApiError's code, by parameter name: the table's default
}


def _documented() -> dict[str, tuple[int, int, str]]:
    rows = _ROW.findall(errors.__doc__ or "")
    return {name: (int(code), int(status), kind) for name, code, status, kind in rows}


def _tree() -> list[type[CanaryError]]:
    classes: dict[str, type[CanaryError]] = {}
    for name in _module_names():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, CanaryError):
                classes[f"{name}.{cls.__name__}"] = cls
    classes["domain.errors.CanaryError"] = CanaryError
    return [classes[k] for k in sorted(classes)]


def _instance(cls: type[CanaryError]) -> CanaryError:
    """`cls` built from the parameters its constructor requires (keyword-only ones too)."""
    args: list[object] = []
    kwargs: dict[str, object] = {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        value = _ARGS.get(p.name, _ARGS.get(str(p.annotation)))
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    if not params or params[0].kind is p.VAR_POSITIONAL:  # Exception's own (*args)
        args = ["x"]
    return cls(*args, **kwargs)


def test_the_table_documents_the_whole_tree() -> None:
    """Every CanaryError subclass of every module has one row in domain/errors.py's table,
    and the table names no class that does not exist."""
    documented = _documented()
    names = {cls.__name__ for cls in _tree()}
    assert len(names) >= 20
    assert names == set(documented), names ^ set(documented)


@pytest.mark.parametrize("cls", _tree(), ids=lambda c: c.__name__)
def test_each_edge_maps_the_class_as_documented(
    cls: type[CanaryError], capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin API's one mapping and the CLI's one context manager answer an instance of
    each class with the exit code, HTTP status and code the table documents."""
    exit_code, status, code = _documented()[cls.__name__]
    exc = _instance(cls)
    assert (cls.exit_code, cls.http_status, cls.code) == (exit_code, status, code)
    mapped = map_exception(exc)
    assert (mapped.status, mapped.type) == (status, code)
    with cli_errors() as outcome:
        raise exc
    assert outcome.code == exit_code
    assert capsys.readouterr().err == f"canary: {exc}\n"


def test_foreign_errors_at_the_edges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stray KeyError or LookupError is a 500 at the HTTP edge, not a 404; at the CLI edge
    an OSError exits 1 naming the path."""
    for exc in (KeyError("name"), LookupError("no such thing"), ValueError("bad")):
        mapped = map_exception(exc)
        assert (mapped.status, mapped.type) == (500, "internal_error")
    missing = tmp_path / "nowhere" / "report.html"
    with cli_errors() as outcome:
        missing.write_text("x")
    assert outcome.code == 1
    err = capsys.readouterr().err
    assert err.startswith("canary: ") and str(missing) in err
