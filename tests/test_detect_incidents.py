"""Incident lifecycle: one incident per root cause, auto-resolve, reopen within a window, flap damping."""

from __future__ import annotations

import dataclasses

from fabricd.detect.incidents import IncidentBook, Proposal
from fabricd.detect.rules import Lifecycle
from fabricd.model import Candidate, Evidence, IncidentKind, IncidentState, Severity

LC = Lifecycle(quiet_seconds=60, reopen_seconds=300, flap_count=3, flap_window_seconds=1800, flap_hold_seconds=600)


def prop(ts: float, node: str = "node-001", severity: Severity = Severity.WARNING) -> Proposal:
    ev = Evidence("ecn_marked_ratio", node, "mlx5_0", "1", 0.12, 0.02, ts)
    return Proposal(
        IncidentKind.CONGESTION,
        "leaf-01~spine-01",
        [Candidate("leaf-01~spine-01", 0.9)],
        [node],
        [ev],
        severity,
        1000.0,
        "leaf-01~spine-01 is congested",
    )


def test_many_symptoms_of_one_root_cause_make_one_incident() -> None:
    book = IncidentBook(LC)
    changed = book.apply([prop(1010, "node-001"), prop(1010, "node-002"), prop(1010, "node-003")], 1010)
    assert len(changed) == 1 and len(book.open()) == 1
    assert changed[0].affected == ["node-001", "node-002", "node-003"]
    assert changed[0].key == "congestion:leaf-01~spine-01"


def test_repeating_what_is_known_changes_nothing_but_new_evidence_or_severity_does() -> None:
    book = IncidentBook(LC)
    book.apply([prop(1010)], 1010)
    assert book.apply([prop(1020)], 1020) == []
    (inc,) = book.apply([prop(1030, severity=Severity.CRITICAL)], 1030)
    assert inc.severity is Severity.CRITICAL and inc.timeline[-1][1] == "severity warning -> critical"
    (inc,) = book.apply([prop(1040, node="node-009")], 1040)
    assert "node-009" in inc.affected


def test_resolves_after_the_quiet_period_in_event_time() -> None:
    book = IncidentBook(LC)
    book.apply([prop(1010)], 1010)
    assert book.resolve_quiet(1060) == []
    (inc,) = book.resolve_quiet(1071)
    assert inc.state is IncidentState.RESOLVED and inc.resolved_ts == 1010
    assert inc.started_ts == 1000.0


def test_recurrence_within_the_window_reopens_the_same_incident_later_starts_a_new_one() -> None:
    book = IncidentBook(LC)
    (first,) = book.apply([prop(1010)], 1010)
    book.resolve_quiet(1100)
    (again,) = book.apply([prop(1200)], 1200)
    assert again is first and again.state is IncidentState.OPEN and again.timeline[-1][1] == "reopened"
    book.resolve_quiet(1300)
    (fresh,) = book.apply([prop(1700)], 1700)
    assert fresh is not first and fresh.state is IncidentState.OPEN


def test_a_flapping_incident_is_held_open_instead_of_resolving_again() -> None:
    book = IncidentBook(LC)
    book.apply([prop(1000)], 1000)
    now = 1000.0
    resolutions = 0
    for _ in range(6):  # symptoms every 150 s, each lasting one evaluation
        now += 150
        resolutions += len(book.resolve_quiet(now - 1))
        book.apply([prop(now)], now)
    assert resolutions == 3  # after three reopens it is flapping: no more resolve/reopen churn
    (inc,) = book.open()
    assert any("flapping" in what for _, what in inc.timeline)
    assert book.resolve_quiet(now + 300) == []
    assert len(book.resolve_quiet(now + 601)) == 1


def test_an_ongoing_fault_moves_updated_without_being_a_change() -> None:
    book = IncidentBook(LC)
    (opened,) = book.apply([prop(1010)], 1010)
    timeline = list(opened.timeline)
    assert book.apply([prop(1050)], 1050) == []  # nothing new: not reported
    (inc,) = book.open()
    assert inc.updated_ts == 1050 and inc.timeline == timeline


UPLINKS = ("leaf-01~spine-01", "leaf-01~spine-02")


def coarse(ts: float) -> Proposal:
    """What ``by_leaf`` proposes: marks behind leaf-01 and no pair yet to say which uplink."""
    ev = Evidence("cnp_sent_packets_per_second", "node-002", "mlx5_0", "1", 900.0, 100.0, ts)
    cands = [Candidate("leaf-01", 1.0), Candidate(UPLINKS[0], 0.5), Candidate(UPLINKS[1], 0.5)]
    p = Proposal(
        IncidentKind.CONGESTION,
        "leaf-01",
        cands,
        ["node-002"],
        [ev],
        Severity.WARNING,
        990.0,
        "leaf-01 (or one of its uplinks) is congested",
    )
    p.narrows_to = UPLINKS
    return p


def test_a_leaf_incident_is_narrowed_onto_the_uplink_the_pairs_name_as_the_same_incident() -> None:
    book = IncidentBook(LC)
    (leaf,) = book.apply([coarse(1000)], 1000)
    assert leaf.key == "congestion:leaf-01"
    (narrowed,) = book.apply([prop(1010)], 1010)
    assert narrowed is leaf
    assert (narrowed.key, narrowed.element, narrowed.narrowed_from) == (
        "congestion:leaf-01~spine-01",
        "leaf-01~spine-01",
        ["congestion:leaf-01"],
    )
    assert narrowed.started_ts == 990.0  # the first symptom stays the leaf's
    assert narrowed.timeline[-1][1].startswith("narrowed from leaf-01 to leaf-01~spine-01: ")
    assert [i.key for i in book.open()] == ["congestion:leaf-01~spine-01"]
    # The marks without their pairs again: the narrowed incident is confirmed, no leaf incident opens.
    assert book.apply([coarse(1020)], 1020) == []
    assert [i.key for i in book.open()] == ["congestion:leaf-01~spine-01"]
    assert book.resolve_quiet(1075) == []  # 1020 kept it alive


def test_only_the_parts_of_the_coarse_element_narrow_it() -> None:
    book = IncidentBook(LC)
    book.apply([coarse(1000)], 1000)
    other = prop(1010)
    other.element = "leaf-02~spine-01"
    book.apply([other], 1010)
    assert sorted(i.key for i in book.open()) == ["congestion:leaf-01", "congestion:leaf-02~spine-01"]
    loss = prop(1010)
    loss.kind = IncidentKind.PACKET_LOSS
    book.apply([loss], 1010)
    assert "congestion:leaf-01" in {i.key for i in book.open()}  # another kind is another fault


def test_a_leaf_incident_resolved_within_the_reopen_window_is_narrowed_and_reopened() -> None:
    book = IncidentBook(LC)
    (leaf,) = book.apply([coarse(1000)], 1000)
    book.resolve_quiet(1100)
    (narrowed,) = book.apply([prop(1200)], 1200)
    assert narrowed is leaf and narrowed.state is IncidentState.OPEN
    assert [i.key for i in book.all()] == ["congestion:leaf-01~spine-01"]


def test_a_book_adopts_stored_open_incidents_as_if_it_had_opened_them() -> None:
    # A correlator died with "congestion:leaf-01" open (ambiguous among its uplinks; leaf-02 was a
    # weaker candidate). The next engine's book takes it over: no second incident for the same fault.
    p = coarse(1000)
    p.candidates.append(Candidate("leaf-02", 0.2))
    p.ambiguous = True
    (opened,) = IncidentBook(LC).apply([p], 1000)
    stored = dataclasses.replace(opened, candidates=list(opened.candidates), timeline=list(opened.timeline))
    rank = dataclasses.replace(stored, key="straggler:rank:7:c0:allreduce:3", kind=IncidentKind.STRAGGLER)
    book = IncidentBook(LC)
    assert book.adopt([stored, rank]) == [stored]  # a rank straggler is not a proposal's incident
    assert book.adopt([stored]) == []  # once
    assert book.apply([coarse(1010)], 1010) == []  # the same fault again: confirmed, nothing new
    other = prop(1020)
    other.element = "leaf-02"
    (elsewhere,) = book.apply([other], 1020)  # a candidate that is not one of its parts: another fault
    assert elsewhere.key == "congestion:leaf-02"
    (narrowed,) = book.apply([prop(1030)], 1030)
    assert narrowed is stored and (narrowed.key, narrowed.narrowed_from) == (
        "congestion:leaf-01~spine-01",
        ["congestion:leaf-01"],
    )
    assert [i.key for i in book.resolve_quiet(1100)] == ["congestion:leaf-02", "congestion:leaf-01~spine-01"]


def test_an_adopted_incident_nothing_confirms_resolves_after_the_quiet_period() -> None:
    (stored,) = IncidentBook(LC).apply([prop(1000)], 1000)
    book = IncidentBook(LC)
    book.adopt([stored])
    assert book.resolve_quiet(1050) == []
    (resolved,) = book.resolve_quiet(1061)
    assert resolved is stored and resolved.state is IncidentState.RESOLVED and resolved.resolved_ts == 1000
