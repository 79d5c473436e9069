"""One module per resource; ``ROUTERS`` is the order they are mounted in (and listed in /docs)."""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.routes import (
    incidents,
    ingest,
    jobs,
    nccl,
    nodes,
    paths,
    pingmesh,
    ports,
    replicas,
    series,
    system,
    tokens,
    topology,
)

ROUTERS: tuple[APIRouter, ...] = (
    ingest.router,
    nodes.router,
    ports.router,
    series.router,
    incidents.router,
    jobs.router,
    pingmesh.router,
    nccl.router,
    topology.router,
    paths.router,
    tokens.router,
    system.router,
    replicas.router,
)
