#!/usr/bin/env python3
"""µs per text of the local token counter (`mirror.token_counter = "local:<path>"`): a short
answer, a 500-token answer and a tool call (name and arguments, counted as two pieces), one text
per call and in batches, as `gateway.mirror.replay.local_tokens.LocalTokenizer.count` runs them
on the token counter's worker thread. Prints a table; asserts nothing.

Without ``--tokenizer`` it trains a byte-level BPE tokenizer (``--vocab`` ids, Llama-style
byte-level pre-tokenizer) on the Python standard library's docstrings, so nothing is
downloaded; with ``--tokenizer`` it measures a model's own tokenizer.json. Every measured text
is distinct (the BPE's word cache sees new words as in production, where identical answers
are counted once by the counter's own cache)::

    .venv/bin/python bench/tokenizer_speed.py
    .venv/bin/python bench/tokenizer_speed.py --tokenizer /models/<model>/tokenizer.json
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.mirror.replay.local_tokens import LocalTokenizer  # noqa: E402

_MODULES = (
    "json", "asyncio", "collections", "email", "http", "argparse", "logging", "typing",
    "pathlib", "unittest", "inspect", "ast", "decimal", "datetime", "functools", "itertools",
)  # fmt: skip


def prose() -> list[str]:
    """Paragraphs of English from the standard library's docstrings."""
    out: list[str] = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        for obj in [mod, *vars(mod).values()]:
            doc = inspect.getdoc(obj)
            if doc:
                out.extend(p.replace("\n", " ") for p in doc.split("\n\n") if len(p) > 40)
    return out


def train(paragraphs: list[str], vocab: int, folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(paragraphs, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def texts(paragraphs: list[str], tokenizer: LocalTokenizer, n: int) -> dict[str, list[list[str]]]:
    """n distinct texts of each kind; a call is [name, arguments], counted as two pieces."""
    raw = tokenizer._tokenizer  # the library's object: slicing a text at token boundaries
    ids = raw.encode(" ".join(paragraphs), add_special_tokens=False).ids
    need = 500 * n
    ids = (ids * (need // max(1, len(ids)) + 1))[: need + 8 * n]
    long = [[raw.decode(ids[i * 500 : (i + 1) * 500])] for i in range(n)]
    words = " ".join(paragraphs).split()
    short = [[" ".join(words[i * 6 : i * 6 + 6]) + "."] for i in range(n)]
    calls = []
    for i in range(n):
        args = {"city": words[i % len(words)], "units": "celsius", "days": [1, 2, i % 7]}
        args["query"] = " ".join(words[i * 5 : i * 5 + 5])
        calls.append([f"get_weather_{i % 13}", json.dumps(args)])
    return {"short answer": short, "500-token answer": long, "tool call (name + arguments)": calls}


def per_text_us(
    tokenizer: LocalTokenizer, cases: list[list[str]], batch: int
) -> tuple[float, float]:
    """(CPU, wall) µs per answer, medians over rounds, `batch` answers' pieces per `count` call.
    CPU is the process's, every thread's (the library may encode a batch on several): on a
    shared host it is the cost; wall time also holds the waits for a core."""
    cpu, wall = [], []
    for _ in range(5):
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(cases), batch):
            tokenizer.count([p for case in cases[i : i + batch] for p in case])
        cpu.append((time.process_time() - c0) / len(cases) * 1e6)
        wall.append((time.perf_counter() - t0) / len(cases) * 1e6)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a model's tokenizer.json (default: train one)")
    parser.add_argument("--vocab", type=int, default=32_000, help="ids of the trained tokenizer")
    parser.add_argument("--texts", type=int, default=200, help="distinct texts of each kind")
    args = parser.parse_args()
    paragraphs = prose()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.tokenizer) if args.tokenizer else train(paragraphs, args.vocab, Path(tmp))
        tokenizer = LocalTokenizer(path)
    parallel = os.environ.get("TOKENIZERS_PARALLELISM", "unset")
    print(f"tokenizer: {args.tokenizer or f'byte-level BPE, {args.vocab:,} ids, trained here'}")
    print(f"label {tokenizer.label}; TOKENIZERS_PARALLELISM={parallel}; {os.cpu_count()} CPUs")
    print()
    one_head, batch_head = "one per call", "batches of 64"
    unit = "CPU µs per text (wall)"
    print(f"| text | tokens (mean) | {one_head}: {unit} | {batch_head}: {unit} |")
    print("|---|---:|---:|---:|")
    for name, cases in texts(paragraphs, tokenizer, args.texts).items():
        tokens = statistics.mean(sum(tokenizer.count(case)) for case in cases)
        one, batched = per_text_us(tokenizer, cases, 1), per_text_us(tokenizer, cases, 64)
        print(
            f"| {name} | {tokens:.0f} | {one[0]:,.1f} ({one[1]:,.1f}) "
            f"| {batched[0]:,.1f} ({batched[1]:,.1f}) |"
        )


if __name__ == "__main__":
    main()
