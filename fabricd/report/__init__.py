"""Incident and fabric reports: HTML with embedded PNG plots (docs/report.md).

    source (REST or in-process) -> gather -> ReportData -> render -> Report (HTML + PNGs) -> write_report

``build_report`` runs the first three; ``fabricd report`` and ``GET /api/v1/incidents/{id}/report``
differ only in their ``Source`` (the server's is ``fabricd.server.report_source.ServiceSource``).
matplotlib is imported when a plot is drawn, never at import.
"""

from __future__ import annotations

from fabricd.progress import Step, quiet
from fabricd.report.data import ReportData, ReportQuery
from fabricd.report.gather import STEPS, gather
from fabricd.report.render import Report, render, write_report
from fabricd.report.source import RestSource, Source

__all__ = [
    "STEPS",
    "Report",
    "ReportData",
    "ReportQuery",
    "RestSource",
    "Source",
    "build_report",
    "write_report",
]


def build_report(source: Source, query: ReportQuery, now: float, step: Step = quiet) -> Report:
    """Gather and render; ``step`` is called once per section gathered and once for the drawing."""
    data = gather(source, query, now, step)
    report = render(data)
    step(note="plots")
    return report
