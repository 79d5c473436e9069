"""The services one app holds (store, auth, metrics, ingest, detection), reached via ``deps.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from fabricd.server.auth import Authenticator
from fabricd.server.detection import DetectionLoop
from fabricd.server.ingest import Ingestor
from fabricd.server.metrics import ServerMetrics
from fabricd.server.routed_topology import RoutedTopology
from fabricd.server.store.storage import Storage
from fabricd.server.wakeup import Wakeup
from fabricd.settings import ServerSettings


@dataclass
class Services:
    """What the routes use, reached through ``deps.py`` (one per app, never global)."""

    settings: ServerSettings
    store: Storage  # each route takes the one role it uses (deps.py)
    auth: Authenticator
    registry: CollectorRegistry
    metrics: ServerMetrics
    ingestor: Ingestor
    routed: RoutedTopology  # the stored topology with the traced routes (what detection reads)
    clock: Callable[[], float] = time.time
    detection: DetectionLoop | None = None
    replica: Any = None  # ReplicaWiring with replica.enabled (fabricd/server/replica_wiring.py)
    storing: Ingestor | None = None  # the ingestor that stores (``ingestor`` forwards on a replica)
    bus: Any = None  # BusConsumer with bus.url (imported only then: nats-py is the 'bus' extra)
    wakeup: Wakeup = field(default_factory=Wakeup)  # a stored batch wakes the detection loop
    schema_revision: str = ""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
