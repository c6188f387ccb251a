"""People's estimate, fast: agreement statistics, the labelled-through point, the min_labels
hold, the evaluator path against the world's own aggregation, the report's tables, and the
fixed-n estimate and λ against `ppi_py`."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import ppi_py
import pytest
from ppi_py import ppi as ppi_internals

from domain.endpoint import CandidateSpec, Endpoint, GraderSpec
from domain.errors import InvalidSettings
from domain.records import LabelRecord
from evaluators.human.agreement import cohen_kappa, confusion
from evaluators.human.data import HumanLabels
from evaluators.human.estimate import fixed_ppi
from evaluators.human.metric import NAME, human_preference, source, unit_table
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import preference
from evaluators.pairs.gradings import Gradings
from evaluators.pairs.types import PairSet
from evaluators.report.build import build_report
from evaluators.report.html import render_html
from evaluators.report.text import render_text
from tests.evaluators.human_world import World

RATE = 0.2


def _candidate(rate: float = RATE) -> Endpoint:
    return CandidateSpec(
        name="upgrade",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:10", model="judge", label_rate=rate),
    ).to_endpoint()


def _stored(world: World, sessions: int, seed: int, drop: set[str] | None = None):  # type: ignore[no-untyped-def]
    rows, kept, labels, agg = world.one(sessions, seed)
    g = Gradings.from_rows(rows)
    ids = list(dict.fromkeys(r[0] for r in rows))
    records = [
        LabelRecord(exchange_id=e, endpoint="upgrade", labeller=who, labelled_at=at,
                    candidate_first=True, choice=choice)  # type: ignore[arg-type]
        for e, who, at, choice in labels
        if not drop or e not in drop
    ]  # fmt: skip
    return g, HumanLabels.from_rows(world.rate, ids, kept, records), agg, kept


def test_kappa_of_a_textbook_table() -> None:
    """The 2x2 example (20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no) has κ = 0.4 and 70 %
    agreement; an empty tie row and column change nothing."""
    a = np.array([1.0] * 25 + [-1.0] * 25)
    b = np.array([1.0] * 20 + [-1.0] * 5 + [1.0] * 10 + [-1.0] * 15)
    m = confusion(a, b)
    assert m.tolist() == [[20, 0, 5], [0, 0, 0], [10, 0, 15]]
    kappa, po, n = cohen_kappa(m)
    assert kappa == pytest.approx(0.4) and po == pytest.approx(0.7) and n == 50
    assert math.isnan(cohen_kappa(np.zeros((3, 3), dtype=np.int64))[0])
    # a half-point score (graded both ways, split) is a tie; NaN (unlabelled) drops out
    m = confusion(np.array([0.5, -0.5, 0.0, 1.0]), np.array([1.0, 0.0, 0.0, np.nan]))
    assert m.sum() == 3 and m[0, 0] == 1 and m[2, 1] == 1 and m[1, 1] == 1


def test_fixed_estimate_and_lambda_match_ppi_py() -> None:
    rng = np.random.default_rng(3)
    f_all = rng.choice([-1.0, 0.0, 1.0], 5000, p=[0.3, 0.2, 0.5])
    lab = rng.random(5000) < 0.1
    y = np.where(rng.random(5000) < 0.7, f_all, rng.choice([-1.0, 0.0, 1.0], 5000))[lab]
    est, lam = fixed_ppi(y, f_all[lab], f_all)
    assert est == pytest.approx(float(ppi_py.ppi_mean_pointestimate(y, f_all[lab], f_all)[0]))
    theirs = ppi_internals._calc_lam_glm(
        y - est, f_all[lab] - est, f_all - est, np.eye(1), clip=True
    )
    assert 0.3 < lam < 1.0 and lam == pytest.approx(float(theirs))
    fixed = ppi_py.ppi_mean_pointestimate(y, f_all[lab], f_all, lam=0.5)
    assert float(np.mean(0.5 * f_all) + np.mean(y - 0.5 * f_all[lab])) == pytest.approx(
        float(np.squeeze(fixed))
    )


def test_evaluator_units_match_the_worlds_own() -> None:
    """Built from stored rows (gradings, kept pairs, labels), the evaluator's units are the
    world's sessions with the same grader and people's scores."""
    world = World(people=-0.1, grader=0.1, copy=0.5, rate=RATE, skip=0.05)
    g, hl, agg, _ = _stored(world, 400, seed=11)
    t = unit_table(g, hl, VerdictSettings(), by_session=True, as_of=math.inf)
    assert t.through == 400 and t.waiting == 0
    np.testing.assert_allclose(t.f, agg.f)
    np.testing.assert_array_equal(t.chosen, agg.chosen)
    c = agg.chosen
    np.testing.assert_allclose(t.y_low[c], agg.y_low[c])
    np.testing.assert_allclose(t.y_high[c], agg.y_high[c])
    np.testing.assert_array_equal(t.fit, agg.fit)
    assert t.labels == int(agg.labels.sum()) and t.skips == int(agg.skips.sum()) > 0


def test_labelled_through_stops_at_the_first_waiting_unit() -> None:
    """A chosen session with a pair nobody labelled yet ends the look there: later sessions,
    labelled or not, wait, so lag cannot choose which labels count."""
    world = World(people=0.0, grader=0.0, copy=0.6, rate=RATE, skip=0.0)
    _, _, agg, kept = _stored(world, 300, seed=12)
    third = int(np.flatnonzero(agg.chosen)[2])
    # the exchange ids of that session's pairs: the world numbers pairs in session order
    first_pair = int(agg.pairs[:third].sum())
    waiting = {f"x{i:08d}" for i in range(first_pair, first_pair + int(agg.pairs[third]))}
    assert waiting <= set(kept)
    g, hl, agg, _ = _stored(world, 300, seed=12, drop=waiting)
    t = unit_table(g, hl, VerdictSettings(), by_session=True, as_of=math.inf)
    assert t.through == third
    assert t.waiting == len(waiting)
    assert t.labels == int(agg.labels[:third].sum())


def test_min_labels_holds_and_source_decides_what_gates() -> None:
    world = World(people=-0.3, grader=0.1, copy=0.4, rate=RATE)
    g, hl, _, _ = _stored(world, 1500, seed=13)
    human = VerdictSettings().with_overrides({"preference_source": "human", "min_labels": 5000})
    ctx = EvalContext(pairs=PairSet.empty(0), settings=human, candidate=_candidate(),
                      gradings=g, labels=hl)  # fmt: skip
    (res,) = human_preference(ctx)
    assert res.role == "critical" and res.status == "ungated" and res.ungated_blocks
    assert "min_labels 5,000" in res.ungated and res.n > 100
    grader_pref = preference.preference(ctx)
    source(grader_pref, ctx)
    assert grader_pref[0].status == "ungated" and not grader_pref[0].ungated_blocks
    ctx = EvalContext(pairs=PairSet.empty(0), settings=human.with_overrides({"min_labels": 50}),
                      candidate=_candidate(), gradings=g, labels=hl)  # fmt: skip
    (res,) = human_preference(ctx)
    assert res.status == "undecided" and res.p_critical is not None and res.beyond_counts
    assert res.ci_high is not None and res.ci_high < 0.0  # people's -30 pp shows through
    # by default people's estimate is shown, never gating; without labels nothing is added
    ctx = EvalContext(pairs=PairSet.empty(0), settings=VerdictSettings(),
                      candidate=_candidate(), gradings=g, labels=hl)  # fmt: skip
    (res,) = human_preference(ctx)
    assert res.role == "diagnostic" and res.status == "info" and not res.gating
    ctx = EvalContext(pairs=PairSet.empty(0), settings=VerdictSettings(),
                      candidate=_candidate(), gradings=g)  # fmt: skip
    assert human_preference(ctx) == []
    ctx = EvalContext(pairs=PairSet.empty(0), settings=human, candidate=_candidate(), gradings=g)
    (res,) = human_preference(ctx)
    assert res.status == "ungated" and res.ungated_blocks and "no pair labelled" in res.ungated


def test_too_many_skips_stop_people_from_gating() -> None:
    world = World(people=0.0, grader=0.0, copy=0.6, rate=RATE, skip=0.3)
    g, hl, _, _ = _stored(world, 800, seed=14)
    s = VerdictSettings().with_overrides({"preference_source": "human", "min_labels": 10})
    ctx = EvalContext(pairs=PairSet.empty(0), settings=s, candidate=_candidate(), gradings=g,
                      labels=hl)  # fmt: skip
    (res,) = human_preference(ctx)
    assert res.status == "ungated" and res.ungated_blocks and "label_skip_max" in res.ungated


def test_report_shows_the_three_estimates_and_agreement() -> None:
    world = World(people=-0.1, grader=0.1, copy=0.5, rate=RATE)
    g, hl, _, _ = _stored(world, 600, seed=15)
    report = build_report(
        PairSet.empty(0), candidate=_candidate(), live=None, control=None, accounting={},
        settings=VerdictSettings(), gradings=g, labels=hl,
    )  # fmt: skip
    d = report.metrics[NAME].detail
    for key in ("ppi_low", "human_low", "grader_low", "kappa", "grader_worth_labels",
                "confusion_grader_tie_people_candidate", "labels", "label_skips"):  # fmt: skip
        assert d.get(key) is not None, key
    assert d["ppi_low"] < d["ppi_high"]  # type: ignore[operator]
    text = render_text(report)
    assert "people, prediction-powered (PPI++)" in text and "Cohen's κ" in text
    assert "verdicts were worth" in text
    assert "Grader vs people" in render_html(report)
    as_json = msgspec.json.decode(msgspec.json.encode(report))
    assert as_json["metrics"][NAME]["detail"]["kappa"] == d["kappa"]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"preference_source": "people"}, "preference_source must be one of grader, human"),
        ({"preference_source": 1}, "'preference_source' must be a string"),
        ({"min_labels": 0}, "min_labels must be in [1, 1000000]"),
        ({"min_labels": 2.5}, "'min_labels' must be a whole number"),
        ({"label_skip_max": 1.0}, "label_skip_max must be in [0, 1)"),
        ({"alpha": "0.05"}, "'alpha' must be a number"),
    ],
)
def test_bad_settings_name_the_setting(overrides: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidSettings) as exc:
        VerdictSettings().with_overrides(overrides)  # type: ignore[arg-type]
    assert words in str(exc.value)
