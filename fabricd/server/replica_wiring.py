"""What ``replica.enabled`` changes in the app (fabricd/server/app.py), in one place.

* HTTP ingest forwards to the bus (fabricd/server/forward.py); the bus consumers store, one per
  partition this replica claimed (fabricd/server/replica.py);
* REST reads take other replicas' nodes' latest values from the table (replica_latest.py);
* detection runs on the correlator only, reading every partition (partition_stream.py).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from fabricd.bus import BusNames
from fabricd.model import Sample
from fabricd.server.bus_consumer import BusConsumer
from fabricd.server.claims import Claims
from fabricd.server.forward import BusForwarder
from fabricd.server.ingest import Ingestor
from fabricd.server.metrics import ServerMetrics
from fabricd.server.partition_stream import PartitionedStream
from fabricd.server.replica import Replica
from fabricd.server.replica_latest import ReplicaLatest
from fabricd.server.store.inventory import Inventory
from fabricd.server.store.jobs import Jobs
from fabricd.server.store.protocols import PathSink
from fabricd.server.store.storage import Storage
from fabricd.settings import ServerSettings, parse_listen

if TYPE_CHECKING:
    from fabricd.server.services import Services


class ReplicaWiring:
    def __init__(self, settings: ServerSettings, store: Storage) -> None:
        self.settings, self.store = settings, store
        self.names = BusNames(settings.bus.prefix, settings.bus.partitions)
        self.forwarder = BusForwarder(settings.bus)
        conninfo = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        lease = settings.replica.lease_seconds
        self.claims = Claims(conninfo, settings.bus.prefix, replica_id(settings), lease)
        self.replica: Replica | None = None

    @property
    def leading(self) -> bool:
        return self.replica is not None and self.replica.leading is not None

    def owns(self, node: str) -> bool:
        return self.replica is not None and self.replica.owns(self.names.partition(node))

    def http_ingestor(
        self, metrics: ServerMetrics, clock: Callable[[], float], jobs: Jobs, paths: PathSink
    ) -> Ingestor:
        # The owner that stores the batch counts it in the fleet signals, not the replica forwarding it;
        # job and traced-path readings are recorded here, before forwarding (they are not series).
        return Ingestor(
            self.forwarder, self.settings.limits, metrics, clock, jobs, on_stored=_ignore, paths=paths, forwards=True
        )

    def stream(self) -> PartitionedStream:
        latest = self.store.latest
        return PartitionedStream(latest.db, latest.identities, self.names)

    async def run(self, s: Services, correlate: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert s.storing is not None
        await self.forwarder.start()
        lease = self.settings.replica.lease_seconds
        # A dead owner's unacknowledged batches are due again before a new owner claims (bus_consumer.py).
        consumer = s.bus = BusConsumer(self.settings.bus, s.storing, ack_wait_seconds=max(1.0, lease / 4))
        self.replica = Replica(
            self.claims, self.names.partitions, self.settings.replica.partitions, consumer.run, correlate, lease
        )
        try:
            await self.replica.run()
        finally:
            await self.forwarder.aclose()


def replica_id(settings: ServerSettings) -> str:
    """``replica.id``, or this host's name and the port it serves on."""
    if settings.replica.id:
        return settings.replica.id
    _host, port = parse_listen(settings.listen)
    return f"{socket.gethostname()[:30]}:{port}"


def _ignore(_node: str, _samples: Sequence[Sample]) -> None:
    pass


def build(settings: ServerSettings, store: Storage) -> tuple[ReplicaWiring, Storage]:
    wiring = ReplicaWiring(settings, store)
    latest = ReplicaLatest(store.latest, wiring.owns)
    wiring.store = dataclasses.replace(store, latest=latest, inventory=Inventory(latest.db, latest))
    return wiring, wiring.store
