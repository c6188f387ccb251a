"""The simulator as an LLM grader: a pairwise request (a `json_schema` response_format named
`pairwise_verdict`, the shape gateway.mirror.grading.request sends) is answered with a verdict
JSON object, as vLLM's structured outputs would force.

The simulated grader reads the two answers between the `[Answer A]` / `[Answer B]` markers and
tells their styles apart by their words (a model upgrade's `NEW_WORDS` against the baseline's).
Its taste is planted by the profile, per verdict, from a hash of the whole prompt (so a pair
shown in the other order is an independent draw): with probability `grader_first` it picks the
answer shown first; otherwise it ties with probability `grader_tie`; otherwise, when exactly one
answer is in the new style, it prefers that one with probability `grader_prefers_new` (two
answers of one style: either, half each). Pure: no IO.
"""

from __future__ import annotations

import json
import re
from typing import Final

from gateway.sim.engine import NEW_WORDS, _unit, text_hash
from gateway.sim.profiles import SimProfile

__all__ = ["VERDICT_SCHEMA", "is_new_style", "verdict_text"]

# The json_schema name of a pairwise grading request (gateway.mirror.grading.request).
VERDICT_SCHEMA: Final = "pairwise_verdict"
_S_FIRST, _S_TIE, _S_WIN = 101, 102, 103
_NEW: Final = frozenset(NEW_WORDS)
_WORD = re.compile(r"[a-z]+")
_ANSWER = re.compile(r"\[Answer ([AB])\]\n(.*?)(?=\n\n\[Answer [AB]\]|\n\nReply|\Z)", re.S)


def is_new_style(text: str) -> bool:
    """Whether most of an answer's words are the upgrade's."""
    words = _WORD.findall(text.lower())
    return bool(words) and sum(w in _NEW for w in words) * 2 > len(words)


def verdict_text(profile: SimProfile, prompt: str) -> str:
    """The grader's answer to a pairwise prompt: `{"winner": "A" | "B" | "tie"}`."""
    h = text_hash(prompt)
    answers = dict(_ANSWER.findall(prompt))
    if _unit(h, _S_FIRST) < profile.grader_first:
        winner = "A"
    elif _unit(h, _S_TIE) < profile.grader_tie:
        winner = "tie"
    else:
        a_new = is_new_style(answers.get("A", ""))
        b_new = is_new_style(answers.get("B", ""))
        u = _unit(h, _S_WIN)
        if a_new != b_new:
            new, old = ("A", "B") if a_new else ("B", "A")
            winner = new if u < profile.grader_prefers_new else old
        else:
            winner = "A" if u < 0.5 else "B"
    return json.dumps({"winner": winner})
