"""``fabricd jobs``: the running jobs the agents report, and one job's fabric view.

``fabricd jobs`` lists them (id, user, name, nodes); ``fabricd jobs ID`` shows one job: the HCAs
it uses on each node, the fabric elements it crosses and the open incidents on them
(``GET /api/v1/jobs/{id}``). Exit codes as the other on-call commands (``fabricd.cli.oncall``).
"""

from __future__ import annotations

import argparse
from typing import Any

from fabricd.cli.oncall import ApiClient, common_parser, runner


def register(sub: Any) -> None:
    p = sub.add_parser(
        "jobs",
        parents=[common_parser()],
        help="running jobs and their nodes; one job's HCAs, fabric and incidents",
        description="Running jobs (Slurm, Kubernetes) and their nodes, as the agents report them; "
        "with an ID, that job's HCAs, the fabric elements it crosses and the open incidents on them.",
    )
    p.add_argument("id", nargs="?", help="one job's id")
    p.set_defaults(func=runner(cmd_jobs))


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # names come from the scheduler: text, never markup
    return table


def _print(*items: Any) -> None:
    import sys

    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 160)
    for item in items:
        con.print(item)


def cmd_jobs(client: ApiClient, args: argparse.Namespace) -> Any:
    if args.id:
        return _one(client, args)
    rows = client.call("GET", "/api/v1/jobs")
    if args.json:
        return rows
    from fabricd.timeparse import iso

    table = [[j["id"], j["user"], j["name"], j["scheduler"], iso(j["first_ts"]), " ".join(j["nodes"])] for j in rows]
    _print(_table(f"Jobs ({len(rows)})", ["job", "user", "name", "scheduler", "since", "nodes"], table))
    return None


def _one(client: ApiClient, args: argparse.Namespace) -> Any:
    job = client.call("GET", f"/api/v1/jobs/{args.id}")
    if args.json:
        return job
    hcas = [[node, " ".join(h) or "(all)"] for node, h in job["hcas"].items()]
    fabric = [e for e in job["elements"] if "~" in e or e.startswith(("leaf", "spine"))]
    incidents = [[str(i["id"]), i["kind"], i["severity"], i["element"], i["summary"]] for i in job["incidents"]]
    _print(
        f"job {job['id']} ({job['scheduler']}) {job['name']} by {job['user']}: {len(job['hcas'])} nodes",
        _table("Nodes and HCAs", ["node", "hcas"], hcas),
        _table("Fabric it crosses", ["element"], [[e] for e in fabric]),
        _table("Open incidents", ["id", "kind", "severity", "element", "summary"], incidents),
        _table(
            "NCCL Inspector",
            ["node", "rank", "collective", "size", "time", "busbw", "expected", "NCCL"],
            [_rank_row(n) for n in job["nccl"]],
        ),
    )
    return None


def _rank_row(n: dict[str, Any]) -> list[str]:
    from fabricd import units

    v = n["values"]
    expected = v.get("expected_exec_time_seconds")
    return [
        n["node"],
        n["labels"].get("rank", ""),
        n["op"],
        units.si(v.get("message_size_bytes"), "B"),
        f"{v.get('exec_time_seconds', 0.0) * 1e3:.3f} ms",
        units.throughput(v.get("busbw_bytes_per_second")),
        f"{expected * 1e3:.3f} ms" if expected else "-",
        n["labels"].get("expected_algo", "-"),
    ]
