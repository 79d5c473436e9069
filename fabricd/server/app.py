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
from fabricd.model import Incident
from fabricd.server import db, deps, errors
from fabricd.server.auth import Authenticator
from fabricd.server.detection import DetectionLoop, DetectorFactory, IncidentListener
from fabricd.server.ingest import Ingestor
from fabricd.server.metrics import FleetCollector, ServerMetrics
from fabricd.server.routes import ROUTERS, reports
from fabricd.server.services import Services
from fabricd.server.store.protocols import TokenAdmin
from fabricd.server.store.storage import Storage
from fabricd.server.store.stream import TAIL_POINTS
from fabricd.settings import ServerSettings

log = logging.getLogger("fabricd.server")


def create_app(
    settings: ServerSettings,
    detector_factory: DetectorFactory | None = None,
    incident_listeners: Sequence[IncidentListener] = (),
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    # The stream keeps the points just stored in memory only when a detector reads it.
    store = Storage.open(db.make_engine(settings.database_url()), TAIL_POINTS if detector_factory else 0)
    registry = CollectorRegistry(auto_describe=False)
    metrics = ServerMetrics(registry)
    metrics.latest_unflushed.set_function(store.latest.unflushed)
    registry.register(
        FleetCollector(store.latest, store.inventory, store.incidents, settings.metrics_stale_seconds, clock)
    )
    services = Services(
        settings=settings,
        store=store,
        registry=registry,
        metrics=metrics,
        clock=clock,
        auth=Authenticator(store.tokens, settings.auth, settings.token_cache_seconds),
        ingestor=Ingestor(store.writer, settings.limits, metrics, clock),
    )
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
        await anyio.to_thread.run_sync(s.store.latest.load)
        await anyio.to_thread.run_sync(bootstrap_token, s.store.tokens, s.settings.bootstrap_token_file, s.clock)
        await hooks.start()
        if detector_factory is not None:
            detector = detector_factory(s.settings, s.store.topology)
            s.detection = DetectionLoop(s.store.stream, s.store.incidents, detector, s.metrics, listeners, s.clock)
            s.tasks.append(asyncio.create_task(_detection_loop(s)))
        s.tasks.append(asyncio.create_task(_maintenance_loop(s)))
        s.tasks.append(asyncio.create_task(_latest_flush_loop(s)))
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
            s.store.engine.dispose()

    return lifespan


def _safe_url(s: Services) -> str:
    return s.store.engine.url.render_as_string(hide_password=True)


async def _detection_loop(s: Services) -> None:
    assert s.detection is not None
    while True:
        try:
            # Catch up in chunks, then wait: a backlog after a restart drains without sleeping.
            while await anyio.to_thread.run_sync(s.detection.step):
                pass
        except Exception:
            s.metrics.detection_errors.inc()
            log.exception("detection step failed; retrying")
        await asyncio.sleep(s.settings.detection_interval_seconds)


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
        try:
            report = await anyio.to_thread.run_sync(
                lambda: s.store.maintenance.run(
                    s.clock(), st.raw_retention_seconds, st.downsample_step_seconds, st.retention_seconds
                )
            )
        except Exception:
            log.exception("store maintenance failed; retrying next interval")
            continue
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
