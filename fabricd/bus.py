"""The bus between agents and the central: names both sides agree on (NATS JetStream, ``nats-py``).

An agent publishes each encoded batch, exactly the bytes it would POST, to the subject
``<prefix>.samples.<partition>.<node>``; the partition is a stable hash of the node over a fixed
``partitions`` count, so a central replica can own a set of partitions (one subject filter each)
and a node's batches stay in order within one. ``Nats-Msg-Id`` is the batch id: JetStream drops a
second publish of the same id within its duplicate window (the stream's ``duplicate_window``), so a
retry after a lost acknowledgement stores nothing twice; past that window the central's own batch
id check does the same (a retried batch is acknowledged, not stored again).

The stream keeps messages until the central acknowledges them (work-queue retention, one durable
consumer): an outage of the central loses nothing, and an outage of NATS is an outage of the
central as far as the agent is concerned (it spools, exactly as with HTTP).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

DEFAULT_PARTITIONS = 16
DUPLICATE_WINDOW_SECONDS = 600.0  # longer than an agent's whole retry backoff (max 5 min)
# Headers carried on each message: the HTTP ingest's, so the central decodes both alike.
CONTENT_TYPE, CONTENT_ENCODING, BATCH_ID, MSG_ID = (
    "Content-Type",
    "Content-Encoding",
    "X-Fabricd-Batch-Id",
    "Nats-Msg-Id",
)


@dataclass(frozen=True)
class BusNames:
    """Stream, subjects and consumer of one fabricd deployment on one NATS (``prefix``: several
    deployments, or tests, can share a server)."""

    prefix: str = "fabricd"
    partitions: int = DEFAULT_PARTITIONS

    @property
    def stream(self) -> str:
        return f"{self.prefix.upper().replace('.', '_')}_SAMPLES"

    @property
    def subjects(self) -> str:
        return f"{self.prefix}.samples.>"

    @property
    def durable(self) -> str:
        return f"{self.prefix.replace('.', '_')}-central"

    def partition_subjects(self, partition: int) -> str:
        """One partition's subjects: what a replica that claimed it consumes (fabricd/server/replica.py)."""
        return f"{self.prefix}.samples.{partition}.>"

    def partition_durable(self, partition: int) -> str:
        return f"{self.durable}-p{partition}"

    def partition(self, node: str) -> int:
        # crc32, not hash(): the same partition in every process and release.
        return zlib.crc32(node.encode()) % self.partitions

    def subject(self, node: str) -> str:
        return f"{self.prefix}.samples.{self.partition(node)}.{node}"
