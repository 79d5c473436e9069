"""``/api/v1/replicas``: which replica holds which partition and the correlator, read on any replica."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fabricd.server.claims import ownership
from fabricd.server.deps import Reader, Svc
from fabricd.server.replica_wiring import replica_id
from fabricd.server.routes.common import AUTH_ERRORS
from fabricd.server.services import Services

router = APIRouter(tags=["system"])


class ReplicasOut(BaseModel):
    enabled: bool = Field(description="whether this central runs as one of several replicas (replica.enabled)")
    replica: str | None = Field(description="the replica that answered (replica.id)")
    partitions: dict[str, str] = Field(description="bus partition -> the replica holding it now")
    correlator: str | None = Field(description="the replica running detection and owning the incidents")
    replicas: list[str] = Field(description="every replica with a claims session open")


@router.get(
    "/api/v1/replicas",
    response_model=ReplicasOut,
    responses=AUTH_ERRORS,
    summary="Replicas, the partitions each holds, and the correlator (PostgreSQL's locks as they are now)",
)
async def replicas(svc: Svc, _who: Reader) -> ReplicasOut:
    return await anyio.to_thread.run_sync(_read, svc)


def _read(svc: Services) -> ReplicasOut:
    if not svc.settings.replica.enabled:
        return ReplicasOut(enabled=False, replica=None, partitions={}, correlator=None, replicas=[])
    raw = svc.store.engine.raw_connection()
    try:
        cur = raw.cursor()
        now = ownership(cur, svc.settings.bus.prefix)
        cur.close()
    finally:
        raw.close()
    return ReplicasOut(
        enabled=True,
        replica=replica_id(svc.settings),
        partitions={str(p): who for p, who in now.partitions.items()},
        correlator=now.correlator,
        replicas=now.replicas,
    )
