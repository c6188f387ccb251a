"""People's check of the grader as report tables (text, markdown and HTML share them): the three
estimates side by side, the labels behind them, the grader's worth in labels, the confusion
matrix with Cohen's κ and people's agreement with each other."""

from __future__ import annotations

from collections.abc import Mapping

from evaluators.human.agreement import CATEGORIES
from evaluators.human.metric import NAME
from evaluators.report.model import Report

__all__ = ["people_sections"]

Section = tuple[str, list[str], list[list[str]], str]


def _pp(v: object) -> str:
    return f"{v * 100:+.1f} pp" if isinstance(v, int | float) else "–"


def _n(v: object, spec: str = ",.0f") -> str:
    return format(v, spec) if isinstance(v, int | float) else "–"


def _row(d: Mapping[str, object], name: str, key: str, basis: str) -> list[str]:
    return [
        name,
        _pp(d.get(f"{key}_estimate")),
        f"[{_pp(d.get(f'{key}_low'))}, {_pp(d.get(f'{key}_high'))}]",
        basis,
    ]


def people_sections(report: Report) -> list[Section]:
    """The tables, whenever the candidate has labels (none otherwise)."""
    res = report.metrics.get(NAME)
    if res is None or not res.detail:
        return []
    d = res.detail
    gates = "gating" if res.role == "critical" else "not gating"
    rows = [
        _row(d, "people, prediction-powered (PPI++)", "ppi",
             f"{_n(d.get('labels'))} labels + {_n(d.get('labelled_through_units'))} graded units"),
        _row(d, "people's labels alone", "human", f"{_n(d.get('labels'))} labels"),
        _row(d, "the grader alone", "grader", f"{_n(d.get('grader_units'))} graded units"),
    ]  # fmt: skip
    out: list[Section] = [
        (
            f"What people prefer ({gates}; always-valid intervals)",
            ["estimate", "net", "interval", "from"],
            rows,
            "<>><",
        )
    ]
    worth = d.get("grader_worth_labels")
    graded = d.get("labelled_through_units")
    facts = [
        ["labels / skipped / waiting", f"{_n(d.get('labels'))} / {_n(d.get('label_skips'))} / "
         f"{_n(d.get('labels_waiting'))} (skip share {_n(d.get('label_skip_share'), '.1%')})"],
        ["labelled through", f"{_n(graded)} of {_n(d.get('graded_units'))} graded units "
         f"({_n(d.get('chosen_units'))} chosen for people at label_rate "
         f"{_n(d.get('label_rate'), '.0%')})"],
        ["the grader's worth", f"its {_n(graded)} verdicts were worth "
         f"{_n(worth)} labels here (λ = {_n(d.get('ppi_lambda'), '.2f')})"],
        ["grader vs people", f"Cohen's κ {_n(d.get('kappa'), '.2f')}, agreement "
         f"{_n(d.get('agreement_share'), '.1%')}, n={_n(d.get('agreement_n'))} pairs"],
        ["people vs people", f"Cohen's κ {_n(d.get('people_kappa'), '.2f')}, agreement "
         f"{_n(d.get('people_agreement_share'), '.1%')}, n={_n(d.get('people_n'))} "
         "double-labelled pairs"],
    ]  # fmt: skip
    if res.ungated:
        facts.append(["not gating", res.ungated])
    out.append(("People's labels", ["", "value"], facts, "<<"))
    matrix = [
        [f"grader: {g}"] + [_n(d.get(f"confusion_grader_{g}_people_{p}")) for p in CATEGORIES]
        for g in CATEGORIES
    ]
    header = ["pairs"] + [f"people: {p}" for p in CATEGORIES]
    out.append(("Grader vs people (confusion matrix with ties)", header, matrix, "<>>>"))
    return out
