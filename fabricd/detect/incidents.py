"""Incident lifecycle in event time: open, update, resolve after a quiet period, reopen, flap damping.

One incident per root cause: proposals from the detectors are keyed ``kind:element`` and merged
into the incident with that key, whatever the number of symptoms behind them.

* **open**: a proposal whose key has no incident (or only one resolved longer ago than the reopen
  window, which starts a new occurrence);
* **update**: new evidence (a signal or place not seen before), more affected nodes or pairs, or a
  severity change; a proposal that only repeats what is known is not a change (``apply`` does not
  return it) but moves ``updated_ts``, the last time the fault was confirmed, which the server's
  detection loop writes back now and then (``fabricd.server.detection``);
* **resolve**: no proposal for ``quiet`` seconds of event time;
* **reopen**: a proposal within ``reopen_window`` of the resolution reopens the same incident;
* **flap damping**: an incident reopened ``flap_count`` times within ``flap_window`` is flapping: it
  is held open for ``flap_hold`` after its last proposal instead of resolving and reopening again,
  so an engineer sees one flapping incident, not a stream of open/resolve notifications;
* **narrow**: an incident placed on a coarse element because the evidence could not tell its parts
  apart (a leaf "or one of its uplinks": ``Proposal.narrows_to``) is moved, as the same incident,
  onto one of those parts when a proposal of the same kind names it, and a later coarse proposal
  while the narrowed incident is open confirms that incident instead of opening a second one. Live,
  the marks of a congested uplink can reach the central a scrape before the slow pairs that say which
  uplink (a loaded agent scrapes late): one fault, one incident, first coarse, then exact.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fabricd.detect.rules import Lifecycle
from fabricd.model import Candidate, Evidence, Incident, IncidentKind, IncidentState, Severity

MAX_EVIDENCE = 32
MAX_AFFECTED = 512
_SEVERITY_ORDER = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(slots=True)
class Proposal:
    """What a detector concluded at one evaluation: one root cause and its symptoms."""

    kind: IncidentKind
    element: str
    candidates: list[Candidate]
    affected: list[str]
    evidence: list[Evidence]
    severity: Severity
    started_ts: float
    summary: str
    # The parts of ``element`` this root cause may be on, when the evidence cannot tell them apart
    # (e.g. the uplinks of the blamed leaf): a later proposal on one of them narrows this incident.
    narrows_to: tuple[str, ...] = ()
    ambiguous: bool = False  # localization could not tell the candidates apart

    @property
    def key(self) -> str:
        return f"{self.kind.value}:{self.element}"


@dataclass(slots=True)
class _Entry:
    incident: Incident
    last_active: float
    reopens: deque[float] = field(default_factory=deque)
    flapping: bool = False
    narrows_to: frozenset[str] = frozenset()


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S UTC")


def _part_of(part: str, element: str) -> bool:
    """Whether ``part`` is a link with ``element`` (a switch) at one end: what an ambiguous incident
    on a switch may be narrowed onto (``Proposal.narrows_to``: its uplinks, not the other leaves
    among its candidates)."""
    return part != element and element in part.split("~")


def max_severity(severities: list[Severity]) -> Severity:
    return max(severities, key=_SEVERITY_ORDER.__getitem__, default=Severity.WARNING)


class IncidentBook:
    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lc = lifecycle
        self._entries: dict[str, _Entry] = {}

    def apply(self, proposals: list[Proposal], now: float) -> list[Incident]:
        """Merge this evaluation's proposals; returns the incidents whose state changed."""
        changed: dict[str, Incident] = {}
        for p in proposals:
            inc = self._merge(p, now)
            if inc is not None:
                changed[inc.key] = inc
        return list(changed.values())

    def touch(self, keys: Iterable[str], now: float) -> None:
        """Open incidents whose own symptoms showed at ``now`` without a proposal of theirs (the
        receivers' marks of an open fabric queue, ``EvalContext.active``) are not quiet."""
        for key in keys:
            e = self._entries.get(key)
            if e is not None and e.incident.state is not IncidentState.RESOLVED:
                e.last_active = max(e.last_active, now)

    def resolve_quiet(self, now: float) -> list[Incident]:
        out = []
        for e in self._entries.values():
            inc = e.incident
            hold = self.lc.flap_hold_seconds if e.flapping else self.lc.quiet_seconds
            if inc.state is not IncidentState.RESOLVED and now - e.last_active > hold:
                inc.state = IncidentState.RESOLVED
                inc.resolved_ts = e.last_active
                inc.updated_ts = now
                inc.timeline.append((now, f"resolved: quiet since {_utc(e.last_active)}"))
                out.append(inc)
        return out

    def open(self) -> list[Incident]:
        return [e.incident for e in self._entries.values() if e.incident.state is not IncidentState.RESOLVED]

    def adopt(self, incidents: Iterable[Incident]) -> list[Incident]:
        """Take over incidents another engine opened and stored (a restart, a new correlator): from
        here on they are this book's, confirmed, narrowed or resolved as if it had opened them, and
        they shape the detectors' proposals as open incidents do. A rebuilt engine re-derives only
        the last minutes: without this, an incident opened before them would stay open in the store
        forever, and the rebuilt engine could place the same fault elsewhere beside it. Incidents
        not keyed as proposals are (``kind:element``: a rank straggler's) are not the book's;
        returns those adopted (the same objects: the book changes them in place)."""
        out = []
        for inc in incidents:
            if inc.key != f"{inc.kind.value}:{inc.element}" or inc.key in self._entries:
                continue
            if inc.state is IncidentState.RESOLVED:
                continue
            parts = frozenset(c.element for c in inc.candidates if _part_of(c.element, inc.element))
            self._entries[inc.key] = _Entry(inc, inc.updated_ts, narrows_to=parts if inc.ambiguous else frozenset())
            out.append(inc)
        return out

    def all(self) -> list[Incident]:
        return [e.incident for e in self._entries.values()]

    # --- merging -------------------------------------------------------------------------------

    def _merge(self, p: Proposal, now: float) -> Incident | None:
        e = self._entries.get(p.key)
        if e is None or (e.incident.state is IncidentState.RESOLVED and self._expired(e, now)):
            coarse = self._coarse_of(p, now)
            if coarse is not None:
                return self._narrow(coarse, p, now)
            finer = self._finer_of(p)
            if finer is not None:
                finer.last_active = now  # the same fault, seen again without its pairs
                finer.incident.updated_ts = now
                return None
            self._entries[p.key] = _Entry(self._new(p, now), now, narrows_to=frozenset(p.narrows_to))
            return self._entries[p.key].incident
        e.last_active = now
        if e.incident.state is IncidentState.RESOLVED:
            self._reopen(e, now)
            self._update(e.incident, p, now)
            return e.incident
        if self._update(e.incident, p, now):
            return e.incident
        e.incident.updated_ts = now  # still there: "updated" follows the fault, silently
        return None

    def _coarse_of(self, p: Proposal, now: float) -> _Entry | None:
        """The incident of ``p``'s kind that ``p`` narrows down, if any: open, or resolved within the
        reopen window (the same fault, as a recurrence of an incident is)."""
        for e in self._entries.values():
            inc = e.incident
            live = inc.state is not IncidentState.RESOLVED or not self._expired(e, now)
            if inc.kind is p.kind and live and p.element in e.narrows_to:
                return e
        return None

    def _finer_of(self, p: Proposal) -> _Entry | None:
        """The open incident of ``p``'s kind on one of the parts coarse ``p`` may be on, if any."""
        for e in self._entries.values():
            inc = e.incident
            if inc.kind is p.kind and inc.state is not IncidentState.RESOLVED and inc.element in p.narrows_to:
                return e
        return None

    def _narrow(self, e: _Entry, p: Proposal, now: float) -> Incident:
        """Move ``e``'s incident onto ``p.element``: same incident (the store follows
        ``narrowed_from``), its first symptom kept, the new evidence and candidates taken."""
        inc = e.incident
        old_key, old_element = inc.key, inc.element
        del self._entries[old_key]
        inc.narrowed_from = [*inc.narrowed_from, old_key]
        inc.key, inc.element = p.key, p.element
        inc.started_ts = min(inc.started_ts, p.started_ts)
        inc.timeline.append((now, f"narrowed from {old_element} to {p.element}: {p.summary}"))
        e.narrows_to, e.last_active = frozenset(p.narrows_to), now
        if inc.state is IncidentState.RESOLVED:
            self._reopen(e, now)
        self._update(inc, p, now)
        inc.summary, inc.updated_ts = p.summary, now
        self._entries[p.key] = e
        return inc

    def _expired(self, e: _Entry, now: float) -> bool:
        resolved = e.incident.resolved_ts if e.incident.resolved_ts is not None else now
        return now - resolved > self.lc.reopen_seconds

    @staticmethod
    def _new(p: Proposal, now: float) -> Incident:
        return Incident(
            key=p.key,
            kind=p.kind,
            severity=p.severity,
            state=IncidentState.OPEN,
            element=p.element,
            summary=p.summary,
            started_ts=p.started_ts,
            updated_ts=now,
            candidates=list(p.candidates),
            ambiguous=p.ambiguous,
            affected=sorted(p.affected)[:MAX_AFFECTED],
            evidence=list(p.evidence[:MAX_EVIDENCE]),
            timeline=[(p.started_ts, "first symptom"), (now, f"opened: {p.summary}")],
        )

    def _reopen(self, e: _Entry, now: float) -> None:
        inc = e.incident
        inc.state = IncidentState.OPEN
        inc.resolved_ts = None
        e.reopens.append(now)
        while e.reopens and now - e.reopens[0] > self.lc.flap_window_seconds:
            e.reopens.popleft()
        note = "reopened"
        if not e.flapping and len(e.reopens) >= self.lc.flap_count:
            e.flapping = True
            note = f"reopened {len(e.reopens)} times in {self.lc.flap_window_seconds:.0f}s: flapping, held open"
        inc.timeline.append((now, note))

    @staticmethod
    def _update(inc: Incident, p: Proposal, now: float) -> bool:
        changed = False
        if p.severity != inc.severity:
            inc.timeline.append((now, f"severity {inc.severity.value} -> {p.severity.value}"))
            inc.severity = p.severity
            changed = True
        known = {(ev.signal, ev.node, ev.device, ev.port, ev.labels) for ev in inc.evidence}
        fresh = [ev for ev in p.evidence if (ev.signal, ev.node, ev.device, ev.port, ev.labels) not in known]
        if fresh and len(inc.evidence) < MAX_EVIDENCE:
            inc.evidence.extend(fresh[: MAX_EVIDENCE - len(inc.evidence)])
            changed = True
        grown = set(p.affected) - set(inc.affected)
        if grown and len(inc.affected) < MAX_AFFECTED:
            inc.affected = sorted(set(inc.affected) | grown)[:MAX_AFFECTED]
            changed = True
        inc.candidates = list(p.candidates)
        inc.ambiguous = p.ambiguous
        if changed:
            inc.summary = p.summary
            inc.updated_ts = now
        return changed
