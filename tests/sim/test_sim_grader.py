"""The simulator as an LLM grader and as a model upgrade: the upgrade's every answer differs
from the baseline's, a pairwise json_schema request gets exactly the verdict object, and over
many prompts the planted net preference and position bias come out."""

from __future__ import annotations

import json

import aiohttp

from domain.endpoint import GraderSpec
from gateway.mirror.grading import request as rq
from gateway.sim.engine import answer_pieces
from gateway.sim.grader import is_new_style, verdict_text
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim

SPEC = GraderSpec(url="http://127.0.0.1:9", model="sim-model")


def _pair(i: int) -> tuple[str, str]:
    new = "".join(answer_pieces(get_profile("upgrade"), i, None))
    old = "".join(answer_pieces(get_profile("baseline"), i, None))
    return new, old


def test_upgrade_answers_all_differ_and_are_told_apart() -> None:
    """300 prompts: the upgrade never answers the baseline's text, and the grader's style test
    calls every upgrade answer new and every baseline answer not."""
    pairs = [_pair(i) for i in range(300)]
    assert all(new != old for new, old in pairs)
    assert all(is_new_style(new) and not is_new_style(old) for new, old in pairs)


def test_planted_net_preference_and_position_bias() -> None:
    """Over 4,000 graded pairs shown in a random order, a grader with b = 0.25, t = 0.2 and
    p = 0.35 gives the upgrade a net of (1 - b)(1 - t)(2p - 1) = -18 pp within 3 SE, and the
    first-shown answer wins b / (2 (b + (1 - b)(1 - t))) = 14.7 pp over half of the decisive
    verdicts, within 3 pp."""
    grader = get_profile("grader", grader_prefers_new=0.35)
    net, decisive, first_won = 0, 0, 0
    n = 4_000
    for i in range(n):
        new, old = _pair(i)
        first = rq.candidate_first(f"x{i}")
        body = json.loads(
            rq.grader_body(SPEC, f"user: q{i}", new, old, candidate_shown_first=first)
        )
        label = json.loads(verdict_text(grader, body["messages"][0]["content"]))["winner"]
        winner = rq.winner_of(label, first)
        net += {"candidate": 1, "reference": -1, "tie": 0}[winner]
        if label != "tie":
            decisive += 1
            first_won += label == "A"
    # 3 standard errors (0.88 / sqrt(4,000) = 0.014 each): the draws hash the whole prompt, so
    # any change of the rubric's words redraws them.
    assert abs(net / n - (-0.18)) <= 0.042
    assert abs(first_won / decisive - 0.5 - 0.25 / (2 * (0.25 + 0.75 * 0.8))) <= 0.03


async def test_grader_endpoint_answers_a_json_schema_request() -> None:
    """Over HTTP, the grader profile answers the request the mirror sends with exactly one
    verdict object as the message content, and reports its tokens."""
    server = await start_sim(get_profile("grader", time_scale=0.01))
    try:
        new, old = _pair(1)
        body = rq.grader_body(SPEC, "user: hello", new, old, candidate_shown_first=True)
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{server.url}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp,
        ):
            assert resp.status == 200
            raw = await resp.read()
    finally:
        await server.close()
    parsed = rq.parse_answer(raw)
    assert parsed.label in ("A", "B", "tie")
    assert parsed.prompt_tokens > 100 and parsed.completion_tokens > 0
