"""API models (pydantic): what the REST API returns. Table models stay in ``tables.py``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from fabricd.jobmap import JobPlacement
from fabricd.server.store.records import IncidentRecord, NodeRecord, SeriesInfo, TokenInfo


class ErrorOut(BaseModel):
    error: str = Field(description="machine-readable code, e.g. unauthorized, series_limit, not_found")
    message: str = Field(description="what went wrong and what to do about it")


class IngestOut(BaseModel):
    batch_id: str
    accepted: int = Field(description="samples stored by this request (0 for a duplicate)")
    duplicate: bool = Field(description="true when this batch id was already stored (a retry)")


class CollectorOut(BaseModel):
    collector: str
    success: bool
    duration_seconds: float
    ts: float
    error: str
    readings: int


class NodeOut(BaseModel):
    node: str
    agent_version: str
    first_seen: float
    last_seen: float
    last_seen_age_seconds: float
    stale: bool = Field(description="no batch for longer than the stale window (node_stale_seconds)")
    healthy: bool = Field(description="not stale and every collector's last run succeeded")
    batches: int
    samples: int
    series: int
    collectors: list[CollectorOut]

    @classmethod
    def of(cls, n: NodeRecord, now: float, stale_after: float) -> NodeOut:
        age = max(0.0, now - n.last_seen)
        stale = age > stale_after
        cols = [
            CollectorOut(
                collector=h.collector,
                success=h.success,
                duration_seconds=h.duration_seconds,
                ts=h.ts,
                error=h.error,
                readings=h.readings,
            )
            for h in n.collectors
        ]
        return cls(
            node=n.name,
            agent_version=n.agent_version,
            first_seen=n.first_seen,
            last_seen=n.last_seen,
            last_seen_age_seconds=age,
            stale=stale,
            healthy=not stale and all(c.success for c in cols),
            batches=n.batches,
            samples=n.samples,
            series=n.series,
            collectors=cols,
        )


class PortOut(BaseModel):
    node: str
    device: str
    port: str
    state: str = Field(description="link state as the node reported it (ACTIVE, DOWN, up, down) or empty")
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None
    link_bytes_per_second: float | None
    utilization: float | None = Field(description="max(rx, tx) / link rate, 0..1")
    errors_per_second: float = Field(description="sum of the rates of error and discard counters")
    pause_fraction: float | None = Field(description="fraction of time paused (PFC/802.3x), worst priority")
    xmit_wait_per_second: float | None = Field(description="InfiniBand PortXmitWait ticks per second")
    updated_ts: float
    netdev: str = Field(default="", description="a RoCE port's network interface, whose statistics are joined in")


class PointOut(BaseModel):
    ts: float
    value: float
    rate: float | None
    status: str


class SeriesOut(BaseModel):
    id: int
    node: str
    source: str
    device: str
    port: str
    counter: str
    name: str
    unit: str
    kind: str
    labels: dict[str, str]
    step_seconds: float | None = Field(description="bucket width when the points were aggregated, else null")
    points: list[PointOut]

    @classmethod
    def of(cls, info: SeriesInfo, points: list[PointOut], step: float | None) -> SeriesOut:
        r = info.reading
        return cls(
            id=info.id,
            node=info.node,
            source=r.source,
            device=r.device,
            port=r.port,
            counter=r.counter,
            name=r.metric,
            unit=r.unit,
            kind=r.kind.value,
            labels=dict(r.labels),
            step_seconds=step,
            points=points,
        )


class EvidenceOut(BaseModel):
    signal: str
    node: str
    device: str
    port: str
    value: float
    threshold: float
    ts: float
    labels: dict[str, str] = Field(default_factory=dict)
    note: str = ""
    op: str = Field(default="", description="the rule's comparison: the signal fired while value <op> threshold")
    unit: str = Field(
        default="", description="the signal's unit (fabricd/signal_table.py): ratio, packets_per_second, ..."
    )


class CandidateOut(BaseModel):
    element: str
    score: float = Field(description="localization score: share of the symptoms explained x their consistency")
    weight: float = Field(
        default=0.0,
        description="share of the evidence pointing at it (a known path gives its elements the whole weight, "
        "ECMP alternatives split it); among ambiguous candidates they sum to 1",
    )


class TimelineEntry(BaseModel):
    ts: float
    what: str
    by: str


class IncidentSummary(BaseModel):
    id: int
    key: str
    kind: str
    severity: str
    state: str
    element: str
    summary: str
    started_ts: float
    updated_ts: float
    resolved_ts: float | None
    acked_by: str | None
    acked_ts: float | None
    resolved_by: str | None

    @classmethod
    def fields_of(cls, row: IncidentRecord) -> dict[str, Any]:
        return {k: getattr(row, k) for k in IncidentSummary.model_fields}

    @classmethod
    def of(cls, row: IncidentRecord) -> IncidentSummary:
        return cls(**cls.fields_of(row))


class AffectedJobOut(BaseModel):
    id: str
    user: str
    name: str
    nodes: list[str] = Field(description="the job's nodes whose traffic crosses the incident's element")


class IncidentOut(IncidentSummary):
    candidates: list[CandidateOut] = Field(description="localization: elements that may explain it, best first")
    ambiguous: bool = Field(
        default=False,
        description="the evidence cannot tell the candidates apart: the fault is on one of them "
        "(element: the switch they hang off, or the first); docs/detection.md",
    )
    affected: list[str]
    affected_jobs: list[AffectedJobOut] = Field(description="jobs whose traffic crosses the element (docs/jobs.md)")
    evidence: list[EvidenceOut]
    timeline: list[TimelineEntry]

    @classmethod
    def of(cls, row: IncidentRecord) -> IncidentOut:
        return cls(
            **IncidentSummary.fields_of(row),
            candidates=[CandidateOut(**c) for c in row.candidates],
            ambiguous=row.ambiguous,
            affected=list(row.affected),
            affected_jobs=[AffectedJobOut(**j) for j in row.affected_jobs],
            evidence=[EvidenceOut(**e) for e in row.evidence],
            timeline=[TimelineEntry(ts=e[0], what=e[1], by=e[2] if len(e) > 2 else "") for e in row.timeline],
        )


class JobSummary(BaseModel):
    id: str
    scheduler: str
    user: str
    name: str
    nodes: list[str]
    first_ts: float = Field(description="when an agent first reported it (event time)")
    last_ts: float
    ended_ts: float | None = Field(description="when the last of its nodes stopped reporting it; null: running")

    @classmethod
    def fields_of(cls, job: JobPlacement) -> dict[str, Any]:
        return {
            "id": job.job_id,
            "scheduler": job.scheduler,
            "user": job.user,
            "name": job.name,
            "nodes": sorted(job.nodes),
            "first_ts": job.first_ts,
            "last_ts": job.last_ts,
            "ended_ts": job.ended_ts,
        }

    @classmethod
    def of(cls, job: JobPlacement) -> JobSummary:
        return cls(**cls.fields_of(job))


class JobOut(JobSummary):
    hcas: dict[str, list[str]] = Field(description="node -> the HCAs its GPUs use (empty: every HCA of the node)")
    elements: list[str] = Field(description="fabric elements its traffic may cross (nodes, HCAs, links, switches)")
    incidents: list[IncidentSummary] = Field(description="open incidents on those elements")
    nccl: list[NcclOut] = Field(description="its NCCL collective performance (NCCL Inspector), newest first")


class IncidentAction(BaseModel):
    by: str | None = Field(default=None, max_length=128, description="who (defaults to the token's name)")
    note: str = Field(default="", max_length=1000)


class PairOut(BaseModel):
    src: str
    dst: str
    p50_seconds: float | None
    p99_seconds: float | None
    loss_ratio: float | None = Field(
        description="probes never answered (lost less late) / sent over the last probe interval"
    )
    ts: float


class NcclOut(BaseModel):
    node: str
    op: str
    ts: float
    labels: dict[str, str]
    values: dict[str, float] = Field(description="name -> value (time_seconds, busbw_bytes_per_second, ...)")


class TokenOut(BaseModel):
    id: int
    role: str
    node: str | None
    note: str
    created_ts: float
    revoked_ts: float | None

    @classmethod
    def of(cls, info: TokenInfo) -> TokenOut:
        return cls(
            id=info.id,
            role=info.role,
            node=info.node,
            note=info.note,
            created_ts=info.created_ts,
            revoked_ts=info.revoked_ts,
        )


class TokenCreate(BaseModel):
    role: str = Field(pattern="^(agent|read|admin)$")
    node: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^\S+$")
    note: str = Field(default="", max_length=256)


class TokenCreated(TokenOut):
    token: str = Field(description="shown once; only its sha256 digest is stored")


class StatusOut(BaseModel):
    nodes: int
    nodes_stale: int
    nodes_unhealthy: int
    series: int
    incidents_open: int
    incidents_acked: int
    incidents_by_severity: dict[str, int]
    schema_revision: str
    latest_unflushed_series: int = Field(
        0, description="series whose latest value is in memory only, written every latest_flush_seconds"
    )
    detection_backlog_points: int | None = Field(
        None, description="stored points the detectors have not processed yet (null: detection is off)"
    )
    settlement: SettlementOut | None = Field(None, description="null: detection is off")


class SettlementOut(BaseModel):
    """Event-time settlement of the detection loop (docs/detection.md, "Settlement")."""

    settled_ts: float | None = Field(None, description="event time evaluated so far (every live node delivered it)")
    lag_seconds: float | None = Field(None, description="wall time minus settled_ts")
    lateness_seconds: float = Field(description="a node this late past its watermark is left out")
    max_node_lateness_seconds: float = Field(description="wall time minus the oldest watermark still waited for")
    nodes: int = Field(description="nodes settlement follows")
    nodes_left_out: list[str] = Field(description="nodes silent past the lateness, left out (evidence too)")
    late_samples: int = Field(description="samples that arrived after their moment was settled (folded in)")
