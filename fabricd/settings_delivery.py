"""Agent-side delivery settings: the spool, the NATS bus, the HTTP transport (docs/transport.md).

Sections of ``fabricd.settings.AgentSettings`` (and ``BusSettings`` of ``ServerSettings``), kept
apart so that module stays small; ``fabricd.settings`` re-exports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import field_validator

from fabricd.settings_base import Strict as _Strict
from fabricd.settings_base import doc as _doc


class SpoolSettings(_Strict):
    """On-disk spool used while the central service is unreachable (docs/transport.md)."""

    dir: Path | None = _doc(None, "Spool folder (default: <data_dir>/spool); one fsync'ed file per batch.")
    # 256 MiB holds about an hour of a busy node's telemetry at a 1 s interval; past it the
    # oldest batches are dropped (counted and reported), never the agent.
    max_bytes: int = _doc(
        256 * 1024 * 1024,
        "Spool size bound in bytes; past it the oldest batches are dropped and counted "
        "(256 MiB: about an hour of a busy node at a 1 s interval).",
        gt=0,
    )
    # Backlog drain rate, so a long outage does not starve live data or flood the central.
    drain_batches_per_second: float = _doc(
        20.0, "Rate at which the backlog is re-sent after an outage, so live data and the central keep up.", gt=0
    )


class BusSettings(_Strict):
    """NATS JetStream between agents and the central (fabricd/bus.py, docs/transport.md)."""

    url: str = _doc(
        "",
        "nats://HOST:PORT. Agent: publish batches there instead of POSTing them to the central. "
        "Central: also consume what agents publish. Empty: HTTP only.",
    )
    prefix: str = _doc("fabricd", "Subject prefix and stream name stem (several deployments on one NATS).")
    partitions: int = _doc(16, "Fixed partition count of the subjects (the same on agents and central).", ge=1)

    @field_validator("url")
    @classmethod
    def _nats_url(cls, v: str) -> str:
        if v and not v.startswith(("nats://", "tls://")):
            raise ValueError("must be a nats:// or tls:// URL, or empty")
        return v

    @field_validator("prefix")
    @classmethod
    def _token(cls, v: str) -> str:
        if not v or any(c in v for c in " .*>\t"):
            raise ValueError("must be one NATS subject token (no spaces, dots, * or >)")
        return v


class TransportSettings(_Strict):
    """Batching and delivery to the central service (docs/transport.md, docs/wire-format.md)."""

    batch_max_samples: int = _doc(5000, "A batch is sent when it holds this many samples ...", gt=0)
    # 0: a scrape is sent as soon as it ends. The central evaluates a moment only once every node
    # delivered it (fabricd.detect.settle), so each second a scrape waits in a batch delays every
    # incident; and one scrape per interval leaves nothing to gather within a second anyway.
    batch_max_seconds: float = _doc(
        0.0, "... or when its first sample has waited this long (0: at the end of each scrape).", ge=0
    )
    timeout_seconds: float = _doc(10.0, "Timeout of one send to the central.", gt=0)
    # httpx's default (5 s) equals uvicorn's idle timeout: an agent sending every 5 s reused its
    # connection just as the central closed it, and the send failed (ReadError, resent 0.4 s later).
    # A client must give up an idle connection before the server does; 55 s is under the central's
    # 75 s and under the 60 s idle timeout of common load balancers (AWS ALB, nginx upstreams).
    keepalive_seconds: float = _doc(
        55.0,
        "An idle connection to the central is reused for this long; keep it under the central's "
        "keepalive_timeout_seconds and any proxy's idle timeout.",
        ge=0,
    )
    backoff_initial_seconds: float = _doc(0.5, "First retry delay after a failed send (full jitter).", gt=0)
    backoff_max_seconds: float = _doc(30.0, "Longest retry delay; the delay doubles up to it.", gt=0)
    compress: bool = _doc(True, "gzip each batch (Content-Encoding: gzip).")
    encoding: Literal["msgpack", "json"] = _doc("msgpack", "Body encoding of a batch.")
    ca_file: Path | None = _doc(None, "PEM bundle of the CA that signed the central's certificate (https://).")
    verify_tls: bool = _doc(True, "Verify the central's TLS certificate; false for labs only.")
    # 3 is this release's; 2 is what the previous release wrote, 1 the one before.
    wire_version: int = _doc(
        3,
        "Wire format version the agent writes: 3 (this release), or 2 while the central still runs "
        "the previous release (docs/wire-format.md).",
    )

    @field_validator("wire_version")
    @classmethod
    def _writable(cls, v: int) -> int:
        from fabricd.wire import ENCODERS

        if v not in ENCODERS:
            raise ValueError(
                f"must be one of {', '.join(map(str, sorted(ENCODERS)))} (the wire versions fabricd writes)"
            )
        return v
