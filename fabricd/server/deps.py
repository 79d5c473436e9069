"""Route dependencies as ``Annotated`` aliases: the services, the caller, the store's roles (each typed
by the Protocol a route needs, ``store/protocols.py``), parsed time parameters."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fabricd.server.auth import Principal, require_admin, require_read
from fabricd.server.errors import ApiError
from fabricd.server.services import Services
from fabricd.server.store import protocols as p
from fabricd.timeparse import parse_time

_bearer = HTTPBearer(auto_error=False, description="a token from `fabricd token create`")


# Every provider here is ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a
# worker-thread hop per dependency per request (the ingest route took three, and the hops' handoffs
# were a tenth of the event loop's GIL time with 8 agents posting, py-spy --gil; CHANGELOG). These
# only look up attributes; the one that may query the database (a token not in the cache) hops
# explicitly.
async def services(request: Request) -> Services:
    return request.app.state.services


Svc = Annotated[Services, Depends(services)]


async def caller(svc: Svc, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    return await principal(svc, creds.credentials if creds else None)


async def principal(svc: Services, token: str | None) -> Principal:
    known = svc.auth.known(token)
    return known if known is not None else await run_in_threadpool(svc.auth.authenticate, token)


Caller = Annotated[Principal, Depends(caller)]


async def reader(who: Caller) -> Principal:
    return require_read(who)


async def admin(who: Caller) -> Principal:
    return require_admin(who)


Reader = Annotated[Principal, Depends(reader)]
Admin = Annotated[Principal, Depends(admin)]


# One provider per role a route may take, typed by its Protocol: mypy checks that each role meets
# every Protocol it is handed out as.
async def latest(svc: Svc) -> p.LatestReader:
    return svc.store.latest


async def nodes(svc: Svc) -> p.NodeReader:
    return svc.store.inventory


async def series(svc: Svc) -> p.SeriesReader:
    return svc.store.inventory


async def incidents(svc: Svc) -> p.IncidentReader:
    return svc.store.incidents


async def incident_counts(svc: Svc) -> p.IncidentCounter:
    return svc.store.incidents


async def incident_actions(svc: Svc) -> p.IncidentActions:
    return svc.store.incidents


async def tokens(svc: Svc) -> p.TokenAdmin:
    return svc.store.tokens


async def topology(svc: Svc) -> p.TopologyStore:
    return svc.store.topology


async def routed_topology(svc: Svc) -> p.TopologyReader:
    return svc.routed


async def paths(svc: Svc) -> p.PathReader:
    return svc.store.paths


async def jobs(svc: Svc) -> p.JobReader:
    return svc.store.jobs


async def stream(svc: Svc) -> p.SampleSource:
    return svc.store.stream


LatestDep = Annotated[p.LatestReader, Depends(latest)]
NodesDep = Annotated[p.NodeReader, Depends(nodes)]
SeriesDep = Annotated[p.SeriesReader, Depends(series)]
IncidentsDep = Annotated[p.IncidentReader, Depends(incidents)]
IncidentCountsDep = Annotated[p.IncidentCounter, Depends(incident_counts)]
IncidentActionsDep = Annotated[p.IncidentActions, Depends(incident_actions)]
TokensDep = Annotated[p.TokenAdmin, Depends(tokens)]
TopologyDep = Annotated[p.TopologyReader, Depends(topology)]
TopologyStoreDep = Annotated[p.TopologyStore, Depends(topology)]
RoutedTopologyDep = Annotated[p.TopologyReader, Depends(routed_topology)]
PathsDep = Annotated[p.PathReader, Depends(paths)]
StreamDep = Annotated[p.SampleSource, Depends(stream)]
JobsDep = Annotated[p.JobReader, Depends(jobs)]


def when(svc: Services, name: str, value: str | None) -> float | None:
    """A time query parameter (RFC 3339, -15m, now, epoch) -> seconds, or a 422 naming it."""
    if value is None:
        return None
    try:
        return parse_time(value, svc.clock())
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"query parameter {name!r}: {exc}", field=name) from exc
