"""The app factory: ``create_app(settings)`` builds the FastAPI app; its lifespan owns the engine.

Nothing happens at import. ``create_app`` wires the services (the store's roles, auth, metrics
registry, ingest) without touching the database; the lifespan migrates the schema, writes the
bootstrap token, runs the detection and maintenance loops, and disposes of the engine on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio.to_thread
from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from fabricd import __version__, logs
from fabricd.hooks import api as hooks_api
from fabricd.hooks.dispatcher import HookDispatcher
from fabricd.model import Incident, Sample
from fabricd.server import db, deps, errors
from fabricd.server.active_topology import ActiveTopology
from fabricd.server.auth import Authenticator
from fabricd.server.detection import CursorSource, DetectionLoop, DetectorFactory, IncidentListener
from fabricd.server.fleet_summary import FleetSignals
from fabricd.server.ingest import Ingestor
from fabricd.server.jobattribution import JobAttribution
from fabricd.server.jobmetrics import JobInfoCollector
from fabricd.server.metrics import FleetCollector, FleetView, ServerMetrics
from fabricd.server.rankstragglers import RankStragglerDetector
from fabricd.server.routed_topology import RoutedTopology
from fabricd.server.routes import ROUTERS, reports
from fabricd.server.routes.ingest import IngestShortcut
from fabricd.server.services import Services
from fabricd.server.store.protocols import SampleSource, TokenAdmin
from fabricd.server.store.storage import Storage
from fabricd.server.store.stream import TAIL_POINTS
from fabricd.server.wakeup import Wakeup
from fabricd.settings import ServerSettings

log = logging.getLogger("fabricd.server")


def create_app(
    settings: ServerSettings,
    detector_factory: DetectorFactory | None = None,
    incident_listeners: Sequence[IncidentListener] = (),
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    # The stream keeps the points just stored in memory only when a detector reads it (a single
    # central: among replicas the correlator reads every replica's points from the database).
    replicated = settings.replica.enabled
    tail = TAIL_POINTS if detector_factory and not replicated else 0
    store = Storage.open(db.make_engine(settings.database_url()), tail)
    registry = CollectorRegistry(auto_describe=False)
    metrics = ServerMetrics(registry)
    metrics.latest_unflushed.set_function(store.latest.unflushed)
    signals = FleetSignals()
    view = FleetView(
        settings.metrics_fleet_view,
        settings.metrics_fleet_max_series,
        settings.metrics_stale_seconds,
        settings.node_stale_seconds,
    )
    registry.register(JobInfoCollector(store.jobs))
    registry.register(FleetCollector(store.latest, store.inventory, store.incidents, view, signals, clock))
    wakeup = Wakeup()

    def stored(node: str, samples: Sequence[Sample]) -> None:
        signals.observe(node, samples)
        wakeup.set()

    storing = Ingestor(store.writer, settings.limits, metrics, clock, store.jobs, on_stored=stored, paths=store.paths)
    replica = None
    if replicated:  # HTTP ingest forwards to the bus; REST reads others' latest values from the table
        from fabricd.server import replica_wiring

        replica, store = replica_wiring.build(settings, store)
    services = Services(
        settings=settings,
        store=store,
        registry=registry,
        metrics=metrics,
        clock=clock,
        auth=Authenticator(store.tokens, settings.auth, settings.token_cache_seconds),
        ingestor=storing if replica is None else replica.http_ingestor(metrics, clock, store.jobs, store.paths),
        # What detection localizes over: the pushed topology and the discovered one, as one
        # (active_topology.py says the rule), with the agents' traced routes.
        routed=RoutedTopology(
            ActiveTopology(store.topology, store.latest, settings.metrics_stale_seconds, clock),
            store.paths,
            store.latest,
            settings.metrics_stale_seconds,
            clock,
        ),
    )
    services.replica = replica
    services.storing = storing
    services.wakeup = wakeup
    # Alert hooks: validated here (HookConfigError names the key), fed by the detection loop's
    # listener seam; each hook has its own queue so a failing one never blocks detection or ingest.
    hooks = HookDispatcher.from_settings(settings, registry)

    def notify_hooks(iid: int, _transition: str, inc: Incident) -> None:
        hooks.notify(inc, iid)

    listeners = [*incident_listeners, notify_hooks]
    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the package, not from a CDN,
    # so they work on an air-gapped cluster (assets under /static-offline-docs).
    app = FastAPIOffline(
        title="fabricd central service",
        version=__version__,
        description="Ingest from fabricd agents; fleet, ports, series, incidents, pingmesh and NCCL for on-call "
        "engineers. Send `Authorization: Bearer <token>` (see docs/api.md).",
        lifespan=_lifespan(services, detector_factory, listeners, hooks),
    )
    app.state.services = services
    app.state.hooks = hooks
    errors.install(app)
    app.add_middleware(IngestShortcut, services=services)
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(reports.router)
    app.include_router(hooks_api.router([Depends(deps.admin)]))
    return app


def _lifespan(
    services: Services,
    detector_factory: DetectorFactory | None,
    listeners: Sequence[IncidentListener],
    hooks: HookDispatcher,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        s = services
        s.schema_revision = await anyio.to_thread.run_sync(db.prepare, s.store.engine)
        # PostgreSQL's time partitions for now and ahead, before the first batch (a start days after
        # the migration would otherwise put points in the default partition until maintenance runs).
        await anyio.to_thread.run_sync(s.store.maintenance.prepare, s.clock())
        await anyio.to_thread.run_sync(s.store.latest.load)
        await anyio.to_thread.run_sync(bootstrap_token, s.store.tokens, s.settings.bootstrap_token_file, s.clock)
        await hooks.start()
        s.wakeup.bind()
        if s.replica is not None:
            # Detection runs on the replica elected correlator only, over every partition.
            async def correlate() -> None:
                assert s.replica is not None
                if detector_factory is not None:
                    warmup = s.settings.replica.warmup_seconds
                    await _start_detection(s, detector_factory, listeners, s.replica.stream(), warmup)
                    await _detection_loop(s)

            s.tasks.append(asyncio.create_task(s.replica.run(s, correlate), name="replica"))
        elif detector_factory is not None:
            await _start_detection(s, detector_factory, listeners, s.store.stream)
            s.tasks.append(asyncio.create_task(_detection_loop(s)))
        s.tasks.append(asyncio.create_task(_maintenance_loop(s)))
        s.tasks.append(asyncio.create_task(_latest_flush_loop(s)))
        s.tasks.append(asyncio.create_task(_topology_watch_loop(s)))
        if s.settings.bus.url and s.replica is None:
            from fabricd.server.bus_consumer import BusConsumer

            s.bus = BusConsumer(s.settings.bus, s.ingestor)
            s.tasks.append(asyncio.create_task(s.bus.run(), name="bus-consumer"))
        logs.event(
            log,
            logging.INFO,
            "central service ready",
            db=_safe_url(s),
            schema=s.schema_revision,
            auth=s.settings.auth,
            detector=detector_factory is not None,
        )
        try:
            yield
        finally:
            for task in s.tasks:
                task.cancel()
            await asyncio.gather(*s.tasks, return_exceptions=True)
            s.tasks.clear()
            await _flush_latest(s)
            await hooks.stop()
            s.store.writer.close()
            s.store.engine.dispose()

    return lifespan


async def _start_detection(
    s: Services,
    detector_factory: DetectorFactory,
    listeners: Sequence[IncidentListener],
    stream: SampleSource | CursorSource,
    warmup_seconds: float = 0.0,
) -> None:
    # Incidents name the jobs they hurt (fabricd/server/jobattribution.py), whatever the detector.
    # Ranks slower than their peers (NCCL Inspector) are stragglers too (fabricd/server/rankstragglers.py).
    inner = RankStragglerDetector(detector_factory(s.settings, s.routed))  # with traced routes
    detector = JobAttribution(inner, s.store.jobs, s.routed)
    # Settlement waits for the nodes heard from recently, as if they had delivered (a restart).
    recent = s.clock() - s.settings.node_stale_seconds
    nodes = [n.name for n in await anyio.to_thread.run_sync(s.store.inventory.nodes) if n.last_seen > recent]
    s.detection = await anyio.to_thread.run_sync(
        lambda: DetectionLoop(
            stream,
            s.store.incidents,
            detector,
            s.metrics,
            listeners,
            s.clock,
            nodes=nodes,
            warmup_seconds=warmup_seconds,
        )
    )


def _safe_url(s: Services) -> str:
    return s.store.engine.url.render_as_string(hide_password=True)


async def _detection_loop(s: Services) -> None:
    assert s.detection is not None
    while True:
        try:
            # Catch up in chunks, then wait: a backlog after a restart drains without sleeping.
            # step() also runs when nothing is new: settlement moves on as time passes.
            while await anyio.to_thread.run_sync(s.detection.step):
                pass
        except Exception:
            s.metrics.detection_errors.inc()
            log.exception("detection step failed; retrying")
        await s.wakeup.wait(s.settings.detection_interval_seconds)  # a stored batch wakes it sooner


async def _topology_watch_loop(s: Services) -> None:
    from fabricd.server.topology_watch import TopologyWatch

    def gauge(kind: str, value: float) -> None:
        s.metrics.topology_changes.labels(kind).set(value)

    watch = TopologyWatch(s.store.latest, s.store.topology, s.settings.metrics_stale_seconds, gauge)
    while True:
        await asyncio.sleep(s.settings.topology_watch_seconds)
        try:
            await anyio.to_thread.run_sync(watch.step, s.clock())
        except Exception:
            log.exception("topology watch failed; retrying next interval")


async def _latest_flush_loop(s: Services) -> None:
    while True:
        await asyncio.sleep(s.settings.latest_flush_seconds)
        await _flush_latest(s)


async def _flush_latest(s: Services) -> None:
    started = time.perf_counter()
    try:
        written = await anyio.to_thread.run_sync(s.store.latest.flush)
    except Exception:  # kept in memory and retried; a restart replays the points since the last flush
        s.metrics.latest_flush_errors.inc()
        log.exception("writing latest values failed; retrying next interval")
        return
    s.metrics.latest_flush_seconds.observe(time.perf_counter() - started)
    s.metrics.latest_flushed_series.inc(written)


async def _maintenance_loop(s: Services) -> None:
    st = s.settings
    while True:
        await asyncio.sleep(st.maintenance_interval_seconds)
        if s.replica is not None and not s.replica.leading:
            continue  # among replicas the correlator alone downsamples and expires (once, not N times)
        try:
            report = await anyio.to_thread.run_sync(
                lambda: s.store.maintenance.run(
                    s.clock(), st.raw_retention_seconds, st.downsample_step_seconds, st.retention_seconds
                )
            )
        except Exception:
            log.exception("store maintenance failed; retrying next interval")
            continue
        try:  # ended jobs leave with the points of their time (docs/jobs.md, Privacy)
            await anyio.to_thread.run_sync(s.store.jobs.expire, s.clock() - st.retention_seconds)
        except Exception:
            log.exception("expiring ended jobs failed; retrying next interval")
        s.metrics.maintenance_deleted.inc(report.deleted_points)
        s.metrics.maintenance_downsampled.inc(report.downsampled_points)
        logs.event(
            log,
            logging.INFO,
            "store maintenance",
            downsampled=report.downsampled_points,
            buckets=report.buckets_written,
            deleted=report.deleted_points,
            deleted_batch_ids=report.deleted_batches,
        )


def bootstrap_token(tokens: TokenAdmin, path: Path | None, clock: Callable[[], float] = time.time) -> str | None:
    """With no admin token yet, create one and write it to ``path`` (mode 0600). Returns it."""
    if path is None or tokens.has_admin():
        return None
    _id, token = tokens.create("admin", clock(), note="bootstrap")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that already existed
    logs.event(log, logging.INFO, "bootstrap admin token written", path=str(path))
    return token
