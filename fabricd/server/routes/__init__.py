"""One module per resource; ``ROUTERS`` is the order they are mounted in (and listed in /docs)."""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.routes import incidents, ingest, nccl, nodes, pingmesh, ports, series, system, tokens, topology

ROUTERS: tuple[APIRouter, ...] = (
    ingest.router,
    nodes.router,
    ports.router,
    series.router,
    incidents.router,
    pingmesh.router,
    nccl.router,
    topology.router,
    tokens.router,
    system.router,
)
