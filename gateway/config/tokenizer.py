"""The local tokenizer setting (`mirror.token_counter = "local:<path>"`): where its
`tokenizer.json` is, and whether it is one, checked once when the settings load.

A path names the model's `tokenizer.json` or a model folder holding one (how vLLM deployments
ship model files). The check opens the file with the `tokenizers` library, so a missing, unreadable
or malformed file stops the start with the key named instead of leaving every answer uncounted.
Never imports a plane; the mirror process opens the file again (gateway.mirror.replay.local_tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from domain.errors import ConfigError

__all__ = ["LOCAL_PREFIX", "check_token_counter", "tokenizer_json"]

# `token_counter` values of this form count locally; the rest name a /tokenize (auto, off, a name).
LOCAL_PREFIX: Final = "local:"
TOKENIZER_FILE: Final = "tokenizer.json"


def tokenizer_json(token_counter: str) -> Path | None:
    """The tokenizer.json a `local:` setting names (a folder: its tokenizer.json); None when the
    setting is not local. Raises ConfigError (no key named: the caller names it) when there is
    no such file."""
    if not token_counter.startswith(LOCAL_PREFIX):
        return None
    raw = token_counter.removeprefix(LOCAL_PREFIX)
    if not raw:
        raise ConfigError('"local:" needs a path: local:/models/<model>/tokenizer.json')
    path = Path(raw).expanduser()
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise ConfigError(f"no tokenizer file at {str(path)!r} (a tokenizer.json or its folder)")
    return path


def check_token_counter(token_counter: str, source: str) -> None:
    """Raise ConfigError naming `mirror.token_counter` when a local tokenizer cannot be loaded."""
    try:
        path = tokenizer_json(token_counter)
    except ConfigError as exc:
        raise ConfigError(f"{source}: key 'mirror.token_counter': {exc}") from exc
    if path is None:
        return
    try:
        from tokenizers import Tokenizer  # only a local tokenizer needs the library

        Tokenizer.from_file(str(path))
    except ImportError as exc:
        raise ConfigError(
            f"{source}: key 'mirror.token_counter': the tokenizers package is not installed "
            "(pip install tokenizers)"
        ) from exc
    except Exception as exc:  # the library raises a plain Exception for a file it cannot read
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{source}: key 'mirror.token_counter': {str(path)!r} is not a tokenizer.json the "
            f"tokenizers library can load: {reason}"
        ) from exc
