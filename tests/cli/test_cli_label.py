"""`canary label NAME` as a person runs it: a real subprocess reading one letter and Enter a
label against a real admin API on 127.0.0.1:0 over SQLite, with a labeller token from the usual
CLI setting; pairs as plain text wrapped to the terminal, labels stored as typed (undo shows the
undone pair again), and exit code 2 with a message for every refusal."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from domain.endpoint import Endpoint
from gateway.cli.commands.label import PROMPT
from gateway.control.admin.labels import LabelSettings
from storage import labels as lb
from storage import queries
from tests.cli.test_cli_candidates import REPO, canary, fits
from tests.control.test_admin_harness import admin_server
from tests.control.test_admin_labels import LABELLER, _item, _kept

NAME = "upgrade"
# A model's answer may carry a terminal escape and lines longer than any terminal.
HOSTILE = "\x1b[2J\x1b[31mFAKE VERDICT\x1b[0m " + "word " * 60


async def _session(url: str, stdin: bytes, token: str = LABELLER) -> tuple[int, str, str]:
    """`canary label NAME` with `stdin` typed in, at 80 columns."""
    env = {k: v for k, v in os.environ.items() if k != "CANARY_ADMIN_TOKEN"}
    env.update(COLUMNS="80", CANARY_ADMIN_TOKEN=f"ann:{token}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli.main", "label", NAME, "--admin-url", url,
        cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_help() -> None:
    """`canary label --help` explains the keys and the exit codes with examples, in 80 columns."""
    code, out, _ = await canary("label", "--help")
    assert code == 0 and fits(out), out
    for said in ("a (A is better)", "u (undo", "q (quit)", "CANARY_ADMIN_TOKEN", "canary label"):
        assert said in " ".join(out.split()), said


async def test_a_labelling_session(tmp_path: Path) -> None:
    """A labeller types a, b, u, t, s, q (and one typo): A, then tie for the pair whose B label
    was undone (shown again), then a skip, are stored under the token's label with the shown
    order; pairs print as plain wrapped text (an escape sequence is shown, not run) with the
    rubric and the progress, and nothing says which answer is whose."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    async with admin_server(url, labellers={LABELLER: "ann"}) as srv:
        await queries.create_endpoint(srv.engine, Endpoint(name=NAME, url="http://127.0.0.1:9/"))
        items = [_item(i, NAME) for i in range(4)]
        for i, it in enumerate(items):  # answers that do not say whose they are
            it.candidate_answer, it.reference_answer = f"first text {i}", f"second text {i}"
        items[0].candidate_answer = HOSTILE
        await _kept(srv.engine, items)
        code, out, err = await _session(srv.url, b"x\na\nb\nu\nt\ns\nq\n")
        assert code == 0, err
        labels = await lb.labels_of(srv.engine, NAME)
    assert [r.labeller for r in labels] == ["ann"] * 3
    first, tie, skip = labels
    assert first.choice == ("candidate" if first.candidate_first else "reference")  # "A"
    assert (tie.choice, skip.choice) == ("tie", "skip")
    # What each answer brought: [1] the typo, [2] after a, [3] after b, [4] after u.
    shown = out.split(PROMPT)
    assert "'x' is not an answer" in shown[1] and "Answer A:" not in shown[1]
    # The pair whose label was undone is shown again, as it was (same order).
    assert "label this pair again" in shown[4]
    assert shown[2].split("Answer A:")[1] == shown[4].split("Answer A:")[1]
    assert "3 labels stored in this session" in out
    assert "\x1b" not in out and "\\x1b[2J" in out  # the escape shown, not run
    typed = out.replace(PROMPT, PROMPT + "\n")  # a terminal echoes the Enter typed
    assert fits(typed), [line for line in typed.splitlines() if len(line) > 80]
    assert "Judge which answer serves the user better" in " ".join(out.split())  # the rubric
    assert "progress: 1 pairs labelled" in out and "yours 1" in out
    for arm in ("candidate", "reference", "'ca'", "'rc'"):
        assert arm not in out, arm


async def test_refusals_exit_2_with_a_message(tmp_path: Path) -> None:
    """An unknown candidate, a token the API refuses, a bad --admin-url and a gateway that
    keeps no text exit 2 naming the problem; undo with nothing to undo says so and goes on;
    the candidate deleted while a pair is shown exits 2 naming it, losing no stored label."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    async with admin_server(url, labellers={LABELLER: "ann"}) as srv:
        code, _, err = await _session(srv.url, b"q\n")
        assert code == 2 and f"candidate '{NAME}' does not exist" in err, err
        await queries.create_endpoint(srv.engine, Endpoint(name=NAME, url="http://127.0.0.1:9/"))
        await _kept(srv.engine, [_item(i, NAME) for i in range(3)])
        code, _, err = await _session(srv.url, b"q\n", token="tok-not-a-token-000")
        assert code == 2 and "invalid bearer token" in err, err
        code, _, err = await canary("label", NAME, "--admin-url", "ftp://x", token=LABELLER)
        assert code == 2 and "--admin-url" in err, err
        code, out, err = await _session(srv.url, b"u\n")  # end of input: as q
        assert code == 0 and "refused: nothing to undo" in out, (out, err)

        env = {k: v for k, v in os.environ.items() if k != "CANARY_ADMIN_TOKEN"}
        env.update(COLUMNS="80", CANARY_ADMIN_TOKEN=LABELLER)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli.main", "label", NAME, "--admin-url", srv.url,
            cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b"a\n")  # one label, then the candidate goes while the next is shown
        await proc.stdin.drain()
        seen = b""
        while seen.count(PROMPT.encode()) < 2:
            chunk = await proc.stdout.read(4096)
            assert chunk, (seen, await proc.stderr.read())
            seen += chunk
        await queries.delete_endpoint(srv.engine, NAME)
        proc.stdin.write(b"b\n")
        proc.stdin.close()
        await proc.wait()
        err = (await proc.stderr.read()).decode()
        assert proc.returncode == 2 and f"candidate '{NAME}' does not exist" in err, err
        assert len(await lb.labels_of(srv.engine, NAME)) == 1

    url = f"sqlite+aiosqlite:///{tmp_path / 'n.db'}"
    async with admin_server(
        url, labellers={LABELLER: "ann"}, labels=LabelSettings(store_text=False)
    ) as srv:
        await queries.create_endpoint(srv.engine, Endpoint(name=NAME, url="http://127.0.0.1:9/"))
        code, _, err = await _session(srv.url, b"q\n")
        assert code == 2 and "storage.store_text is false" in err, err


@pytest.mark.parametrize("width", [40, 200])
def test_wrapping_keeps_the_text(width: int) -> None:
    """Wrapping keeps every word and line break of an answer, in lines of at most `width`."""
    from gateway.cli.commands.label import wrapped

    text = "first line\n\n" + " ".join(f"w{i}" for i in range(200)) + "\n" + "x" * 300
    out = wrapped(text, width)
    assert all(len(line) <= width for line in out.splitlines())
    assert out.split() == text.split()[:-1] + [p for p in out.split() if p.startswith("x")]
    assert "".join(p for p in out.split() if p.startswith("x")) == "x" * 300
    assert out.splitlines()[1] == ""  # the blank line kept
