"""The incident lifecycle: the engine's upserts, an engineer's ack and resolve, queries (ORM).

Each write reads one row, changes it and writes it back in one session: the ORM's unit of work
fits that read-modify-write of JSON columns (the timeline only grows). Rows never leave the
session: every method returns an ``IncidentRecord``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from fabricd.model import (
    AffectedJob,
    Candidate,
    Evidence,
    Incident,
    IncidentKind,
    IncidentState,
    Severity,
    labels_of,
)
from fabricd.server import tables as t
from fabricd.server.store.records import Conflict, IncidentCount, IncidentRecord, NotFound
from fabricd.server.store.sql import Database


class Incidents:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = sessionmaker(db.engine, expire_on_commit=False)

    def upsert(self, inc: Incident) -> tuple[int, str]:
        """Store the engine's view of ``inc`` (keyed by ``inc.key``); returns (id, transition).

        transition: ``opened``, ``updated``, ``resolved`` or ``reopened``. An engineer's ack is kept
        while the incident stays open; the timeline only grows.
        """
        with self.db.write_lock, self.sessions.begin() as s:
            row = s.scalars(select(t.Incident).where(t.Incident.key == inc.key)).first()
            coarse = _coarse(s, inc)
            if coarse is not None and row is None:
                # Narrowed by the engine (a leaf's incident moved onto the uplink): the same incident.
                row, coarse.key = coarse, inc.key
            elif coarse is not None and coarse.state != "resolved":
                # The exact element had an earlier, resolved occurrence (keys are unique): that one
                # reopens and the coarse row is closed, pointing at it.
                _close_narrowed(coarse, inc)
            if row is None:
                row = t.Incident(
                    key=inc.key, state=inc.state.value, acked_by=None, acked_ts=None, resolved_by=None, timeline=[]
                )
                s.add(row)
                transition = "opened"
            else:
                transition = _transition(row.state, inc.state.value)
            _apply(row, inc, transition)
            s.flush()
            return row.id, transition

    def touch(self, key: str, updated_ts: float) -> bool:
        """Move ``updated_ts`` of the incident ``key`` forward, nothing else, unless it is resolved (an
        engineer's resolve stands until the engine reports a change); True if a row moved."""
        i = t.Incident
        q = (
            update(i)
            .where(i.key == key, i.state != "resolved", i.updated_ts < updated_ts)
            .values(updated_ts=updated_ts)
        )
        with self.db.write_lock, self.sessions.begin() as s:
            moved: CursorResult[Any] = s.execute(q)  # type: ignore[assignment]  # an UPDATE's result
            return bool(moved.rowcount)

    def query(
        self,
        state: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        limit: int = 100,
        job: str | None = None,
    ) -> list[IncidentRecord]:
        """Newest first; ``since``: updated since."""
        q = select(t.Incident).order_by(t.Incident.started_ts.desc(), t.Incident.id.desc()).limit(limit)
        if state is not None:
            q = q.where(t.Incident.state == state)
        if kind is not None:
            q = q.where(t.Incident.kind == kind)
        if since is not None:
            q = q.where(t.Incident.updated_ts >= since)
        if job is not None:  # JSON containment differs per database: filtered here, then limited
            with self.sessions() as s:
                rows = [_record(row) for row in s.scalars(q.limit(None))]
            return [r for r in rows if any(j.get("id") == job for j in r.affected_jobs)][:limit]
        with self.sessions() as s:
            return [_record(row) for row in s.scalars(q)]

    def unresolved(self) -> list[Incident]:
        """The incidents not resolved, as the engine keeps them: what a restarted or new correlator
        takes over (``DetectionLoop``). A row of a kind or severity this version does not know (a
        newer version wrote it, mid-rollout) is left to the version that knows it."""
        with self.sessions() as s:
            rows = s.scalars(select(t.Incident).where(t.Incident.state != "resolved"))
            known = [r for r in rows if r.kind in _KINDS and r.severity in _SEVERITIES]
            return [_incident(row) for row in known]

    def get(self, incident_id: int) -> IncidentRecord:
        with self.sessions() as s:
            return _record(_existing(s.get(t.Incident, incident_id), incident_id))

    def ack(self, incident_id: int, by: str, now: float, note: str = "") -> IncidentRecord:
        with self.db.write_lock, self.sessions.begin() as s:
            row = _existing(s.get(t.Incident, incident_id), incident_id)
            if row.state == "resolved":
                raise Conflict(f"incident {incident_id} is already resolved; nothing to acknowledge")
            if row.state != "acked":
                row.state, row.acked_by, row.acked_ts = "acked", by, now
                row.timeline = [*row.timeline, [now, _with_note("acknowledged", note), by]]
            return _record(row)

    def resolve(self, incident_id: int, by: str, now: float, note: str = "") -> IncidentRecord:
        with self.db.write_lock, self.sessions.begin() as s:
            row = _existing(s.get(t.Incident, incident_id), incident_id)
            if row.state != "resolved":
                row.state, row.resolved_by, row.resolved_ts = "resolved", by, now
                row.timeline = [*row.timeline, [now, _with_note("resolved by an engineer", note), by]]
            return _record(row)

    def open_counts(self) -> list[IncidentCount]:
        """(kind, severity, state, count) over incidents that are not resolved."""
        i = t.Incident
        q = select(i.kind, i.severity, i.state, func.count()).where(i.state != "resolved")
        with self.sessions() as s:
            rows = s.execute(q.group_by(i.kind, i.severity, i.state))
            return [IncidentCount(kind, severity, state, int(n)) for kind, severity, state, n in rows]


def _existing(row: t.Incident | None, incident_id: int) -> t.Incident:
    if row is None:
        raise NotFound(f"incident {incident_id} does not exist")
    return row


def _transition(old: str, new: str) -> str:
    if new == "resolved":
        return "updated" if old == "resolved" else "resolved"
    return "reopened" if old == "resolved" else "updated"


def _record(row: t.Incident) -> IncidentRecord:
    return IncidentRecord(
        id=row.id,
        key=row.key,
        kind=row.kind,
        severity=row.severity,
        state=row.state,
        element=row.element,
        summary=row.summary,
        started_ts=row.started_ts,
        updated_ts=row.updated_ts,
        resolved_ts=row.resolved_ts,
        acked_by=row.acked_by,
        acked_ts=row.acked_ts,
        resolved_by=row.resolved_by,
        candidates=list(row.candidates),
        affected=[str(a) for a in row.affected],
        evidence=list(row.evidence),
        timeline=[list(e) for e in row.timeline],
        affected_jobs=[dict(j) for j in row.affected_jobs or []],
        ambiguous=bool(row.ambiguous),
    )


_KINDS = frozenset(k.value for k in IncidentKind)
_SEVERITIES = frozenset(s.value for s in Severity)


def _incident(row: t.Incident) -> Incident:
    return Incident(
        key=row.key,
        kind=IncidentKind(row.kind),
        severity=Severity(row.severity),
        state=IncidentState.OPEN,  # acked is the store's: to the engine the fault is open
        element=row.element,
        summary=row.summary,
        started_ts=row.started_ts,
        updated_ts=row.updated_ts,
        candidates=[Candidate(c["element"], c["score"], c.get("weight", 0.0)) for c in row.candidates],
        affected=[str(a) for a in row.affected],
        evidence=[_evidence(e) for e in row.evidence],
        timeline=[(float(e[0]), str(e[1])) for e in row.timeline],
        affected_jobs=[
            AffectedJob(j["id"], j.get("user", ""), j.get("name", ""), tuple(j.get("nodes", ())))
            for j in row.affected_jobs or []
        ],
        ambiguous=bool(row.ambiguous),
    )


def _evidence(e: dict[str, Any]) -> Evidence:
    return Evidence(
        e["signal"],
        e["node"],
        e["device"],
        e["port"],
        e["value"],
        e["threshold"],
        e["ts"],
        labels_of(e.get("labels")),
        e.get("note", ""),
        e.get("op", ""),
        e.get("unit", ""),
    )


def _coarse(s: Session, inc: Incident) -> t.Incident | None:
    """The row ``inc`` had before the engine narrowed it, if any."""
    if not inc.narrowed_from:
        return None
    return s.scalars(select(t.Incident).where(t.Incident.key == inc.narrowed_from[-1])).first()


def _close_narrowed(row: t.Incident, inc: Incident) -> None:
    row.state, row.resolved_ts, row.resolved_by = "resolved", inc.updated_ts, "detector"
    row.updated_ts = inc.updated_ts
    row.timeline = [*row.timeline, [inc.updated_ts, f"narrowed to {inc.element}: see {inc.key}", "detector"]]


def _apply(row: t.Incident, inc: Incident, transition: str) -> None:
    row.kind, row.severity, row.element, row.summary = inc.kind.value, inc.severity.value, inc.element, inc.summary
    row.started_ts = row.started_ts if row.started_ts is not None and transition != "reopened" else inc.started_ts
    row.updated_ts = inc.updated_ts
    row.candidates = [{"element": c.element, "score": c.score, "weight": c.weight} for c in inc.candidates]
    row.ambiguous = inc.ambiguous
    row.affected = list(inc.affected)
    row.affected_jobs = [j.to_json() for j in inc.affected_jobs]
    row.evidence = [_evidence_json(e) for e in inc.evidence]
    if transition == "resolved":
        row.state, row.resolved_ts, row.resolved_by = "resolved", inc.resolved_ts or inc.updated_ts, "detector"
    elif transition in ("opened", "reopened"):
        row.state, row.resolved_ts, row.resolved_by, row.acked_by, row.acked_ts = "open", None, None, None, None
    seen = {(e[0], e[1]) for e in row.timeline}
    # How an incident began is written once, when the row opens: an engine that rebuilt its state
    # (a restart, a new correlator among replicas) re-derives the opening at a moment of its own.
    fresh = transition == "opened"
    added = [
        [ts, text, "detector"]
        for ts, text in inc.timeline
        if (ts, text) not in seen and (fresh or not text.startswith(_OPENING))
    ]
    # The engine writes its own "opened"/"reopened"/"resolved: quiet since" entries; a second one here
    # would say the incident opened twice. Only a detector that keeps no timeline gets one from here.
    if transition != "updated" and not any(str(e[1]).startswith(transition) for e in added):
        added.append([inc.updated_ts, f"{transition}: {inc.summary}", "detector"])
    if added:
        row.timeline = sorted([*row.timeline, *added], key=lambda e: e[0])


_OPENING = ("opened", "first symptom")  # the engine's entries of an incident's beginning


def _evidence_json(e: Evidence) -> dict[str, Any]:
    return {
        "signal": e.signal,
        "node": e.node,
        "device": e.device,
        "port": e.port,
        "value": e.value,
        "threshold": e.threshold,
        "ts": e.ts,
        "labels": dict(e.labels),
        "note": e.note,
        "op": e.op,
        "unit": e.unit,
    }


def _with_note(text: str, note: str) -> str:
    return f"{text}: {note}" if note else text
