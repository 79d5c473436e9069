"""``fabricd token create|revoke|list``: manage API tokens directly in the central's database.

Runs where the database is reachable (the central host, or with ``--db``); the running service
picks up a new or revoked token within ``token_cache_seconds``, without a restart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabricd.cli.common import add_config_option, settings_or_exit

if TYPE_CHECKING:  # the server extra is imported only when a token command runs
    from fabricd.server.store.protocols import TokenAdmin


def register(sub: Any) -> None:
    p = sub.add_parser(
        "token",
        help="create, revoke and list API tokens",
        description="Manage the bearer tokens agents and engineers use. Only a sha256 digest "
        "of each token is stored; `create` prints the token once.",
    )
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = tsub.add_parser(
        "create",
        help="create a token and print it",
        description="Create a token and print it (shown once; only its digest is stored).",
    )
    create.add_argument(
        "--role",
        required=True,
        choices=["agent", "read", "admin"],
        help="agent: ingest only; read: the REST API; admin: also ack/resolve and tokens",
    )
    create.add_argument("--node", metavar="NAME", help="bind an agent token to one node name")
    create.add_argument("--note", default="", help="a note shown in `token list` (who or what uses it)")
    revoke = tsub.add_parser(
        "revoke",
        help="revoke a token by id or by the token itself",
        description="Revoke a token by id or by the token itself; it stops working within seconds.",
    )
    revoke.add_argument("which", metavar="ID|TOKEN", help="the token id from `token list`, or the token")
    lst = tsub.add_parser(
        "list",
        help="list tokens (never the tokens themselves)",
        description="List tokens: id, role, node, note, created and revoked times (never the tokens).",
    )
    lst.add_argument("--json", action="store_true", help="JSON output for scripts")
    for q in (create, revoke, lst):
        add_config_option(q)
        q.add_argument("--db", metavar="URL", help="SQLAlchemy URL (default sqlite:///<data-dir>/fabricd.db)")
        q.add_argument("--data-dir", type=Path, metavar="DIR", help="data folder (default ./data)")
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd.extras import require

    require("server", "fabricd token")
    from fabricd.server import db
    from fabricd.server.store.records import NotFound
    from fabricd.server.store.storage import Storage
    from fabricd.settings import ServerSettings

    settings = settings_or_exit(ServerSettings, args, db=args.db, data_dir=args.data_dir)
    try:
        engine = db.make_engine(settings.database_url())
    except db.SchemaError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    try:
        db.open_existing(engine)  # never creates or migrates: a typo in --db must not make a new one
        return _ACTIONS[args.token_command](Storage.open(engine).tokens, args)
    except db.SchemaError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 1
    except NotFound as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()


def _create(tokens: TokenAdmin, args: argparse.Namespace) -> int:
    tid, token = tokens.create(args.role, time.time(), args.node, args.note)
    print(token)
    bound = f" for node {args.node}" if args.node else ""
    print(f"token {tid} ({args.role}{bound}) created; it is shown only once", file=sys.stderr)
    return 0


def _revoke(tokens: TokenAdmin, args: argparse.Namespace) -> int:
    info = tokens.revoke(args.which.strip(), time.time())
    print(f"token {info.id} ({info.role}) revoked")
    return 0


def _list(store: TokenAdmin, args: argparse.Namespace) -> int:
    tokens = store.all()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": i.id,
                        "role": i.role,
                        "node": i.node,
                        "note": i.note,
                        "created_ts": i.created_ts,
                        "revoked_ts": i.revoked_ts,
                    }
                    for i in tokens
                ],
                indent=2,
            )
        )
        return 0
    from fabricd.timeparse import iso

    print(f"{'ID':>4}  {'ROLE':<6} {'NODE':<20} {'CREATED':<21} {'REVOKED':<21} NOTE")
    for i in tokens:
        print(f"{i.id:>4}  {i.role:<6} {i.node or '-':<20} {iso(i.created_ts):<21} {iso(i.revoked_ts):<21} {i.note}")
    return 0


_ACTIONS: dict[str, Callable[[TokenAdmin, argparse.Namespace], int]] = {
    "create": _create,
    "revoke": _revoke,
    "list": _list,
}
