"""``ServiceSource``: the report's data source inside the server (``fabricd.report.source.Source``).

It calls the very route functions that serve ``/api/v1/...`` (no HTTP round trip, same filters,
same bucketing, same errors) with the caller of the report request, and hands the report the
same JSON the REST API returns. It lives here, not in ``fabricd/report/``: the report package
knows only its one-method ``Source`` and never imports the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.encoders import jsonable_encoder

from fabricd.report.source import unknown_resource
from fabricd.server.auth import Principal
from fabricd.server.routes import incidents, nccl, series
from fabricd.server.services import Services


class ServiceSource:
    """Errors are the routes' ``ApiError`` (a 404 for an unknown incident stays a JSON 404)."""

    def __init__(self, svc: Services, who: Principal) -> None:
        self.svc, self.who = svc, who

    def get(self, resource: str, **params: Any) -> Any:
        route = self._routes().get(resource)
        if route is None:
            raise unknown_resource(resource)
        return jsonable_encoder(route(**params))

    def _routes(self) -> dict[str, Callable[..., Any]]:
        svc, who, store = self.svc, self.who, self.svc.store
        return {
            "incident": lambda id: incidents.get_incident(store.incidents, who, int(id)),
            "incidents": lambda **p: incidents.list_incidents(svc, store.incidents, who, **p),
            "series": lambda **p: series.get_series(svc, store.inventory, who, **p),
            "nccl": lambda **p: nccl.nccl(svc, store.inventory, who, **p),
        }
