"""``serve(settings)``: run the central service under uvicorn until interrupted; returns an exit code."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import uvicorn

from fabricd import gctune
from fabricd.hooks.config import HookConfigError
from fabricd.server import db
from fabricd.server.app import create_app
from fabricd.server.detection import EngineDetector
from fabricd.server.shutdown import BoundedServer, Deadline
from fabricd.settings import ServerSettings, parse_listen


def serve(settings: ServerSettings) -> int:
    if (settings.tls_certfile is None) != (settings.tls_keyfile is None):
        print("fabricd: --tls-certfile and --tls-keyfile go together", file=sys.stderr)
        return 2
    if settings.detection and (problem := _rules_problem(settings)):
        print(f"fabricd: {problem}", file=sys.stderr)
        return 2
    try:
        engine = db.make_engine(settings.database_url())
    except db.SchemaError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    try:
        db.prepare(engine)  # fail here with a clear message, before uvicorn starts
    except db.SchemaError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    host, port = parse_listen(settings.listen)
    try:
        app = create_app(settings, detector_factory=EngineDetector if settings.detection else None)
    except HookConfigError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        lifespan="on",
        ssl_certfile=settings.tls_certfile,
        ssl_keyfile=settings.tls_keyfile,
        access_log=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=settings.keepalive_timeout_seconds,
    )
    server = BoundedServer(config, Deadline(settings.shutdown_timeout_seconds))
    gctune.tune_for_service()
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found installed: with the default one the process dies of it (exit 143), which systemd and
    # supervisors report as a failure. A stop that completed is a success.
    signal.signal(signal.SIGTERM, _stopped)
    server.run()
    return 0 if server.started else 1


def _stopped(_sig: int, _frame: FrameType | None) -> None:
    pass


def _rules_problem(settings: ServerSettings) -> str | None:
    """Validate the detection rules before serving: a bad file is named at start, not mid-detection."""
    from fabricd.detect.rules import RuleError, load_rules
    from fabricd.detect.signals import SIGNALS

    try:
        load_rules([settings.rules_dir] if settings.rules_dir else None, SIGNALS)
    except (RuleError, OSError) as exc:
        return f"detection rules: {exc}"
    return None
