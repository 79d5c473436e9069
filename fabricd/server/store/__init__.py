"""The central's store, split by role. Each role is one module behind a small Protocol (``protocols.py``):

    writer.py       ingest: batches in, one group commit at a time            raw DBAPI
    sqlite.py,      the per-database statements of the raw roles
    postgres.py     (``sql.py`` builds the text common to both)
    stream.py       the sample stream: tail, cursor, deliveries by node       raw DBAPI
    identities.py   series identities by id, shared by stream and latest      raw DBAPI
    latest.py       latest values: in memory, written back every few seconds  raw DBAPI
    inventory.py    nodes, collectors' health, series and their points        Core
    incidents.py    the incident lifecycle                                    ORM
    tokens.py       API tokens (their hashing lives in ``server/auth.py``)    ORM
    topology.py     uploaded topology documents                               ORM
    maintenance.py  downsampling and retention                                Core
    records.py      the typed values the roles return, and their errors
    storage.py      ``Storage.open(engine)``: every role on one engine and one write lock

One way of talking to the database per role, chosen by what the role does:

- **raw DBAPI** for the hot path (ingest, the stream, latest values): tens of thousands of points a
  second, where SQLAlchemy's per-statement compile and per-row processing cost more than the
  database's own work (docs/storage.md has the measurements);
- **SQLAlchemy Core** for set-based statements whose results become records (the inventory's
  reads, maintenance's bulk deletes and inserts): composable queries, nothing to track;
- **the ORM** where a role reads one row, changes it and writes it back (incidents, tokens, the
  topology): the session's unit of work keeps that one transaction.

Data flows one way. The writer knows nothing of its readers: after each commit it hands the
stored points (``records.Committed``) to the listeners subscribed to it, the latest values always
and the stream when detection runs. Nothing here is imported by ``fabricd/detect``; the detection
loop (``server/detection.py``) reads the stream and writes incidents through their Protocols.

Seams left for what comes next: a second bulk writer (PostgreSQL ``COPY`` into time partitions)
is another ``sql.RowWriter`` in ``postgres.py``, or another writer announcing ``Committed``
batches to the same listeners (a bus consumer); the stream hands out ``Delivery(node, samples)``
in ingest order, so per-node watermarks and a read per node set or partition sit on top of it.

This ``__init__`` imports nothing, so ``server/auth.py`` (which ``tokens.py`` uses for hashing) can
import ``records`` and ``protocols`` without a cycle.
"""
