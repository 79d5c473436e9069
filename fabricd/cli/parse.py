"""``fabricd parse KIND FILE... [--format json|csv|table]``: what real clusters print, as data.

KIND is one of ``nccl``, ``ethtool``, ``perfquery``, ``ibqueryerrors``, ``ibnetdiscover``, ``ibtracert``, ``sysfs``
(FILE is then a root folder); ``-`` reads stdin. The parsers are ``fabricd.parsers`` (the ones the
collectors use); the shapes are ``fabricd.parsers.records`` (pinned, docs/parse.md). Exit status: 0
when everything parsed, 1 when an input parsed with failures (each printed to stderr as a JSON
record ``{"file", "line", "error", "text"}``; a failed NCCL run is also a record in the output,
with its status and error), 2 on usage errors (unknown KIND or format, a FILE that cannot be read).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fabricd.parsers import records
from fabricd.parsers.common import Problem

KINDS = ("nccl", "ethtool", "perfquery", "ibqueryerrors", "ibnetdiscover", "ibtracert", "sysfs")
FORMATS = ("json", "csv", "table")
SYSFS_PLACES = ("class/infiniband", "sys/class/infiniband")
MAX_SYSFS_FILE_BYTES = 4096  # sysfs attribute files are one page at most
SYSFS_PORT_FILES = ("link_layer", "rate", "state", "phys_state")
SYSFS_COUNTER_FOLDERS = ("counters", "counters_ext", "hw_counters")


class UsageError(Exception):
    """A FILE that cannot be read or a KIND-specific option that does not apply: exit status 2."""


Failure = tuple[str, Problem]  # (file, problem)
Parsed = tuple[Any, list[records.Row], list[Failure]]  # (JSON document, CSV rows, failures)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "parse",
        help="parse NCCL/RCCL-tests logs, ethtool -S, perfquery, ibqueryerrors, ibnetdiscover, ibtracert or a sysfs tree",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    p.add_argument("files", nargs="+", metavar="FILE", help="input file(s); '-' is stdin; for sysfs a root folder")
    p.add_argument("--format", choices=FORMATS, default="json", help="output format (default json)")
    p.add_argument("--op", default="", help="nccl: the collective when neither the text nor the file name says")
    p.add_argument("--driver", default=None, help="ethtool: the driver (ethtool -i) when the text does not say")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        doc, rows, failures = PARSERS[args.kind](args)
    except UsageError as exc:
        print(f"fabricd parse: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(doc, rows, COLUMNS[args.kind], args.format))
    for file, p in failures:
        print(json.dumps({"file": file, "line": p.line, "error": p.message, "text": p.text}), file=sys.stderr)
    failed_runs = args.kind == "nccl" and any(r["status"] != "ok" for r in doc)
    return 1 if failures or failed_runs else 0


def render(doc: Any, rows: list[records.Row], columns: Sequence[str], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
        return buf.getvalue()
    return table(rows, columns)


def table(rows: list[records.Row], columns: Sequence[str]) -> str:
    cells = [list(columns)] + [["-" if r.get(c) is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in cells)


# --- reading inputs (the only I/O) -------------------------------------------------------------------


def read_text(file: str) -> str:
    if file == "-":
        return sys.stdin.read()
    try:
        return Path(file).read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"{file}: {exc.strerror or exc}") from exc


def sysfs_files(root: str) -> dict[str, str]:
    """The files a port record needs under the root's ``class/infiniband`` (or the root itself when it
    is one): walked by name, not recursively, because in a live /sys the device entries are symlinks
    into a tree with cycles."""
    base = Path(root)
    if not base.is_dir():
        raise UsageError(f"{root}: not a folder (sysfs takes a root folder)")
    top = next((base / p for p in SYSFS_PLACES if (base / p).is_dir()), base)
    wanted = [(dev, "hca_type") for dev in sorted(top.iterdir())]
    for dev in sorted(top.iterdir()):
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            wanted += [(port, name) for name in SYSFS_PORT_FILES]
            for counters in (port / c for c in SYSFS_COUNTER_FOLDERS):
                wanted += [(counters, f.name) for f in sorted(counters.iterdir())] if counters.is_dir() else []
    out: dict[str, str] = {}
    for parent, name in wanted:
        path = parent / name
        if path.is_file():
            with path.open("rb") as f:
                out[path.relative_to(top).as_posix()] = f.read(MAX_SYSFS_FILE_BYTES).decode("utf-8", "replace")
    return out


# --- one function per KIND ------------------------------------------------------------------------


def parse_nccl(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.nccl import op_from_name, parse_nccl_runs

    docs: list[dict[str, Any]] = []
    for file in args.files:
        fallback = op_from_name(Path(file).name) if file != "-" else ""
        runs = parse_nccl_runs(read_text(file), op=fallback or args.op)
        docs += [records.nccl_json(run, file) for run in runs]
    return docs, [row for d in docs for row in records.nccl_csv(d)], []


def parse_ethtool(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ethtool import parse_ethtool_stats

    docs, rows, failures = [], [], []
    for file in args.files:
        result = parse_ethtool_stats(read_text(file), args.driver)
        doc = records.ethtool_json(result)
        docs.append(doc)
        rows += records.ethtool_csv(doc, file)
        failures += [(file, p) for p in result.problems]
    return (docs[0] if len(docs) == 1 else docs), rows, failures


def parse_perfquery(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.perfquery import parse_perfquery_text, ports

    found, failures = [], []
    for file in args.files:
        result = parse_perfquery_text(read_text(file))
        found += [records.port_json(p) for p in ports(result.blocks)]
        failures += [(file, p) for p in result.problems]
    return {"ports": found}, [r for p in found for r in records.port_csv(p)], failures


def parse_ibqueryerrors(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibqueryerrors import parse_ibqueryerrors as parse

    found, failures = [], []
    for file in args.files:
        result = parse(read_text(file))
        found += [records.port_json(p) for p in result.ports]
        failures += [(file, p) for p in result.problems]
    return {"ports": found}, [r for p in found for r in records.port_csv(p)], failures


def parse_ibnetdiscover(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover
    from fabricd.topology import from_ibnetdiscover, to_doc

    texts = {file: read_text(file) for file in args.files}
    failures = [(file, p) for file, text in texts.items() for p in parse_ibnetdiscover(text).problems]
    whole = "\n".join(texts.values())
    ports = parse_ibnetdiscover(whole).ports
    return to_doc(from_ibnetdiscover(whole)), [records.ibnet_csv(p) for p in ports], failures


def parse_ibtracert(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibtracert import parse_ibtracert as parse

    found, failures = [], []
    for file in args.files:
        result = parse(read_text(file))
        found.append(records.ibtracert_json(result, file))
        failures += [(file, p) for p in result.problems]
    return found, [r for t in found for r in records.ibtracert_csv(t)], failures


def parse_sysfs(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.sysfs import parse_sysfs as parse

    found, failures = [], []
    for root in args.files:
        result = parse(sysfs_files(root))
        found += [records.sysfs_json(d) for d in result.devices]
        failures += [(root, p) for p in result.problems]
    return {"devices": found}, [r for d in found for r in records.sysfs_csv(d)], failures


PARSERS: dict[str, Callable[[argparse.Namespace], Parsed]] = {
    "nccl": parse_nccl,
    "ethtool": parse_ethtool,
    "perfquery": parse_perfquery,
    "ibqueryerrors": parse_ibqueryerrors,
    "ibnetdiscover": parse_ibnetdiscover,
    "ibtracert": parse_ibtracert,
    "sysfs": parse_sysfs,
}
COLUMNS: dict[str, Sequence[str]] = {
    "nccl": records.NCCL_COLUMNS,
    "ethtool": records.ETHTOOL_COLUMNS,
    "perfquery": records.PORT_COLUMNS,
    "ibqueryerrors": records.PORT_COLUMNS,
    "ibnetdiscover": records.IBNET_COLUMNS,
    "ibtracert": records.IBTRACERT_COLUMNS,
    "sysfs": records.SYSFS_COLUMNS,
}
