"""Table models (SQLAlchemy 2 typed ORM). API models live in ``api_models.py``; never mix them.

Times are float seconds since the epoch (event time for samples, wall time for server-side events).
Rate series are split into ``series`` (identity, one row per node/source/device/port/counter/labels,
with the latest point cached for ``/metrics`` and ``/ports``) and ``points`` (ts, value, rate, status)
keyed by series id, so a point costs a few numbers, not repeated strings. ``points.id`` is the ingest
order the detection engine reads from. The schema is created by Alembic (``migrations/``), which a
test compares with these models.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only aliases the rowid (fast autoincrement) for INTEGER PRIMARY KEY, not BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)  # wall time of the last accepted batch
    last_batch_ts: Mapped[float] = mapped_column(Float, default=0.0)  # the agent's own batch time
    batches: Mapped[int] = mapped_column(BigInteger, default=0)
    samples: Mapped[int] = mapped_column(BigInteger, default=0)
    # The newest point's id, committed with the points: where the correlator's read of the node's
    # partition can stop (fabricd/server/partition_stream.py). NULL: stored by an older version.
    last_point_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class CollectorStatus(Base):
    __tablename__ = "collector_status"

    node: Mapped[str] = mapped_column(String(128), ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    collector: Mapped[str] = mapped_column(String(128), primary_key=True)
    success: Mapped[bool] = mapped_column(Boolean)
    duration_seconds: Mapped[float] = mapped_column(Float)
    ts: Mapped[float] = mapped_column(Float)
    error: Mapped[str] = mapped_column(Text, default="")
    readings: Mapped[int] = mapped_column(Integer, default=0)


class IngestedBatch(Base):
    """One row per accepted batch; the unique key makes a retried batch a no-op (idempotency)."""

    __tablename__ = "ingested_batches"
    __table_args__ = (UniqueConstraint("node", "batch_id", name="uq_ingested_batches_node_batch"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(128))
    batch_id: Mapped[str] = mapped_column(String(128))
    received_ts: Mapped[float] = mapped_column(Float, index=True)
    samples: Mapped[int] = mapped_column(Integer)


class Series(Base):
    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("node", "source", "device", "port", "counter", "labels", name="uq_series_identity"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # Looked up by node through the unique identity index's leading column (migration 0010).
    node: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str] = mapped_column(String(128))
    counter: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    unit: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))
    labels: Mapped[str] = mapped_column(Text, default="{}")  # canonical JSON (sorted keys): part of the identity
    # Written by releases before migration 0009 only (a replica in a rolling upgrade): the latest
    # values are in ``latest_chunks`` now, and the readers take the newer of the two.
    latest_ts: Mapped[float | None] = mapped_column(Float, default=None)
    latest_value: Mapped[float | None] = mapped_column(Float, default=None)
    latest_rate: Mapped[float | None] = mapped_column(Float, default=None)
    latest_status: Mapped[str | None] = mapped_column(String(16), default=None)
    latest_since: Mapped[float | None] = mapped_column(Float, default=None)


class Point(Base):
    __tablename__ = "points"
    __table_args__ = (Index("ix_points_series_ts", "series_id", "ts"), Index("ix_points_step_ts", "step", "ts"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # No foreign key: the store is the only writer, and an FK check per point slows bulk ingest.
    series_id: Mapped[int] = mapped_column(BigInteger)
    ts: Mapped[float] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)
    rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    since: Mapped[float | None] = mapped_column(Float, nullable=True)
    step: Mapped[float] = mapped_column(Float, default=0.0)  # 0 = raw; else the downsampling bucket width


class PointChunk(Base):
    """SQLite's raw points: one row per stored batch, its points packed (``store/chunks.py``, migration
    0008). Not on PostgreSQL, whose raw points are rows of ``points`` in time partitions."""

    __tablename__ = "point_chunks"
    __table_args__ = (
        Index("ix_point_chunks_node_ts", "node", "ts_min", "ts_max"),
        Index("ix_point_chunks_ts", "ts_min", "node"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # the last point's id
    count: Mapped[int] = mapped_column(Integer)  # points, with the consecutive ids up to ``id``
    node: Mapped[str] = mapped_column(Text)
    ts_min: Mapped[float] = mapped_column(Float)
    ts_max: Mapped[float] = mapped_column(Float)
    points: Mapped[bytes] = mapped_column(LargeBinary)
    ids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # set once partly folded


class LatestChunk(Base):
    """The latest values' durable copy: a row per node, its series' newest points packed as a chunk
    (``store/latest.py``, migration 0009). ``series.latest_*`` is what releases before it wrote."""

    __tablename__ = "latest_chunks"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)  # series in ``points``
    points: Mapped[bytes] = mapped_column(LargeBinary)


class Incident(Base):
    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(256), unique=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    element: Mapped[str] = mapped_column(String(256))
    summary: Mapped[str] = mapped_column(Text)
    started_ts: Mapped[float] = mapped_column(Float, index=True)
    updated_ts: Mapped[float] = mapped_column(Float)
    resolved_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    acked_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    acked_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    resolved_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    candidates: Mapped[list[Any]] = mapped_column(JSON, default=list)
    affected: Mapped[list[Any]] = mapped_column(JSON, default=list)
    evidence: Mapped[list[Any]] = mapped_column(JSON, default=list)
    timeline: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [[ts, text, actor], ...] append-only
    # [{"id", "user", "name", "nodes"}, ...]: the jobs whose traffic crosses the element (fabricd.jobmap)
    affected_jobs: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # localization could not tell its candidates apart (docs/detection.md, "Partial knowledge")
    ambiguous: Mapped[bool] = mapped_column(Boolean, default=False)


class TracedPath(Base):
    """The path one probed pair's 5-tuple took, as its agent last traced it (hop addresses raw).

    ``version`` counts the different paths seen (a re-trace finding the same hops only moves
    ``traced_ts``); ``changed_ts`` is when the current one was first traced. Event times."""

    __tablename__ = "paths"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    peer: Mapped[str] = mapped_column(String(128), primary_key=True)
    # request: node's probes to peer; reply: node's replies to the prober peer (docs/topology.md)
    direction: Mapped[str] = mapped_column(String(8), primary_key=True, default="request")
    src: Mapped[str] = mapped_column(String(64), default="")
    src_port: Mapped[int] = mapped_column(Integer, default=0)
    dst: Mapped[str] = mapped_column(String(64), default="")
    dst_port: Mapped[int] = mapped_column(Integer, default=0)
    hops: Mapped[list[Any]] = mapped_column(JSON, default=list)  # addresses in TTL order, null: silent
    reached: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    changed_ts: Mapped[float] = mapped_column(Float)
    traced_ts: Mapped[float] = mapped_column(Float)


class JobNode(Base):
    """One job on one node, as that node's agent reported it (event time); a job is its rows.

    Kept out of ``series``: a job per node per day would grow the series table (and the
    per-node series limit) without bound. ``ended_ts`` is set when the node's agent stops
    reporting the job (the epilog removed its file; its processes are gone)."""

    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    node: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)
    scheduler: Mapped[str] = mapped_column(String(32), default="")
    user: Mapped[str] = mapped_column(String(128), default="")
    name: Mapped[str] = mapped_column(String(128), default="")
    gpus: Mapped[str] = mapped_column(String(256), default="")  # "0,1,2": indices on this node
    hcas: Mapped[str] = mapped_column(Text, default="")  # "mlx5_0,mlx5_3": "" = unknown (all the node's)
    first_ts: Mapped[float] = mapped_column(Float)
    last_ts: Mapped[float] = mapped_column(Float)
    ended_ts: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the token; never the token
    role: Mapped[str] = mapped_column(String(16))
    node: Mapped[str | None] = mapped_column(String(128), nullable=True)
    note: Mapped[str] = mapped_column(String(256), default="")
    created_ts: Mapped[float] = mapped_column(Float)
    revoked_ts: Mapped[float | None] = mapped_column(Float, nullable=True)


class Topology(Base):
    __tablename__ = "topology"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    updated_ts: Mapped[float] = mapped_column(Float)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"elements": [...], "links": [...]}


class Cursor(Base):
    """Named read positions in ``points`` (the detection loop resumes here after a restart)."""

    __tablename__ = "cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger)
