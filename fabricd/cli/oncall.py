"""On-call commands talking to the central's REST API: status, incidents, incident, ports, ack, resolve.

Readable tables by default, ``--json`` for scripts. Exit codes scripts can rely on:
0 ok, 1 the server answered with an error (not found, unauthorized, ...), 2 usage, 3 cannot reach it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from fabricd import units
from fabricd.settings import DEFAULT_LISTEN

EXIT_OK, EXIT_SERVER, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DEFAULT_SERVER = f"http://{DEFAULT_LISTEN}"


class ServerError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Unreachable(Exception):
    pass


class ApiClient:
    """The one seam to the server: ``call(method, path, params, body) -> JSON``."""

    def __init__(self, server: str, token: str, timeout: float) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout)

    def call(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        import httpx

        clean = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            resp = self._http.request(method, path, params=clean, json=body)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach {self._http.base_url}: {exc}") from exc
        if resp.status_code >= 400:
            raise _server_error(resp.status_code, resp.text)
        return resp.json()

    def close(self) -> None:
        self._http.close()


def _server_error(status: int, text: str) -> ServerError:
    try:
        body = json.loads(text)
        return ServerError(status, str(body.get("error", "error")), str(body.get("message", text)))
    except (ValueError, AttributeError):
        return ServerError(status, "error", text[:500])


ClientFactory = Callable[[str, str, float], ApiClient]
CLIENT_FACTORY: ClientFactory = ApiClient


def common_parser() -> argparse.ArgumentParser:
    """The flags every command that talks to the central takes (--server, --token, --timeout, --json)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=os.environ.get("FABRICD_SERVER", DEFAULT_SERVER),
        help=f"central service URL (env FABRICD_SERVER, default {DEFAULT_SERVER})",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("FABRICD_TOKEN", ""),
        help="bearer token (env FABRICD_TOKEN); a read token, admin for ack/resolve",
    )
    common.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server")
    common.add_argument("--json", action="store_true", help="print the server's JSON (for scripts)")
    return common


def register(sub: Any) -> None:
    common = common_parser()
    p = sub.add_parser(
        "status",
        parents=[common],
        help="fleet summary: nodes, stale agents, open incidents",
        description="Fleet summary: nodes, stale agents, open incidents.",
    )
    p.set_defaults(func=runner(cmd_status))
    p = sub.add_parser(
        "incidents", parents=[common], help="list incidents, newest first", description="List incidents, newest first."
    )
    p.add_argument("--open", action="store_true", help="only open (unacknowledged) incidents")
    p.add_argument("--state", choices=["open", "acked", "resolved"], help="only incidents in this state")
    p.add_argument("--kind", help="only this kind (congestion, packet_loss, hol_blocking, ...)")
    p.add_argument("--since", help="updated since (RFC 3339 or -2h)")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p.add_argument("--job", help="only incidents that hurt this job (its id, see `fabricd jobs`)")
    p.set_defaults(func=runner(cmd_incidents))
    p = sub.add_parser(
        "incident",
        parents=[common],
        help="one incident: affected, evidence, localization, timeline, next checks",
        description="One incident: what is affected, the evidence against its thresholds, the candidates by score, the timeline and what to check next.",
    )
    p.add_argument("id", type=int, help="incident id (see `fabricd incidents`)")
    p.set_defaults(func=runner(cmd_incident))
    p = sub.add_parser(
        "ports",
        parents=[common],
        help="hottest ports: rates, errors, pause fraction",
        description="Hottest ports: rates, errors, pause fraction.",
    )
    p.add_argument("--top", type=int, default=20, help="how many ports (default 20)")
    p.add_argument("--node", help="only this node")
    p.add_argument(
        "--sort",
        default="throughput",
        choices=["throughput", "utilization", "errors", "pause", "xmit_wait", "name"],
        help="order by this column, hottest first (default throughput)",
    )
    p.add_argument("--state", help="only ports in this state (ACTIVE, down)")
    p.set_defaults(func=runner(cmd_ports))
    for verb in ("ack", "resolve"):
        p = sub.add_parser(
            verb,
            parents=[common],
            help=f"{verb} an incident (admin token)",
            description=f"{verb.capitalize()} an incident; needs an admin token.",
        )
        p.add_argument("id", type=int, help="incident id (see `fabricd incidents`)")
        p.add_argument("--note", default="", help="why (kept in the incident's timeline)")
        p.add_argument("--by", help="who (default: the token's name)")
        p.set_defaults(func=runner(cmd_ack if verb == "ack" else cmd_resolve))


Command = Callable[[ApiClient, argparse.Namespace], Any]


def runner(command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        client = CLIENT_FACTORY(args.server, args.token, args.timeout)
        try:
            data = command(client, args)
        except Unreachable as exc:
            print(f"fabricd: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        except ServerError as exc:
            print(f"fabricd: server said {exc.status} {exc.code}: {exc.message}", file=sys.stderr)
            return EXIT_SERVER
        finally:
            client.close()
        if args.json:
            print(json.dumps(data, indent=2))
        return EXIT_OK

    return run


def _console() -> Any:
    from rich.console import Console

    # Piped output would be cut to 80 columns; a wide table wraps better in a pager or a log.
    return Console(width=None if sys.stdout.isatty() else 160)


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # values from the fleet are text, never markup
    return table


def cmd_status(client: ApiClient, args: argparse.Namespace) -> Any:
    status = client.call("GET", "/api/v1/status")
    nodes = client.call("GET", "/api/v1/nodes")
    if args.json:
        return {"status": status, "nodes": nodes}
    from fabricd.timeparse import iso

    con = _console()
    sev = ", ".join(f"{k} {v}" for k, v in sorted(status["incidents_by_severity"].items())) or "none"
    con.print(
        f"nodes {status['nodes']} (stale {status['nodes_stale']}, unhealthy {status['nodes_unhealthy']}) · "
        f"series {status['series']} · incidents open {status['incidents_open']}, "
        f"acked {status['incidents_acked']} ({sev})"
    )
    rows = [
        [
            n["node"],
            n["agent_version"],
            iso(n["last_seen"]),
            f"{n['last_seen_age_seconds']:.0f}s",
            "yes" if n["healthy"] else "NO",
            _collectors(n["collectors"]),
        ]
        for n in nodes
    ]
    con.print(_table("Nodes", ["node", "agent", "last seen", "age", "healthy", "collectors"], rows))
    return None


def _collectors(cols: list[dict[str, Any]]) -> str:
    return " ".join(f"{c['collector']}:{'ok' if c['success'] else 'FAIL'}" for c in cols) or "-"


def cmd_incidents(client: ApiClient, args: argparse.Namespace) -> Any:
    state = "open" if args.open else args.state
    rows = client.call(
        "GET",
        "/api/v1/incidents",
        {"state": state, "kind": args.kind, "since": args.since, "limit": args.limit, "job": args.job},
    )
    if args.json:
        return rows
    from fabricd.timeparse import iso

    table = [
        [str(r["id"]), r["state"], r["severity"], r["kind"], r["element"], iso(r["started_ts"]), r["summary"]]
        for r in rows
    ]
    _console().print(
        _table(f"Incidents ({len(rows)})", ["id", "state", "severity", "kind", "element", "started", "summary"], table)
    )
    return None


def cmd_incident(client: ApiClient, args: argparse.Namespace) -> Any:
    inc = client.call("GET", f"/api/v1/incidents/{args.id}")
    if args.json:
        return inc
    _print_incident(inc)
    return None


def _print_incident(inc: dict[str, Any]) -> None:
    from fabricd.cli.incident_page import render

    sys.stdout.write(render(inc))


def cmd_ports(client: ApiClient, args: argparse.Namespace) -> Any:
    rows = client.call(
        "GET", "/api/v1/ports", {"limit": args.top, "node": args.node, "sort": args.sort, "state": args.state}
    )
    if args.json:
        return rows
    table = [
        [
            r["node"],
            r["device"],
            r["port"] or "-",
            r["state"] or "-",
            units.throughput(r["rx_bytes_per_second"]),
            units.throughput(r["tx_bytes_per_second"]),
            units.percent(r["utilization"]),
            units.rate(r["errors_per_second"], "errors"),
            units.percent(r["pause_fraction"]),
            units.rate(r["xmit_wait_per_second"], "ticks"),
        ]
        for r in rows
    ]
    cols = ["node", "device", "port", "state", "rx", "tx", "util", "errors", "paused", "xmit wait"]
    _console().print(_table(f"Top {len(rows)} ports by {args.sort}", cols, table))
    return None


def cmd_ack(client: ApiClient, args: argparse.Namespace) -> Any:
    return _act(client, args, "ack")


def cmd_resolve(client: ApiClient, args: argparse.Namespace) -> Any:
    return _act(client, args, "resolve")


def _act(client: ApiClient, args: argparse.Namespace, verb: str) -> Any:
    inc = client.call("POST", f"/api/v1/incidents/{args.id}/{verb}", body={"note": args.note, "by": args.by})
    if args.json:
        return inc
    who = inc.get("acked_by") if verb == "ack" else inc.get("resolved_by")
    print(f"incident {inc['id']} is {inc['state']} (by {who})")
    return None
