"""Render a report in one of its formats; the only module that knows every renderer."""

from __future__ import annotations

from domain.errors import UsageError
from evaluators.report.html import render_html
from evaluators.report.model import FORMATS, Format, Report, report_to_json
from evaluators.report.text import render_markdown, render_text


def render(report: Report, fmt: Format) -> str:
    """The report as text (80 columns), markdown, JSON or one self-contained HTML page."""
    if fmt == "json":
        return report_to_json(report).decode()
    if fmt == "html":
        return render_html(report)
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise UsageError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
