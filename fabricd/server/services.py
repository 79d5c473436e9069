"""The services one app holds (store, auth, metrics, ingest, detection), reached via ``deps.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from fabricd.server.auth import Authenticator
from fabricd.server.detection import DetectionLoop
from fabricd.server.ingest import Ingestor
from fabricd.server.metrics import ServerMetrics
from fabricd.server.store.storage import Storage
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
    clock: Callable[[], float] = time.time
    detection: DetectionLoop | None = None
    schema_revision: str = ""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
