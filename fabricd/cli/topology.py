"""``fabricd topology discover|show|push|diff``: give the central its topology (docs/topology.md).

- ``discover`` builds the topology document (docs/topology.schema.json) from ``ibnetdiscover``
  output in either format (a file, ``-`` for stdin, or ``--run`` to run it here) and/or LLDP
  neighbours (``--lldp NODE=FILE``: that machine's ``lldpctl -f json``), and prints it;
- ``show [FILE|-]`` renders a document (default: the central's) as tables;
- ``push FILE|-`` sends one to the central, which checks it and answers 422 with the reason;
- ``diff FILE|-`` says what changed against the central's stored topology.

Exit codes as the on-call commands: 0 ok, 1 refused (by the server, or an unreadable document),
2 usage, 3 cannot reach the server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fabricd.cli import oncall

IBNETDISCOVER_TIMEOUT_S = 120.0


class Refused(Exception):
    """An input that cannot become a topology; the message says why."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "topology",
        help="discover, show, push, diff or trace the fabric's topology",
        description="The fabric's topology: discover it, show it, push it to the central, diff it, trace paths.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    common = _server_options()

    def verb(name: str, what: str, **kw: Any) -> argparse.ArgumentParser:
        return verbs.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".", **kw)

    d = verb("discover", "build the topology document from ibnetdiscover and/or LLDP", parents=[common])
    d.add_argument(
        "--ibnetdiscover", metavar="FILE", help="ibnetdiscover output (-p or the topology file; - for stdin)"
    )
    d.add_argument("--run", action="store_true", help="run `ibnetdiscover -p` here")
    d.add_argument("--lldp", metavar="NODE=FILE", action="append", default=[], help="a machine's `lldpctl -f json`")
    d.add_argument("--link-layer", choices=["roce", "ethernet"], default="roce", help="of LLDP-discovered ports")
    d.add_argument("--central", action="store_true", help="what the central assembled from its agents' LLDP")
    d.set_defaults(func=_remote(cmd_discover))
    s = verb("show", "switches, hosts and links with their ports (default: the central's)", parents=[common])
    s.add_argument("file", nargs="?", help="a topology document (- for stdin)")
    s.set_defaults(func=_remote(cmd_show))
    u = verb("push", "send a topology document to the central (admin token)", parents=[common])
    u.add_argument("file", help="a topology document (- for stdin)")
    u.set_defaults(func=_remote(cmd_push))
    f = verb("diff", "what changed against the central's stored topology", parents=[common])
    f.add_argument("file", nargs="?", help="a topology document (- for stdin); default: what the agents discovered")
    f.set_defaults(func=_remote(cmd_diff))
    t = verb("trace", "the hops a probe's 5-tuple takes (UDP, TTL 1, 2, ...: ECMP hashes it like the probe)")
    t.add_argument("destination", help="the probe's destination address")
    t.add_argument(
        "--dst-port", type=int, required=True, help="the probe's destination port (the peer's pingmesh port)"
    )
    t.add_argument("--src-port", type=int, default=0, help="the probe's source port (default: any)")
    t.add_argument("--src", default="0.0.0.0", help="the probe's source address")
    t.add_argument("--max-hops", type=int, default=16, help="give up after this many hops (default 16)")
    t.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each hop")
    t.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    t.set_defaults(func=cmd_trace)


def _server_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=os.environ.get("FABRICD_SERVER", oncall.DEFAULT_SERVER),
        help=f"central service URL (env FABRICD_SERVER, default {oncall.DEFAULT_SERVER})",
    )
    common.add_argument(
        "--token", default=os.environ.get("FABRICD_TOKEN", ""), help="bearer token (env FABRICD_TOKEN); admin for push"
    )
    common.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server")
    common.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    return common


def _remote(command: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        client = oncall.CLIENT_FACTORY(args.server, args.token, args.timeout)
        try:
            return int(command(client, args))
        except Refused as exc:
            print(f"fabricd: {exc}", file=sys.stderr)
            return oncall.EXIT_SERVER
        except oncall.Unreachable as exc:
            print(f"fabricd: {exc}", file=sys.stderr)
            return oncall.EXIT_UNREACHABLE
        except oncall.ServerError as exc:
            print(f"fabricd: server said {exc.status} {exc.code}: {exc.message}", file=sys.stderr)
            return oncall.EXIT_SERVER
        finally:
            client.close()

    return run


# --- discover ------------------------------------------------------------------------------------


def cmd_discover(client: oncall.ApiClient, args: argparse.Namespace) -> int:
    from fabricd.topology import from_ibnetdiscover, to_doc
    from fabricd.topology.merge import merge

    if args.central:
        found = client.call("GET", "/api/v1/topology/discovered")
        for line in found["problems"]:
            print(f"fabricd: discovered: {line}", file=sys.stderr)
        print(json.dumps(found["document"], indent=2))
        return oncall.EXIT_OK
    if not (args.ibnetdiscover or args.run or args.lldp):
        print(
            "fabricd: topology discover needs --ibnetdiscover FILE, --run, --lldp NODE=FILE or --central",
            file=sys.stderr,
        )
        return oncall.EXIT_USAGE
    parts = []
    if args.ibnetdiscover or args.run:
        text = _run_ibnetdiscover() if args.run else _read(args.ibnetdiscover)
        _ibnet_problems(text)
        parts.append(from_ibnetdiscover(text))
    if args.lldp:
        found = _lldp(args.lldp, args.link_layer)
        for line in found.problems:
            print(f"fabricd: lldp: {line}", file=sys.stderr)
        parts.append(found.topology)
    print(json.dumps(to_doc(merge(parts)), indent=2))
    return oncall.EXIT_OK


def _run_ibnetdiscover() -> str:
    try:
        proc = subprocess.run(
            ["ibnetdiscover", "-p"], capture_output=True, text=True, timeout=IBNETDISCOVER_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise Refused("ibnetdiscover is not installed (Debian: infiniband-diags)") from exc
    except subprocess.TimeoutExpired as exc:
        raise Refused(f"ibnetdiscover -p did not finish in {IBNETDISCOVER_TIMEOUT_S:g} s") from exc
    if proc.returncode != 0:
        raise Refused(f"ibnetdiscover -p exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def _ibnet_problems(text: str) -> None:
    from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover

    parsed = parse_ibnetdiscover(text)
    for p in parsed.problems:
        print(f"fabricd: ibnetdiscover line {p.line}: {p.message}", file=sys.stderr)
    if not parsed.ports:
        raise Refused("no ports in the ibnetdiscover output (is it ibnetdiscover's -p or topology output?)")


def _lldp(specs: list[str], link_layer: str) -> Any:
    from fabricd.parsers.lldp import parse_lldpctl_json
    from fabricd.topology.lldp import LldpReport, from_lldp

    reports = []
    for spec in specs:
        node, sep, path = spec.partition("=")
        if not sep or not node or not path:
            raise Refused(f"--lldp {spec!r}: give NODE=FILE (the machine and its `lldpctl -f json` output)")
        parsed = parse_lldpctl_json(_read(path))
        if parsed.problems and not parsed.neighbours:
            raise Refused(f"--lldp {spec}: {parsed.problems[0].message}")
        reports.append(LldpReport(node, tuple(parsed.neighbours)))
    return from_lldp(reports, link_layer)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise Refused(f"{path}: {exc.strerror}") from exc


def _json(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(_read(path))
    except ValueError as exc:
        raise Refused(f"{path}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise Refused(f"{path}: a topology document is a JSON object")
    return doc


def _document(path: str) -> dict[str, Any]:
    """A topology document from a file, checked the way the central checks it."""
    from fabricd.topology import from_doc, routes_of

    doc = _json(path)
    try:
        routes_of(doc, from_doc(doc))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Refused(f"{path}: topology: {exc}") from exc
    return doc


# --- show / push / diff -----------------------------------------------------------------------------


def cmd_show(client: oncall.ApiClient, args: argparse.Namespace) -> int:
    from fabricd.topology import from_doc

    doc = _document(args.file) if args.file else client.call("GET", "/api/v1/topology")
    if args.json:
        print(json.dumps(doc, indent=2))
        return oncall.EXIT_OK
    topo = from_doc(doc)
    con = oncall._console()
    uplinks: dict[str, int] = {}
    for link in topo.links.values():
        for end in (link.a, link.b):
            uplinks[end] = uplinks.get(end, 0) + 1
    switches = [[s.id, s.tier, s.guid, str(uplinks.get(s.id, 0))] for s in topo.switches.values()]
    con.print(oncall._table("Switches", ["switch", "tier", "guid", "links"], switches))
    hosts = [[n, ", ".join(topo.hca_ports[h].device for h in hcas)] for n, hcas in topo.nodes.items()]
    con.print(oncall._table("Hosts", ["host", "ports"], hosts))
    rows = []
    for link in topo.links.values():
        for a_port, b_port in link.ports or (("", ""),):
            rows.append([link.a, a_port, link.b, b_port])
    con.print(oncall._table("Links", ["end", "port", "remote end", "remote port"], rows))
    return oncall.EXIT_OK


def cmd_push(client: oncall.ApiClient, args: argparse.Namespace) -> int:
    doc = _json(args.file)  # the central checks it (422 with the reason): one set of rules, one place
    stored = client.call("PUT", "/api/v1/topology", body=doc)
    if args.json:
        print(json.dumps(stored, indent=2))
    else:
        print(f"topology stored: {len(stored['elements'])} elements, {len(stored['links'])} links")
    return oncall.EXIT_OK


def cmd_diff(client: oncall.ApiClient, args: argparse.Namespace) -> int:
    from fabricd.topology import from_doc
    from fabricd.topology.diff import Change, diff

    if args.file is None:  # what the agents discovered, against the stored topology (the central diffs)
        found = client.call("GET", "/api/v1/topology/discovered")
        for line in found["problems"]:
            print(f"fabricd: discovered: {line}", file=sys.stderr)
        changes = [Change(c["kind"], c["element"], c["detail"]) for c in found["changes"]]
    else:
        new = from_doc(_document(args.file))
        try:
            old = from_doc(client.call("GET", "/api/v1/topology"))
        except oncall.ServerError as exc:
            if exc.status != 404:
                raise
            old = from_doc({})  # nothing stored yet: everything is new
        changes = diff(old, new)
    if args.json:
        print(json.dumps([{"kind": c.kind, "element": c.element, "detail": c.detail} for c in changes], indent=2))
    elif not changes:
        print("no change")
    else:
        for c in changes:
            print(f"{c.kind:15} {c.element}  {c.detail}".rstrip())
    return oncall.EXIT_OK


def cmd_trace(args: argparse.Namespace) -> int:
    import socket

    from fabricd.pathtrace import trace

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((args.src, args.src_port))
        hops = trace(sock, (args.destination, args.dst_port), args.max_hops, args.timeout)
        src, sport = sock.getsockname()
    except OSError as exc:
        print(f"fabricd: trace to {args.destination}:{args.dst_port}: {exc.strerror or exc}", file=sys.stderr)
        return oncall.EXIT_SERVER
    finally:
        sock.close()
    if args.json:
        rows = [{"ttl": h.ttl, "address": h.address, "reached": h.reached, "rtt_seconds": h.rtt_seconds} for h in hops]
        print(json.dumps({"src": src, "src_port": sport, "hops": rows}, indent=2))
        return oncall.EXIT_OK
    print(f"udp {src}:{sport} -> {args.destination}:{args.dst_port}")
    for h in hops:
        rtt = f"{h.rtt_seconds * 1e3:.3f} ms" if h.rtt_seconds is not None else ""
        print(f"{h.ttl:3}  {h.address or '*':15} {rtt}{'  (destination)' if h.reached else ''}".rstrip())
    return oncall.EXIT_OK if hops and hops[-1].reached else oncall.EXIT_SERVER
