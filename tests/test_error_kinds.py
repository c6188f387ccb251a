"""Error kinds are one set (domain/outcomes.py): the emitters are enumerated from the source.

The production packages are read with `ast`. A kind is emitted where an `ErrorKind.X` member is
named; a string literal spelling a kind is refused wherever the code speaks of error kinds
(`error_kind=...`, `kind = ...`, `.error(...)`, a comparison with an `error_kind`/`kind`, a
function returning `ErrorKind`) and, for the kinds no other vocabulary uses, anywhere at all.
Then every member must be emitted somewhere and have its own code in the evaluators.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from domain.endpoint import Endpoint
from domain.outcomes import ERROR_KINDS, NOT_THE_ENDPOINT, ErrorKind
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.errors import failures
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import NOT_ENDPOINT_CODES, ArmObs, Pair

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "gateway", "evaluators", "storage")
KINDS = {k.value for k in ErrorKind}
# Kinds whose words other vocabularies also use ("ok" health, the "other" route, a "timeout"
# refusal reason, the "connect" deadline phase, ...): refused only in error-kind positions.
SHARED_WORDS = {"ok", "timeout", "connect", "reset", "other"}
# Other vocabularies that happen to spell a distinctive kind: (file, word) -> why it is not one.
NOT_KINDS = {
    ("gateway/sim/profiles.py", "garbage"): "a simulator fault name",
    ("gateway/sim/faults.py", "garbage"): "a simulator fault name",
    ("gateway/server/stream/responses.py", "cancelled"): "a Responses API status",
}
# Members that are codes only: OK is code 0 (answered), never a label on a failure.
CODE_ONLY = {ErrorKind.OK}


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _literals(node: ast.AST | None) -> list[str]:
    """String constants in an expression (through tuples, sets, lists and conditionals)."""
    if node is None:
        return []
    return [v for n in ast.walk(node) if (v := _str(n)) is not None and v in KINDS]


def _names_kind(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in ("error_kind", "kind")


def _kind_positions(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, literal) for every kind literal in a position that labels an error."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "error_kind":
            found += [(node.value.lineno, v) for v in _literals(node.value)]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_names_kind(t) for t in targets):
                found += [(node.lineno, v) for v in _literals(node.value)]
        elif isinstance(node, ast.Compare) and (
            _names_kind(node.left) or any(_names_kind(c) for c in node.comparators)
        ):
            found += [(node.lineno, v) for v in _literals(node)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "error"
        ):
            found += [(node.lineno, v) for a in node.args for v in _literals(a)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.returns is not None and "ErrorKind" in ast.unparse(node.returns)
        ):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return):
                    found += [(ret.lineno, v) for v in _literals(ret.value)]
    return found


def _emitted() -> dict[ErrorKind, list[str]]:
    """Every `ErrorKind.X` named outside domain/outcomes.py, with where."""
    out: dict[ErrorKind, list[str]] = {}
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "domain/outcomes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ErrorKind"
            ):
                assert node.attr in ErrorKind.__members__, f"{rel}:{node.lineno}: {node.attr}"
                out.setdefault(ErrorKind[node.attr], []).append(f"{rel}:{node.lineno}")
    return out


def test_no_error_kind_is_a_literal() -> None:
    """No production module spells a kind as a string: it names the member."""
    bad = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "domain/outcomes.py":
            continue
        tree = ast.parse(path.read_text(), rel)
        bad += [f"{rel}:{line}: {v!r}" for line, v in _kind_positions(tree)]
        for node in ast.walk(tree):
            v = _str(node)
            if v in KINDS and v not in SHARED_WORDS and (rel, v) not in NOT_KINDS:
                bad.append(f"{rel}:{node.lineno}: {v!r}")  # type: ignore[attr-defined]
    assert not bad, "error kinds typed as literals (use domain.outcomes.ErrorKind):\n" + "\n".join(
        sorted(set(bad))
    )


def test_the_scan_sees_the_positions_it_claims() -> None:
    """The position scan catches each shape of a literal kind (so an empty result means
    something)."""
    src = (
        'Sample(error_kind="timeout")\n'
        'kind = "http_5xx" if x else "http_4xx"\n'
        'if error_kind in ("timeout", "cancelled"): pass\n'
        'metrics.error("client_disconnect")\n'
        'def f() -> ErrorKind | None:\n    return "http_other"\n'
        'route = "other"\n'
    )
    found = sorted(v for _, v in _kind_positions(ast.parse(src)))
    expected = "timeout http_5xx http_4xx timeout cancelled client_disconnect http_other"
    assert found == sorted(expected.split())


def test_every_member_is_emitted_and_every_emitted_kind_is_a_member() -> None:
    """The emitters, enumerated from the source, use members only, and each member but the
    code-only ones has an emitter (no dead kinds)."""
    emitted = _emitted()
    silent = set(ErrorKind) - CODE_ONLY - set(emitted)
    assert not silent, f"members nothing emits: {sorted(silent)}"
    # The known emitters each still name their kinds (the scan is not vacuous).
    where = {loc.split(":")[0] for locs in emitted.values() for loc in locs}
    assert {
        "gateway/server/upstream.py",
        "gateway/server/proxy.py",
        "gateway/mirror/replay/observe.py",
        "gateway/mirror/replay/lane.py",
        "gateway/capacity/replay.py",
        "evaluators/pairs/synthetic.py",
    } <= where


def test_every_member_has_its_own_code_in_the_evaluators() -> None:
    """The evaluators code each member as itself (none falls into "other"), report it by name
    in the failure detail, and leave the not-the-endpoint kinds out of the comparison."""
    assert ERROR_KINDS[0] == ErrorKind.OK and len(set(ERROR_KINDS)) == len(ErrorKind)
    failing = [k for k in ErrorKind if k is not ErrorKind.OK]
    pairs = [
        Pair(
            exchange_id=f"e{i}",
            received_at=float(i),
            production=ArmObs(status=200),
            candidate=ArmObs(status=0, error_kind=kind),
        )
        for i, kind in enumerate(failing)
    ]
    ps = pairset_from_pairs(pairs)
    assert [ERROR_KINDS[c] for c in ps.candidate.error] == failing
    assert not ps.candidate.ok.any()
    assert {ERROR_KINDS[c] for c in NOT_ENDPOINT_CODES} == NOT_THE_ENDPOINT

    c = EvalContext(
        pairs=ps,
        settings=VerdictSettings(),
        candidate=Endpoint(name="c", url="http://c"),
        live=Endpoint(name="l", url="http://l", role="live"),
        planned_look=False,
    )
    detail = failures(c)[0].detail
    counted = {k: v for k, v in detail.items() if k.startswith("candidate_") and v}
    assert counted == {f"candidate_{k}": 1 for k in failing if k not in NOT_THE_ENDPOINT}
    assert np.isin(ps.candidate.error, NOT_ENDPOINT_CODES).sum() == len(NOT_THE_ENDPOINT)
