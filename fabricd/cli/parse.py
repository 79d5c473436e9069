"""``fabricd parse KIND FILE... [--format json|csv|table]``: what real clusters print, as data.

KIND is one of ``nccl``, ``ethtool``, ``perfquery``, ``ibqueryerrors``, ``ibnetdiscover``, ``ibtracert``,
``ras`` (NCCL RAS status), ``sysfs`` (FILE is then a root folder); ``-`` reads stdin. The parsers are ``fabricd.parsers`` (the ones the
collectors use); the shapes are ``fabricd.parsers.records`` (pinned, docs/parse.md). Exit status: 0
when everything parsed, 1 when an input parsed with failures (each printed to stderr as a JSON
record ``{"file", "line", "error", "text"}``; a failed NCCL run is also a record in the output,
with its status and error, and so is a RAS communicator group with errors), 2 on usage errors (unknown KIND or format, a FILE that cannot be read).
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

from fabricd.parsers import records, sniff
from fabricd.parsers.common import Problem, problem

KINDS = ("nccl", "ethtool", "perfquery", "ibqueryerrors", "ibnetdiscover", "ibtracert", "ras", "sysfs")
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
        help="parse NCCL/RCCL-tests logs, ethtool -S, perfquery, ibqueryerrors, ibnetdiscover, ibtracert, "
        "NCCL RAS status or a sysfs tree",
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
    return 1 if failures or _failed(args.kind, doc) else 0


def _failed(kind: str, doc: Any) -> bool:
    """A failed NCCL run, or a RAS report with errors (a communicator group's, or RAS's own Errors
    section: a DEAD process is listed there even with no communicator left to show it): data, and
    still a failure."""
    if kind == "nccl":
        return any(r["status"] != "ok" for r in doc)
    if kind == "ras":
        return any(report["errors"] or any(g["errors"] != "OK" for g in report["groups"]) for report in doc)
    return False


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


def own_text(kind: str, file: str, failures: list[Failure]) -> str | None:
    """The file's text, or ``None`` when it is another tool's output: then one failure names what it is
    and the KIND that reads it (``fabricd.parsers.sniff``), instead of one per line it cannot read."""
    text = read_text(file)
    if why := sniff.other_kind(text, kind):
        failures.append((file, problem(0, why, next((s for s in text.splitlines() if s.strip()), ""))))
        return None
    return text


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

    docs: list[dict[str, Any]] = []
    rows: list[records.Row] = []
    failures: list[Failure] = []
    for file in args.files:
        text = own_text("ethtool", file, failures)
        result = parse_ethtool_stats(text or "", args.driver)
        doc = records.ethtool_json(result)
        docs.append(doc)
        rows += records.ethtool_csv(doc, file)
        failures += [(file, p) for p in result.problems if text is not None]
    return (docs[0] if len(docs) == 1 else docs), rows, failures


def parse_perfquery(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.perfquery import parse_perfquery_text, ports

    found: list[Any] = []
    failures: list[Failure] = []
    for file in args.files:
        if (text := own_text("perfquery", file, failures)) is None:
            continue
        result = parse_perfquery_text(text)
        found += [records.port_json(p) for p in ports(result.blocks)]
        failures += [(file, p) for p in result.problems]
    return {"ports": found}, [r for p in found for r in records.port_csv(p)], failures


def parse_ibqueryerrors(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibqueryerrors import parse_ibqueryerrors as parse

    found: list[Any] = []
    failures: list[Failure] = []
    for file in args.files:
        if (text := own_text("ibqueryerrors", file, failures)) is None:
            continue
        result = parse(text)
        found += [records.port_json(p) for p in result.ports]
        failures += [(file, p) for p in result.problems]
    return {"ports": found}, [r for p in found for r in records.port_csv(p)], failures


def parse_ibnetdiscover(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover
    from fabricd.topology import from_ibnetdiscover, to_doc

    failures: list[Failure] = []
    texts = {file: text for file in args.files if (text := own_text("ibnetdiscover", file, failures)) is not None}
    failures += [(file, p) for file, text in texts.items() for p in parse_ibnetdiscover(text).problems]
    whole = "\n".join(texts.values())
    ports = parse_ibnetdiscover(whole).ports
    return to_doc(from_ibnetdiscover(whole)), [records.ibnet_csv(p) for p in ports], failures


def parse_ibtracert(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ibtracert import parse_ibtracert as parse

    found: list[Any] = []
    failures: list[Failure] = []
    for file in args.files:
        text = own_text("ibtracert", file, failures)
        result = parse(text or "")
        found.append(records.ibtracert_json(result, file))
        failures += [(file, p) for p in result.problems if text is not None]
    return found, [r for t in found for r in records.ibtracert_csv(t)], failures


def parse_ras(args: argparse.Namespace) -> Parsed:
    from fabricd.parsers.ras import parse_status, problems

    found: list[Any] = []
    failures: list[Failure] = []
    for file in args.files:
        text = own_text("ras", file, failures)
        report = parse_status(text or "")
        found.append(records.ras_json(report, file))
        failures += [(file, p) for p in problems(text, report)] if text is not None else []
    return found, [r for doc in found for r in records.ras_csv(doc)], failures


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
    "ras": parse_ras,
    "sysfs": parse_sysfs,
}
COLUMNS: dict[str, Sequence[str]] = {
    "nccl": records.NCCL_COLUMNS,
    "ethtool": records.ETHTOOL_COLUMNS,
    "perfquery": records.PORT_COLUMNS,
    "ibqueryerrors": records.PORT_COLUMNS,
    "ibnetdiscover": records.IBNET_COLUMNS,
    "ibtracert": records.IBTRACERT_COLUMNS,
    "ras": records.RAS_COLUMNS,
    "sysfs": records.SYSFS_COLUMNS,
}
