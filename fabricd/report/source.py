"""Where a report's data comes from: one method, ``get(resource, **params) -> JSON``.

The answer is always the JSON the REST API returns for that resource, so the report code sees one
shape whichever side it runs on:

- ``RestSource``: the CLI, over HTTP, through the on-call client (``fabricd.cli.oncall.ApiClient``);
- ``fabricd.server.report_source.ServiceSource``: the server's report route, in-process, calling the
  very route functions that serve ``/api/v1/...`` (no HTTP round trip, same filters, same bucketing,
  same errors). It lives in the server: this package never imports the server.

Resources and their parameters (the query parameters of the matching route):

    incident   id                                                     GET /api/v1/incidents/{id}
    incidents  state, kind, since, limit                              GET /api/v1/incidents
    series     node, device, port, counter, source, since, until, step, limit   GET /api/v1/series
    nccl       node, op, since, limit                                 GET /api/v1/nccl
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fabricd.cli.oncall import ApiClient

RESOURCES = ("incident", "incidents", "series", "nccl")


class Source(Protocol):
    def get(self, resource: str, **params: Any) -> Any: ...


def unknown_resource(resource: str) -> ValueError:
    return ValueError(f"unknown report resource {resource!r}; known: {', '.join(RESOURCES)}")


class RestSource:
    """Over HTTP: errors are the client's (``ServerError`` with the server's JSON error, ``Unreachable``)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def get(self, resource: str, **params: Any) -> Any:
        if resource == "incident":
            return self.client.call("GET", f"/api/v1/incidents/{int(params['id'])}")
        if resource not in RESOURCES:
            raise unknown_resource(resource)
        return self.client.call("GET", f"/api/v1/{resource}", params)
