"""The pinned output shapes of ``fabricd parse`` (issue 17; docs/parse.md, docs/schemas/parse-*.json):
each parser result as JSON-ready dicts and as flat CSV rows. Pure: no I/O, no formatting."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fabricd.parsers.ethtool import EthtoolResult
from fabricd.parsers.ibnetdiscover import IbnetPort
from fabricd.parsers.ibtracert import Trace
from fabricd.parsers.nccl import NcclRow, NcclRun
from fabricd.parsers.perfquery import PortCounters
from fabricd.parsers.ras import RasReport
from fabricd.parsers.sysfs import SysfsPort

Row = dict[str, Any]

NCCL_COLUMNS = (
    "file",
    "op",
    "tool",
    "status",
    "error",
    "nranks",
    "avg_busbw_gbps",
    "size_bytes",
    "count",
    "dtype",
    "redop",
    "root",
    "out_of_place_time_us",
    "out_of_place_algbw_gbps",
    "out_of_place_busbw_gbps",
    "out_of_place_wrong",
    "in_place_time_us",
    "in_place_algbw_gbps",
    "in_place_busbw_gbps",
    "in_place_wrong",
)
ETHTOOL_COLUMNS = ("file", "driver", "interface", "raw", "name", "labels", "value", "unit")
PORT_COLUMNS = ("guid", "port", "lid", "name", "counter", "value", "saturated")
SYSFS_COLUMNS = ("device", "port", "link_layer", "rate_bps", "state", "counter", "value", "saturated")
IBNET_COLUMNS = (
    "type",
    "lid",
    "port",
    "guid",
    "desc",
    "width",
    "speed",
    "remote_type",
    "remote_lid",
    "remote_port",
    "remote_guid",
    "remote_desc",
)


# --- nccl ---------------------------------------------------------------------------------------


def _measure(row: NcclRow | None) -> dict[str, Any] | None:
    if row is None or (row.time_us is None and row.algbw_gbps is None and row.busbw_gbps is None):
        return None  # the text says N/A
    return {"time_us": row.time_us, "algbw_gbps": row.algbw_gbps, "busbw_gbps": row.busbw_gbps, "wrong": row.wrong}


def nccl_rows(run: NcclRun) -> list[dict[str, Any]]:
    """One object per size: the out-of-place and in-place measurements of one table line."""
    out: list[dict[str, Any]] = []
    pending: NcclRow | None = None
    for row in [*run.rows, None]:
        if pending is not None and (row is None or row.placement == "out_of_place"):
            out.append(_size_row(pending, None))
            pending = None
        if row is None:
            break
        if row.placement == "out_of_place":
            pending = row
        elif pending is not None:
            out.append(_size_row(pending, row))
            pending = None
    return out


def _size_row(oop: NcclRow, ip: NcclRow | None) -> dict[str, Any]:
    return {
        "size_bytes": oop.size_bytes,
        "count": oop.count,
        "dtype": oop.dtype,
        "redop": oop.redop or None,  # None: no column, or alltoall's blank cell
        "root": oop.root,
        "out_of_place": _measure(oop),
        "in_place": _measure(ip),
    }


def nccl_json(run: NcclRun, file: str) -> dict[str, Any]:
    return {
        "file": file,
        "op": run.op or None,
        "tool": run.tool,
        "versions": dict(run.versions),
        "status": run.status,
        "error": run.error,
        "nranks": run.nranks,
        "avg_busbw_gbps": run.avg_busbw_gbps,
        "rows": nccl_rows(run),
    }


def nccl_csv(run: dict[str, Any]) -> list[Row]:
    """One CSV row per (run, size); a run without a table is one row with its status and error."""
    head = {k: run[k] for k in ("file", "op", "tool", "status", "error", "nranks", "avg_busbw_gbps")}
    if not run["rows"]:
        return [{**head, **dict.fromkeys(NCCL_COLUMNS[7:])}]
    out = []
    for r in run["rows"]:
        row = {**head, **{k: r[k] for k in ("size_bytes", "count", "dtype", "redop", "root")}}
        for where in ("out_of_place", "in_place"):
            m = r[where] or {}
            row.update({f"{where}_{k}": m.get(k) for k in ("time_us", "algbw_gbps", "busbw_gbps", "wrong")})
        out.append(row)
    return out


# --- ethtool ------------------------------------------------------------------------------------


def ethtool_json(result: EthtoolResult) -> dict[str, Any]:
    stats = [
        {"raw": s.raw, "name": s.name, "labels": dict(s.labels), "value": s.value, "unit": s.unit} for s in result.stats
    ]
    return {"driver": result.driver, "interface": result.interface, "stats": stats}


def ethtool_csv(doc: dict[str, Any], file: str) -> list[Row]:
    return [
        {
            "file": file,
            "driver": doc["driver"],
            "interface": doc["interface"],
            "raw": s["raw"],
            "name": s["name"],
            "labels": ";".join(f"{k}={v}" for k, v in sorted(s["labels"].items())),
            "value": s["value"],
            "unit": s["unit"],
        }
        for s in doc["stats"]
    ]


# --- perfquery, ibqueryerrors, sysfs ---------------------------------------------------------------


def port_json(p: PortCounters) -> dict[str, Any]:
    return {
        "guid": p.guid,
        "port": p.port,
        "lid": p.lid,
        "name": p.name,
        "counters": dict(p.counters),
        "saturated": list(p.saturated),
    }


def port_csv(port: dict[str, Any]) -> list[Row]:
    head = {k: port[k] for k in ("guid", "port", "lid", "name")}
    sat = set(port["saturated"])
    return [{**head, "counter": k, "value": v, "saturated": k in sat} for k, v in port["counters"].items()]


def sysfs_json(p: SysfsPort) -> dict[str, Any]:
    return {
        "device": p.device,
        "port": p.port,
        "link_layer": p.link_layer,
        "rate_bps": p.rate_bps,
        "state": p.state,
        "counters": dict(p.counters),
        "saturated": list(p.saturated),
    }


def sysfs_csv(dev: dict[str, Any]) -> list[Row]:
    head = {k: dev[k] for k in ("device", "port", "link_layer", "rate_bps", "state")}
    sat = set(dev["saturated"])
    return [{**head, "counter": k, "value": v, "saturated": k in sat} for k, v in dev["counters"].items()]


# --- ibnetdiscover --------------------------------------------------------------------------------


def ibnet_csv(p: IbnetPort) -> Row:
    far = p.remote
    return {
        "type": p.local.type,
        "lid": p.local.lid,
        "port": p.local.port,
        "guid": p.local.guid,
        "desc": p.local.desc,
        "width": p.width,
        "speed": p.speed,
        "remote_type": far.type if far else None,
        "remote_lid": far.lid if far else None,
        "remote_port": far.port if far else None,
        "remote_guid": far.guid if far else None,
        "remote_desc": far.desc if far else None,
    }


# --- ibtracert ------------------------------------------------------------------------------------

IBTRACERT_COLUMNS = ("file", "hop", "out_port", "type", "guid", "port", "lid", "desc")


def ibtracert_json(t: Trace, file: str) -> dict[str, Any]:
    """One trace: its ends, its hops in order, and whether the destination was reached."""
    return {
        "file": file,
        "complete": t.complete,
        "source": asdict(t.source) if t.source else None,
        "hops": [asdict(h) for h in t.hops],
        "destination": asdict(t.destination) if t.destination else None,
    }


def ibtracert_csv(trace: dict[str, Any]) -> list[Row]:
    """One row per hop (hop 0: the source; the destination is the last hop's node)."""
    rows: list[Row] = []
    src = trace["source"]
    if src is not None:
        rows.append({"file": trace["file"], "hop": 0, "out_port": None, **_hop_cells(src)})
    for i, h in enumerate(trace["hops"], 1):
        rows.append({"file": trace["file"], "hop": i, "out_port": h["out_port"], **_hop_cells(h)})
    return rows


def _hop_cells(end: dict[str, Any]) -> Row:
    return {"type": end["type"], "guid": end["guid"], "port": end["port"], "lid": end["lid"], "desc": end["desc"]}


# --- NCCL RAS ---------------------------------------------------------------------------------------

RAS_COLUMNS = (
    "file",
    "nccl_version",
    "group",
    "comms",
    "nodes",
    "ranks_per_node",
    "ranks_per_node_max",
    "ranks_per_comm",
    "ranks",
    "status",
    "errors",
)


def ras_json(report: RasReport, file: str) -> dict[str, Any]:
    """One report: its NCCL version, its communicator groups, and its Errors / Warnings lines."""
    return {
        "file": file,
        "nccl_version": report.version or None,
        "groups": [asdict(g) for g in report.groups],
        "errors": report.errors,
        "warnings": report.warnings,
    }


def ras_csv(doc: dict[str, Any]) -> list[Row]:
    """One row per communicator group."""
    return [{"file": doc["file"], "nccl_version": doc["nccl_version"], **g} for g in doc["groups"]]
