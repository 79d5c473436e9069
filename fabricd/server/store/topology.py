"""The uploaded topology documents, by name (ORM: one row read or replaced at a time)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import sessionmaker

from fabricd.server import tables as t
from fabricd.server.store.records import NotFound, TopologyRecord
from fabricd.server.store.sql import Database


class Topologies:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = sessionmaker(db.engine, expire_on_commit=False)

    def put(self, doc: dict[str, Any], now: float, name: str = "default") -> None:
        with self.db.write_lock, self.sessions.begin() as s:
            row = s.get(t.Topology, name)
            if row is None:
                s.add(t.Topology(name=name, updated_ts=now, doc=doc))
            else:
                row.doc, row.updated_ts = doc, now

    def get(self, name: str = "default") -> TopologyRecord:
        with self.sessions() as s:
            row = s.get(t.Topology, name)
            if row is None:
                raise NotFound(f"no topology named {name!r} has been uploaded (PUT /api/v1/topology)")
            return TopologyRecord(row.name, row.updated_ts, row.doc)
