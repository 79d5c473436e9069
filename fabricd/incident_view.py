"""What an incident says, in the words every view shows it: the CLI page and the HTML report alike.

Pure: an incident's JSON (``GET /api/v1/incidents/{id}``) in, rows of text out. Evidence in its
signal's unit against its rule's threshold (units from ``fabricd/signal_table.py``, one formatting in
``fabricd/units.py``), furthest past its threshold first; candidates by score with equal scores ranked
alike and called a tie, each with its weight (its share of the evidence); an ambiguous incident
(the evidence cannot tell its candidates apart, docs/detection.md) said to be one; the affected
list split into nodes, node pairs and jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabricd import signal_table as table
from fabricd import units
from fabricd.next_checks import and_join
from fabricd.timeparse import iso

SCORE_DIGITS = 3  # scores are shown, and compared for ties, at this precision
_PINGMESH = table.SOURCE_INPUTS[table.PINGMESH]
# Pair signals: computed from pingmesh inputs only, their device is the probed peer.
PAIR_SIGNALS = frozenset(s.name for s in table.SIGNALS if all(n in _PINGMESH for slot in s.inputs for n in slot))
EVIDENCE_COLUMNS = ["signal", "where", "value", "threshold", "at"]


@dataclass(frozen=True)
class Affected:
    nodes: list[str]
    pairs: list[str]  # "src -> dst"
    jobs: list[str] | None  # None: the API names no jobs (not "no job was hit")

    def counts(self) -> str:
        parts = [units.count(len(self.nodes), "node"), units.count(len(self.pairs), "node pair")]
        if self.jobs:  # none hit, or a central without the jobs join: nothing to say
            parts.append(units.count(len(self.jobs), "job"))
        return ", ".join(parts)


def _job(job: dict[str, Any]) -> str:
    who = ", ".join(str(job[k]) for k in ("user", "name") if job.get(k))
    nodes = ", ".join(str(n) for n in job.get("nodes", []))
    return f"{job.get('id', '?')}" + (f" ({who})" if who else "") + (f": {nodes}" if nodes else "")


def affected(inc: dict[str, Any]) -> Affected:
    entries = inc.get("affected", [])
    jobs = inc.get("affected_jobs")
    return Affected(
        [a for a in entries if "|" not in a],
        [a.replace("|", " -> ", 1) for a in entries if "|" in a],
        None if jobs is None else [_job(j) for j in jobs],
    )


def unit_of(e: dict[str, Any]) -> str:
    if e.get("unit"):
        return str(e["unit"])
    signal = table.BY_NAME.get(e["signal"])  # evidence stored before it carried its unit
    return signal.unit if signal is not None else ""


def where(e: dict[str, Any]) -> str:
    if e["signal"] in PAIR_SIGNALS:
        return f"{e['node']} -> {e['device']}"
    place = "/".join(p for p in (e["node"], e["device"], e["port"]) if p)
    extra = " ".join(f"{k}={v}" for k, v in sorted(e.get("labels", {}).items()))
    return f"{place} {extra}" if extra else place


def _over(e: dict[str, Any]) -> float:
    """How far past its threshold (the factor, whichever way the rule compares)."""
    value, threshold = abs(float(e["value"])), abs(float(e["threshold"]))
    if str(e.get("op", ">")).startswith("<"):
        return threshold / value if value > 0 else float("inf")
    return value / threshold if threshold > 0 else float("inf")


def evidence_rows(inc: dict[str, Any]) -> list[list[str]]:
    """``EVIDENCE_COLUMNS`` per evidence entry, furthest past its threshold first."""
    rows = []
    for e in sorted(inc.get("evidence", []), key=_over, reverse=True):
        unit = unit_of(e)
        threshold = units.quantity(e["threshold"], unit)
        op = e.get("op")
        rows.append(
            [
                e["signal"],
                where(e),
                units.quantity(e["value"], unit),
                f"{op} {threshold}" if op else threshold,
                iso(e["ts"]),
            ]
        )
    return rows


def score_text(score: float) -> str:
    return f"{score:.{SCORE_DIGITS}f}"


CANDIDATE_COLUMNS = ["rank", "element", "score", "weight", ""]


def weight_text(c: dict[str, Any]) -> str:
    return score_text(float(c["weight"])) if "weight" in c else ""  # stored before candidates had one


def candidate_groups(inc: dict[str, Any]) -> list[tuple[int, str, list[str]]]:
    """(rank, score, elements) from the best score down; more than one element is a tie."""
    cands = sorted(inc.get("candidates", []), key=lambda c: (-round(float(c["score"]), SCORE_DIGITS), c["element"]))
    groups: dict[str, list[str]] = {}
    for c in cands:
        groups.setdefault(score_text(c["score"]), []).append(c["element"])
    out, rank = [], 1
    for score, elements in groups.items():
        out.append((rank, score, elements))
        rank += len(elements)
    return out


def candidate_rows(inc: dict[str, Any]) -> list[list[str]]:
    """``CANDIDATE_COLUMNS``: rank ("2=" for a tie), element, score, weight, "tie" or ""."""
    weights = {c["element"]: weight_text(c) for c in inc.get("candidates", [])}
    return [
        [f"{rank}=" if len(els) > 1 else str(rank), e, score, weights[e], "tie" if len(els) > 1 else ""]
        for rank, score, els in candidate_groups(inc)
        for e in els
    ]


def ambiguity_note(inc: dict[str, Any]) -> str:
    """What an ambiguous incident's page says instead of naming one element ("" when it is not)."""
    if not inc.get("ambiguous"):
        return ""
    names = [c["element"] for c in inc.get("candidates", [])]
    hangs = f" ({inc['element']} is where they meet)" if inc.get("element") not in names else ""
    return (
        f"Ambiguous: the evidence cannot tell {and_join(names)} apart; the fault is on one of them{hangs}. "
        "Trace paths or run a pinned probe to narrow it down."
    )


def tie_notes(inc: dict[str, Any]) -> list[str]:
    """Ties called ties; an ambiguous incident's note first, which says it of the candidates."""
    if inc.get("ambiguous"):
        return [ambiguity_note(inc)]
    notes = []
    for rank, score, elements in candidate_groups(inc):
        if len(elements) > 1:
            top = rank == 1
            notes.append(
                f"Tie {'at the top: ' if top else ''}{and_join(elements)} score {score} each: the evidence does "
                f"not tell them apart{', check each.' if top else '.'}"
            )
    return notes
