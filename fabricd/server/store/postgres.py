"""PostgreSQL's side of the raw statements (psycopg 3, ``%s`` placeholders).

Points and latest values go in one statement with one array parameter per column (``ArrayRows``).
A second bulk path (``COPY`` into time partitions, issue 18) is another ``RowWriter`` here: the
writer runs whatever ``STATEMENTS.insert_points`` is, and needs only the batch's last point id
after it (``lastval()``: the id sequence's value in this session).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fabricd.server.store.sql import POINT_COLUMNS, SET_LATEST, statements


class ArrayRows:
    """One statement for all rows, one array parameter per column (``unnest``).

    psycopg parses every query text longer than 4 KiB again on each execute (its query cache
    skips long texts), which made multi-row VALUES slower than executemany there; arrays keep the
    text short and constant, and psycopg dumps each list in C.
    """

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            cur.execute(self.sql, [list(column) for column in zip(*rows, strict=True)])


def _series_identity(ids: list[int]) -> tuple[str, Sequence[Any]]:
    # One array parameter: psycopg re-parses long query texts, and the text stays constant.
    return "SELECT id, node, source, device, port, counter, name, unit, kind, labels FROM series WHERE id = ANY(%s)", (
        ids,
    )


# %b: binary parameters; psycopg dumps a list in text form element by element with a regex.
_ARRAYS = "unnest(%b::bigint[], %b::float8[], %b::float8[], %b::float8[], %b::text[], %b::float8[])"

STATEMENTS = statements(
    "%s",
    insert_points=ArrayRows(f"INSERT INTO points ({POINT_COLUMNS}) SELECT v.*, 0.0 FROM {_ARRAYS} AS v"),
    update_latest=ArrayRows(SET_LATEST.format(source=f"{_ARRAYS} AS v (id, ts, value, rate, status, since)")),
    last_point_id="SELECT lastval()",
    series_identity=_series_identity,
    serial_latest_writes=False,
)
