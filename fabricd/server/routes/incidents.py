"""``/api/v1/incidents``: list, detail (evidence, timeline, localization), ack and resolve."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from fabricd.model import IncidentKind, IncidentState
from fabricd.server.api_models import IncidentAction, IncidentOut, IncidentSummary
from fabricd.server.auth import Principal
from fabricd.server.deps import Admin, IncidentActionsDep, IncidentsDep, Reader, Svc, when
from fabricd.server.errors import ApiError, not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.records import Conflict, IncidentRecord, NotFound
from fabricd.timeparse import HELP

router = APIRouter(tags=["incidents"])
IncidentId = Annotated[int, Path(ge=1, le=2**62, description="the incident's id")]
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"description": "the incident is resolved; it cannot be acknowledged"}
}


@router.get(
    "/api/v1/incidents", response_model=list[IncidentSummary], responses=AUTH_ERRORS, summary="Incidents, newest first"
)
def list_incidents(
    svc: Svc,
    incidents: IncidentsDep,
    _who: Reader,
    state: Annotated[IncidentState | None, Query(description="open, acked or resolved")] = None,
    kind: Annotated[IncidentKind | None, Query()] = None,
    since: Annotated[str | None, Query(max_length=64, description=f"updated since; {HELP}")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    job: Annotated[
        str | None, Query(min_length=1, max_length=128, description="only incidents hurting this job")
    ] = None,
) -> list[IncidentSummary]:
    rows = incidents.query(
        state.value if state else None, kind.value if kind else None, when(svc, "since", since), limit, job
    )
    return [IncidentSummary.of(r) for r in rows]


@router.get(
    "/api/v1/incidents/{incident_id}",
    response_model=IncidentOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One incident with evidence, localization and timeline",
)
def get_incident(incidents: IncidentsDep, _who: Reader, incident_id: IncidentId) -> IncidentOut:
    try:
        return IncidentOut.of(incidents.get(incident_id))
    except NotFound as exc:
        raise not_found(str(exc)) from exc


@router.post(
    "/api/v1/incidents/{incident_id}/ack",
    response_model=IncidentOut,
    responses={**AUTH_ERRORS, **NOT_FOUND, **_CONFLICT},
    summary="Acknowledge (admin)",
)
def ack(
    svc: Svc,
    incidents: IncidentActionsDep,
    who: Admin,
    incident_id: IncidentId,
    action: Annotated[IncidentAction | None, Body()] = None,
) -> IncidentOut:
    act = action or IncidentAction()
    return _act(lambda: incidents.ack(incident_id, _actor(who, act), svc.clock(), act.note))


@router.post(
    "/api/v1/incidents/{incident_id}/resolve",
    response_model=IncidentOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="Resolve (admin)",
)
def resolve(
    svc: Svc,
    incidents: IncidentActionsDep,
    who: Admin,
    incident_id: IncidentId,
    action: Annotated[IncidentAction | None, Body()] = None,
) -> IncidentOut:
    act = action or IncidentAction()
    return _act(lambda: incidents.resolve(incident_id, _actor(who, act), svc.clock(), act.note))


def _actor(who: Principal, act: IncidentAction) -> str:
    return act.by or who.name


def _act(do: Callable[[], IncidentRecord]) -> IncidentOut:
    try:
        row = do()
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    except Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from exc
    return IncidentOut.of(row)
