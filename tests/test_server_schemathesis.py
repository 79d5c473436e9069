"""schemathesis fuzzes every operation of the OpenAPI schema with a valid admin token: no 5xx, ever.

Bounded (a few examples per operation) so it stays well under a minute in CI. Token revocation is
left out: a generated id could revoke the token the fuzzer itself uses (tested in test_server_api).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from fabricd.server import db
from fabricd.server.store.storage import Storage
from tests.support.server import ServerProcess, encoded, ib_sample, make_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    data: Path = tmp_path_factory.mktemp("schemathesis") / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    _id, token = Storage.open(engine).tokens.create("admin", time.time(), note="schemathesis")
    engine.dispose()
    proc = ServerProcess(data, extra=["--log-level", "error"]).start()
    import httpx

    body, headers = encoded(make_batch("node-a", "seed", [ib_sample(time.time())]))
    httpx.post(
        f"{proc.url}/api/v1/ingest", content=body, headers={**headers, "Authorization": f"Bearer {token}"}, timeout=10
    ).raise_for_status()
    try:
        yield proc, token
    finally:
        proc.stop()


def _openapi() -> dict[str, object]:
    # The same document the server serves at /openapi.json; building the app touches no database.
    from fabricd.server.app import create_app
    from fabricd.settings import ServerSettings

    return create_app(ServerSettings(db="sqlite://")).openapi()


schema = schemathesis.openapi.from_dict(_openapi()).exclude(method="DELETE")


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case: schemathesis.Case, server: tuple[ServerProcess, str]) -> None:
    # No 5xx, and every answer matches its documented model. (Rejection of schema-violating input is
    # not asserted: the wire decoder is deliberately lenient where a value converts safely.)
    case.call_and_validate(
        base_url=server[0].url,
        headers={"Authorization": f"Bearer {server[1]}"},
        timeout=10,
        checks=[not_a_server_error, response_schema_conformance],
    )
