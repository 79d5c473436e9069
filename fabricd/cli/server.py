"""``fabricd server``: the central service (ingest, storage, detection, REST API, /metrics)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fabricd.cli.common import add_config_option, settings_or_exit
from fabricd.settings import DEFAULT_LISTEN


def register(sub: Any) -> None:
    p = sub.add_parser(
        "server",
        help="run the central service",
        description="Run the central service: ingest from agents, storage, detection, REST API "
        "(/docs), /metrics, /healthz. The database defaults to SQLite in the data folder.",
    )
    add_config_option(p)
    p.add_argument("--listen", metavar="HOST:PORT", help=f"address to serve on (default {DEFAULT_LISTEN})")
    p.add_argument(
        "--db",
        metavar="URL",
        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db (default sqlite:///<data-dir>/fabricd.db)",
    )
    p.add_argument("--data-dir", type=Path, metavar="DIR", help="data folder, created on first start (default ./data)")
    p.add_argument(
        "--no-auth",
        dest="auth",
        action="store_false",
        default=None,
        help="accept unauthenticated ingest and API calls (demo and local tests only)",
    )
    p.add_argument(
        "--metrics-fleet-view",
        dest="metrics_fleet_view",
        action="store_true",
        default=None,
        help="also export every node's series on /metrics (small sites; capped by metrics_fleet_max_series)",
    )
    p.add_argument("--tls-certfile", type=Path, metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-keyfile", type=Path, metavar="FILE", help="private key for --tls-certfile (PEM)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd.extras import require

    require("server", "fabricd server")
    from fabricd.server.main import serve
    from fabricd.settings import ServerSettings

    settings = settings_or_exit(
        ServerSettings,
        args,
        listen=args.listen,
        db=args.db,
        data_dir=args.data_dir,
        auth=args.auth,
        tls_certfile=args.tls_certfile,
        tls_keyfile=args.tls_keyfile,
        metrics_fleet_view=args.metrics_fleet_view,
    )
    if settings.bus.url:
        require("bus", "bus.url (consuming from NATS)")
    if settings.rules_dir is None:
        settings = settings.model_copy(update={"rules_dir": shipped_rules()})
    return serve(settings)


def shipped_rules() -> Path | None:
    """The detection rules inside the package (``fabricd/rules``, a link to the checkout's ``rules/``
    that the wheel carries as files): found the same from a checkout and from ``pip install``."""
    import fabricd

    packaged = Path(fabricd.__file__).resolve().parent / "rules" / "detection"
    return packaged if packaged.is_dir() else None
