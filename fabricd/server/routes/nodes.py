"""``/api/v1/nodes``: each agent's last batch, version and collectors' health."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from fabricd.server.api_models import NodeOut
from fabricd.server.deps import NodesDep, Reader, Svc
from fabricd.server.errors import not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.records import NotFound

router = APIRouter(tags=["nodes"])


@router.get("/api/v1/nodes", response_model=list[NodeOut], responses=AUTH_ERRORS, summary="Every node")
def list_nodes(svc: Svc, nodes: NodesDep, _who: Reader) -> list[NodeOut]:
    now, stale = svc.clock(), svc.settings.node_stale_seconds
    return [NodeOut.of(n, now, stale) for n in nodes.nodes()]


@router.get("/api/v1/nodes/{node}", response_model=NodeOut, responses={**AUTH_ERRORS, **NOT_FOUND}, summary="One node")
def get_node(svc: Svc, nodes: NodesDep, _who: Reader, node: Annotated[str, Path(max_length=128)]) -> NodeOut:
    try:
        n = nodes.node(node)
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    return NodeOut.of(n, svc.clock(), svc.settings.node_stale_seconds)
