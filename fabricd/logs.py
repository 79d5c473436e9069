"""Operator-readable logs: one line per event, ``key=value`` (logfmt) or JSON.

    ts=2026-11-29T15:05:37.123Z level=info logger=fabricd.agent msg="batch sent" samples=412

Callers pass structured fields with ``extra={"fields": {...}}`` or the ``event()`` helper.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return json.dumps(text)
    return text


def _timestamp(record: logging.LogRecord) -> str:
    secs = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{secs}.{int(record.msecs):03d}Z"


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info).replace("\n", " | ")
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


def setup(level: str = "info", fmt: str = "logfmt") -> None:
    """Configure the root logger once, in ``main()``; uvicorn's loggers follow it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # httpx logs every request at info: one line per batch sent is noise; fabricd logs what matters.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with structured ``fields`` (kept as separate keys in logfmt/JSON)."""
    logger.log(level, msg, extra={"fields": fields})
