"""``fabricd incident ID``: one incident as a page an on-call engineer can act on.

Pure: the incident's JSON (``GET /api/v1/incidents/{id}``) in, text out. Plain aligned columns, not
boxes: the page is pasted into tickets and chat, grepped, and read in a pager. Sections, in the order
an engineer needs them: what and where, who is hit, the evidence against its thresholds, the
candidates by score with ties called ties, the timeline, and what to check next. The rows are
``fabricd.incident_view``'s and ``fabricd.next_checks``'s, the same as the HTML report's.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from fabricd import incident_view as view
from fabricd import units
from fabricd.next_checks import next_checks
from fabricd.timeparse import iso

INDENT = "  "
WIDTH = 110  # long lists (affected nodes) wrap here
LABEL_WIDTH = len("node pairs")


def render(inc: dict[str, Any]) -> str:
    sections = [head(inc), affected(inc), evidence(inc), localization(inc), timeline(inc), checks(inc)]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, the last one unpadded."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        (INDENT + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))).rstrip()
        for row in (header, *rows)
    ]


def head(inc: dict[str, Any]) -> list[str]:
    times = [f"started {iso(inc['started_ts'])}", f"updated {iso(inc['updated_ts'])}"]
    if inc.get("acked_by"):
        times.append(f"acked by {inc['acked_by']} at {iso(inc.get('acked_ts'))}")
    if inc.get("resolved_ts") is not None:
        times.append(
            f"resolved {iso(inc['resolved_ts'])}" + (f" by {inc['resolved_by']}" if inc.get("resolved_by") else "")
        )
    return [
        f"#{inc['id']} {inc['kind']} {inc['severity']} {inc['state']} at {inc['element']}",
        inc["summary"],
        " · ".join(times),
    ]


def _wrapped(label: str, items: Sequence[str], width: int) -> list[str]:
    """``label  a, b, c`` wrapped at WIDTH between items, never inside one (``node-a -> node-b``)."""
    lines = [f"{INDENT}{label.ljust(width)}  "]
    for i, item in enumerate(items):
        text = item + ("," if i < len(items) - 1 else "")
        if len(lines[-1]) + len(text) > WIDTH and lines[-1].strip() != label:
            lines[-1] = lines[-1].rstrip()
            lines.append(" " * (len(INDENT) + width + 2))
        lines[-1] += text + " "
    return [line.rstrip() for line in lines]


def affected(inc: dict[str, Any]) -> list[str]:
    hit = view.affected(inc)
    out = [f"Affected: {hit.counts()}"]
    if hit.nodes:
        out += _wrapped("nodes", hit.nodes, LABEL_WIDTH)
    if hit.pairs:
        out += _wrapped("node pairs", hit.pairs, LABEL_WIDTH)
    for job in hit.jobs or []:
        out += _wrapped("job", [job], LABEL_WIDTH)
    return out


def evidence(inc: dict[str, Any]) -> list[str]:
    rows = view.evidence_rows(inc)
    if not rows:
        return ["Evidence: none recorded"]
    title = f"Evidence ({units.count(len(rows), 'signal')}, furthest past its threshold first)"
    return [title, *columns(view.EVIDENCE_COLUMNS, rows)]


def localization(inc: dict[str, Any]) -> list[str]:
    rows = view.candidate_rows(inc)
    if not rows:
        return []
    title = "Localization (candidates by score, best first)"
    if inc.get("ambiguous"):
        title = f"Localization (ambiguous: one of these {len(rows)}, weighted by the evidence)"
    return [title, *columns(view.CANDIDATE_COLUMNS, rows), *view.tie_notes(inc)]


def timeline(inc: dict[str, Any]) -> list[str]:
    rows = [[iso(t["ts"]), t.get("by", ""), t["what"]] for t in inc.get("timeline", [])]
    return ["Timeline", *columns(["at", "by", "what"], rows)] if rows else []


def checks(inc: dict[str, Any]) -> list[str]:
    steps = next_checks(inc)
    out = ["Next checks"]
    for i, step in enumerate(steps, 1):
        prefix = f"{INDENT}{i}. "
        indent = " " * len(prefix)
        out += textwrap.wrap(step, WIDTH, initial_indent=prefix, subsequent_indent=indent, break_on_hyphens=False)
    return out
