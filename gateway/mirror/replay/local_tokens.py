"""The local tokenizer: the model's own `tokenizer.json`, read by the `tokenizers` library in the
mirror process, counting a batch of texts in one call (`mirror.token_counter = "local:<path>"`).

It is the tokenizer vLLM itself loads from the model folder, so it counts what a candidate's
`/tokenize` would, without asking any engine: no request loads an arm under test, and no count
waits on one. Its label (`local:<first 16 hex of the file's sha256>`) names the file's content,
not its path, so two arms compare on tokens only when one tokenizer counted both.

Pure: no asyncio. `count` runs in the token counter's one worker thread (`encode_batch_fast`
releases the GIL while Rust encodes), never on the event loop. It never adds special tokens
(BOS): an answer's tokens are its text's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from domain.errors import ConfigError
from gateway.config.tokenizer import LOCAL_PREFIX, tokenizer_json

__all__ = ["LocalTokenizer"]

_LABEL_HEX: Final = 16  # 64 bits of the sha256: two different files never share a label


class LocalTokenizer:
    """One tokenizer.json, loaded once; `count(texts)` -> each text's token count."""

    __slots__ = ("_tokenizer", "label", "path")

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # only a local counter needs the library

        data = path.read_bytes()
        self.path = path
        self.label = LOCAL_PREFIX + hashlib.sha256(data).hexdigest()[:_LABEL_HEX]
        self._tokenizer: Any = Tokenizer.from_str(data.decode("utf-8"))

    @classmethod
    def from_setting(cls, token_counter: str) -> LocalTokenizer | None:
        """The tokenizer a `local:` setting names; None for the /tokenize settings. The setting
        was checked when the config loaded; a file gone since raises ConfigError."""
        path = tokenizer_json(token_counter)
        if path is None:
            return None
        try:
            return cls(path)
        except Exception as exc:  # OSError, UnicodeDecodeError, or the library's plain Exception
            reason = f"cannot load {str(path)!r}: {exc}"
            raise ConfigError(f"key 'mirror.token_counter': {reason}") from exc

    def count(self, texts: Sequence[str]) -> list[int]:
        """Each text's token count, without special tokens, in one batch."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]
