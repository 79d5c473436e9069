"""Where a report's data comes from: one method, ``get(resource, **params) -> JSON``.

The answer is always the JSON the REST API returns for that resource, so the report code sees one
shape whichever side it runs on:

- ``RestSource``: the CLI, over HTTP, through the on-call client (``fabricd.cli.oncall.ApiClient``);
- ``ServiceSource``: the server's report route, in-process, calling the very route functions that
  serve ``/api/v1/...`` on the store (no HTTP round trip, same filters, same bucketing, same errors).

Resources and their parameters (the query parameters of the matching route):

    incident   id                                                     GET /api/v1/incidents/{id}
    incidents  state, kind, since, limit                              GET /api/v1/incidents
    series     node, device, port, counter, source, since, until, step, limit   GET /api/v1/series
    nccl       node, op, since, limit                                 GET /api/v1/nccl
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fabricd.cli.oncall import ApiClient
    from fabricd.server.auth import Principal
    from fabricd.server.services import Services

RESOURCES = ("incident", "incidents", "series", "nccl")


class Source(Protocol):
    def get(self, resource: str, **params: Any) -> Any: ...


def _unknown(resource: str) -> ValueError:
    return ValueError(f"unknown report resource {resource!r}; known: {', '.join(RESOURCES)}")


class RestSource:
    """Over HTTP: errors are the client's (``ServerError`` with the server's JSON error, ``Unreachable``)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def get(self, resource: str, **params: Any) -> Any:
        if resource == "incident":
            return self.client.call("GET", f"/api/v1/incidents/{int(params['id'])}")
        if resource not in RESOURCES:
            raise _unknown(resource)
        return self.client.call("GET", f"/api/v1/{resource}", params)


class ServiceSource:
    """In the server: the route functions themselves, with the caller of the report request.

    Errors are the routes' ``ApiError`` (a 404 for an unknown incident stays a JSON 404)."""

    def __init__(self, svc: Services, who: Principal) -> None:
        self.svc, self.who = svc, who

    def get(self, resource: str, **params: Any) -> Any:
        route = self._routes().get(resource)
        if route is None:
            raise _unknown(resource)
        return _json(route(**params))

    def _routes(self) -> dict[str, Callable[..., Any]]:
        from fabricd.server.routes import incidents, nccl, series

        svc, who = self.svc, self.who
        return {
            "incident": lambda id: incidents.get_incident(svc, who, int(id)),
            "incidents": lambda **p: incidents.list_incidents(svc, who, **p),
            "series": lambda **p: series.get_series(svc, who, **p),
            "nccl": lambda **p: nccl.nccl(svc, who, **p),
        }


def _json(value: Any) -> Any:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(value)
