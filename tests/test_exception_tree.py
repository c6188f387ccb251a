"""One exception tree (domain/errors.py): every exception class our packages declare descends
from `CanaryError`, and each boundary maps the tree in its own convention."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from domain import errors
from domain.errors import CanaryError, UsageError
from gateway.cli.client import AdminAPIError, AdminUnreachable
from gateway.control.admin.boundary import ApiError, map_exception

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
