"""The typed values that travel along fabricd's one-way pipeline.

collector -> ``Reading`` -> counter semantics -> ``Sample`` -> ``Batch`` (transport) -> ingest -> store
-> detectors -> incidents / metrics / hooks.

Every stage takes and returns these values; no stage reaches back into an earlier one.
Units are base units, converted once at the source (bytes, seconds, packets, ...).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Labels = tuple[tuple[str, str], ...]


class Kind(enum.StrEnum):
    """How a reading's value behaves over time."""

    COUNTER = "counter"  # monotonic (modulo wraps/resets); becomes a rate at the agent
    GAUGE = "gauge"  # a level (state id, rate in bytes/s, backlog bytes)
    INFO = "info"  # a string-valued attribute, carried in ``labels``; value is 1
    EVENT = "event"  # something that happened once (an aborted NCCL run); value is 1


class Status(enum.StrEnum):
    """What the counter-semantics stage concluded about one counter at one scrape."""

    OK = "ok"  # a rate was computed
    FIRST = "first"  # first sighting: a baseline, no rate yet
    WRAPPED = "wrapped"  # a fixed-width counter wrapped; the rate is unwrapped
    SATURATED = "saturated"  # clamped at all ones: value unknown since ``saturated_since``
    RESET = "reset"  # counter went backwards (driver reload, cleared): no rate this interval


def labels_of(mapping: Mapping[str, str] | None = None) -> Labels:
    """Canonical (sorted) label tuple, hashable and stable for series keys."""
    if not mapping:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in mapping.items()))


# Reading and Sample are immutable by convention but not ``frozen``: a frozen dataclass's __init__
# goes through object.__setattr__ per field, ~8x slower, and a scrape creates hundreds of each
# (measured: 9.6 us vs 1.1 us per instance on the 2-core CI machine).
@dataclass(slots=True)
class Reading:
    """One value a collector read at one instant.

    ``counter`` is the raw name at the source (the sysfs file name, the ethtool statistic name)
    so an engineer can find it on the host; ``name`` is fabricd's vendor-neutral name when one
    exists (``pause_duration_seconds`` for mlx5 ``rx_prio3_pause_duration``), else the raw name.
    ``value`` is normalized to base units (IB data counters already x4, microseconds already
    seconds). ``width`` is the hardware counter width in bits (0 = not a fixed-width counter)
    and ``saturates`` tells whether it clamps at all ones instead of wrapping.
    """

    source: str
    device: str
    port: str
    counter: str
    value: float
    unit: str
    kind: Kind = Kind.COUNTER
    labels: Labels = ()
    name: str = ""
    width: int = 64
    saturates: bool = False
    scale: float = 1.0  # factor applied to the raw value (4 for IB data words); width applies to raw
    # ``key()`` computed once and kept: RateEngine looks every counter up by it on every scrape, and
    # collectors reuse a Reading while its file is unchanged. A cache, not part of the value: not
    # an __init__ argument (``dataclasses.replace`` starts it afresh), not compared, not shown.
    series: tuple[str, str, str, str, Labels] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def metric(self) -> str:
        return self.name or self.counter

    def key(self) -> tuple[str, str, str, str, Labels]:
        """Identity of the series this reading belongs to (per node)."""
        return (self.source, self.device, self.port, self.counter, self.labels)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "device": self.device,
            "port": self.port,
            "counter": self.counter,
            "name": self.metric,
            "value": self.value,
            "unit": self.unit,
            "kind": self.kind.value,
        }
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


# What a consumer of samples reads: source -> the names it reads (``Reading.name``, else the raw
# counter). The detection engine says what it reads (``DetectionEngine.inputs``), so the central
# builds only those samples from the stream, and the replay hands on only those.
Inputs = Mapping[str, Collection[str]]


def reads(inputs: Inputs, r: Reading) -> bool:
    """Whether a consumer of ``inputs`` reads ``r`` (by its neutral name or its raw counter)."""
    names = inputs.get(r.source)
    return names is not None and ((r.name or r.counter) in names or r.counter in names)


@dataclass(slots=True)
class Sample:
    """A reading placed in event time, with its rate (for counters) as the agent computed it.

    ``ts`` is the scrape's event time in seconds since the epoch. ``rate`` is per second in the
    reading's unit (bytes -> bytes/s) or ``None`` when no honest rate exists (first sighting,
    reset, saturation). Derived signals (ECN-marked fraction, pause fraction, ...) are Samples
    with ``source == "derived"`` and a gauge value.
    """

    ts: float
    reading: Reading
    rate: float | None = None
    status: Status = Status.OK
    since: float | None = None  # for SATURATED: event time the saturation was first seen

    def to_json(self) -> dict[str, Any]:
        out = self.reading.to_json()
        out["ts"] = self.ts
        out["rate"] = self.rate
        out["status"] = self.status.value
        if self.since is not None:
            out["since"] = self.since
        return out


@dataclass(frozen=True, slots=True)
class CollectorHealth:
    """How one collector's last run went; exported as ``fabricd_collector_success`` etc."""

    collector: str
    success: bool
    duration_seconds: float
    ts: float
    error: str = ""
    readings: int = 0


@dataclass(slots=True)
class Batch:
    """What one agent sends in one request (docs/wire-format.md; versions in ``fabricd.wire``).

    ``instance`` is a random id the agent process picks when it starts and ``seq`` numbers its
    batches 1, 2, 3, ... in creation order, so the central can tell whether batches that arrive
    out of order (concurrent live sends, the spool drain) left a hole. ``first_ts``/``last_ts``
    are the earliest and latest event time of ``samples`` (None without samples). A batch decoded
    from wire version 1 has all four None. ``schema_version`` is the wire version a batch was
    decoded from (None for one built here: the transport picks the version it encodes).
    """

    node: str
    agent_version: str
    batch_id: str
    samples: Sequence[Sample]  # a list, or ``wire_columns.SampleColumns`` as ingest decodes it
    health: list[CollectorHealth] = field(default_factory=list)
    schema_version: int | None = None
    created_ts: float = 0.0
    instance: str | None = None
    seq: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None


class IncidentKind(enum.StrEnum):
    CONGESTION = "congestion"
    PACKET_LOSS = "packet_loss"
    HOL_BLOCKING = "hol_blocking"
    PFC_STORM = "pfc_storm"
    LINK_FLAP = "link_flap"
    TAIL_LATENCY = "tail_latency"
    STRAGGLER = "straggler"


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class IncidentState(enum.StrEnum):
    OPEN = "open"
    ACKED = "acked"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A topology element that may explain an incident, with its localization score."""

    element: str  # "leaf-01~spine-02", "node-007/mlx5_3", "leaf-01", "node-007"
    score: float
    # the share of the evidence pointing at it: a symptom whose path is known gives each element on
    # it its whole weight, one with n ECMP alternatives 1/n to each (docs/detection.md)
    weight: float = 0.0


@dataclass(frozen=True, slots=True)
class Evidence:
    """One signal that fired: what, where, how much, against which threshold (event time).

    ``op`` and ``threshold`` are the rule's condition (``>`` 20000); ``unit`` is the signal's unit
    in ``fabricd.signal_table`` (``packets_per_second``), so every view can write "350k packets/s,
    threshold > 20k packets/s" without knowing the rules (empty: stored before they were carried)."""

    signal: str  # e.g. "ecn_marked_ratio"
    node: str
    device: str
    port: str
    value: float
    threshold: float
    ts: float
    labels: Labels = ()
    note: str = ""
    op: str = ""  # ">", ">=", "<", "<="
    unit: str = ""


@dataclass(frozen=True, slots=True)
class AffectedJob:
    """A job an incident hurts: its nodes whose traffic crosses the incident's element."""

    job_id: str
    user: str
    name: str
    nodes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.job_id, "user": self.user, "name": self.name, "nodes": list(self.nodes)}


@dataclass(slots=True)
class Incident:
    """A detected problem as the detection engine sees it (event time throughout).

    ``key`` identifies the root cause (kind + localized element) and is how the store dedupes:
    one incident per root cause, not one per symptom. The engine owns open/resolve/reopen; an
    engineer's ack is kept by the store and survives the engine's updates.
    """

    key: str
    kind: IncidentKind
    severity: Severity
    state: IncidentState
    element: str
    summary: str
    started_ts: float
    updated_ts: float
    resolved_ts: float | None = None
    candidates: list[Candidate] = field(default_factory=list)
    affected: list[str] = field(default_factory=list)  # nodes or "node-a|node-b" pairs
    evidence: list[Evidence] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (ts, what happened)
    affected_jobs: list[AffectedJob] = field(default_factory=list)  # set by the central (fabricd.jobmap)
    narrowed_from: list[str] = field(default_factory=list)  # earlier keys of this incident, oldest first
    ambiguous: bool = False  # localization could not tell the candidates apart (docs/detection.md)
