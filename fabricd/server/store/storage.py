"""``Storage.open(engine)``: every role of the store, built on one engine and one write lock."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, event

from fabricd.server.store.identities import Identities
from fabricd.server.store.incidents import Incidents
from fabricd.server.store.inventory import Inventory
from fabricd.server.store.jobs import Jobs
from fabricd.server.store.latest import LatestValues
from fabricd.server.store.maintenance import Maintenance
from fabricd.server.store.partitions import PARTITION_SECONDS
from fabricd.server.store.paths import Paths
from fabricd.server.store.sql import Database
from fabricd.server.store.stream import Stream
from fabricd.server.store.tokens import Tokens
from fabricd.server.store.topology import Topologies
from fabricd.server.store.writer import GroupCommitWriter


@dataclass(frozen=True)
class Storage:
    """The roles of one process's store. Consumers take the one role (typed by its Protocol in
    ``protocols.py``) they use; only the app's wiring and lifespan hold the whole."""

    engine: Engine
    writer: GroupCommitWriter
    stream: Stream
    latest: LatestValues
    inventory: Inventory
    incidents: Incidents
    tokens: Tokens
    topology: Topologies
    maintenance: Maintenance
    jobs: Jobs
    paths: Paths

    @classmethod
    def open(cls, engine: Engine, stream_tail_points: int = 0, partition_seconds: float = PARTITION_SECONDS) -> Storage:
        """Build the roles; touches no database (the app migrates in its lifespan).

        The latest values always follow the writer; the stream follows it, keeping the last
        ``stream_tail_points`` points in memory, only when something reads it (detection).
        ``partition_seconds``: the width of the time partitions maintenance creates (PostgreSQL)."""
        db = Database.of(engine)
        identities = Identities(db)
        latest = LatestValues(db, identities)
        stream = Stream(db, identities, stream_tail_points)
        writer = GroupCommitWriter(db, partition_seconds if engine.dialect.name == "postgresql" else None)
        # the engine disposed (the service's shutdown, a test's end): the writer's connections too
        event.listen(engine, "engine_disposed", lambda _engine: writer.release(invalidate=True))
        writer.subscribe(identities)  # first: the readers below find a new series' identity
        writer.subscribe(latest)
        if stream_tail_points > 0:
            writer.subscribe(stream)
        return cls(
            engine=engine,
            writer=writer,
            stream=stream,
            latest=latest,
            inventory=Inventory(db, latest),
            incidents=Incidents(db),
            tokens=Tokens(db),
            topology=Topologies(db),
            maintenance=Maintenance(db, partition_seconds),
            jobs=Jobs(db),
            paths=Paths(db),
        )
