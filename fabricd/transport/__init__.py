"""Agent -> central transport: batching, on-disk spool, retries, idempotent re-sends."""

from fabricd.transport.transport import Transport

__all__ = ["Transport"]
