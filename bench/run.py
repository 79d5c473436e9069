"""``make bench``: fabricd measured against node_exporter and against the machine's own limits.

Every figure is the median of several runs after a warm-up (min and max kept), and each ratio is
computed between two measurements taken in the same run. The table goes to stdout and to
``docs/benchmarks.md`` (with the machine and the commit); the JSON to ``bench-results/latest.json``
so two runs can be compared (``--compare OLD.json``). No timing is asserted anywhere: a benchmark
fails only on a broken setup.

    python bench/run.py [--quick] [--only scrape,footprint,ingest,detect,exporter] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import Stat, free_port, pid_cpu_seconds, pid_rss_bytes, run_child

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
Row = dict[str, Any]


# --------------------------------------------------------------------------- the node under test


def write_node_tree(root: Path) -> Path:
    """A realistic GPU node: 8 ConnectX-7 HCAs (IB: counters + hw_counters) and a RoCE bond
    (Ethernet: counters + hw_counters with the congestion counters), written with the same tree
    writer the simulator uses (fabricd/sysfstree.py: the files and formats of the real fixtures)."""
    from fabricd import sysfstree as st

    def counters() -> dict[str, st.Value]:
        vals: dict[str, st.Value] = {name: 3 for name in st.PORT_COUNTERS_BASE}
        vals.update({name: 123_456_789_012 for name in st.PORT_COUNTERS_DATA + st.PORT_COUNTERS_EXT_ONLY})
        return vals

    hw = {name: 42 for name in st.MLX5_Q_COUNTERS}
    devices = {
        f"mlx5_{i}": st.DeviceTree(node_guid=f"a088:c203:00{i:02x}:1e2c", ports={"1": st.PortTree(
            counters=counters(), hw_counters={**hw, "lifespan": 12})})
        for i in range(8)
    }  # fmt: skip
    devices["mlx5_bond_0"] = st.DeviceTree(hca_type="MT41692", ports={"1": st.PortTree(
        link_layer="Ethernet", rate="200 Gb/sec (2X NDR)", counters=counters(),
        hw_counters={**hw, **{name: 7 for name in st.MLX5_CONG_COUNTERS}, "lifespan": 12})})  # fmt: skip
    st.write_infiniband_tree(root, devices)
    return root


def counter_file_count(root: Path) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    from floor import counter_files

    return len(counter_files(str(root)))


# --------------------------------------------------------------------------- 1. scrape cost


def _fabricd_collect_cpu(root: Path, count: int) -> float:
    argv = [PY, "-m", "fabricd", "collect", "--count", str(count), "--interval", "0", "--format", "none",
            "--sysfs-root", str(root), "--collector", "infiniband"]  # fmt: skip
    return run_child(argv).cpu_seconds


def fabricd_per_scrape(root: Path, n: int) -> float:
    # Startup (interpreter, imports, discovery) is subtracted: count=n+1 minus count=1.
    return (_fabricd_collect_cpu(root, n + 1) - _fabricd_collect_cpu(root, 1)) / n


def floor_per_scrape(root: Path, n: int) -> float:
    full = run_child([PY, str(REPO / "bench" / "floor.py"), str(root), str(n)]).cpu_seconds
    base = run_child([PY, str(REPO / "bench" / "floor.py"), str(root), "0"]).cpu_seconds
    return (full - base) / n


class NodeExporter:
    """The Debian prometheus-node-exporter with only its infiniband collector, on a free port."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["prometheus-node-exporter", f"--path.sysfs={root}", "--collector.disable-defaults",
             "--collector.infiniband", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.client = httpx.Client(headers={"Accept-Encoding": "identity"})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.scrape()
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("node_exporter did not start")

    def scrape(self) -> None:
        self.client.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).raise_for_status()

    def per_scrape(self, n: int) -> float:
        before = pid_cpu_seconds(self.proc.pid)
        for _ in range(n):
            self.scrape()
        return (pid_cpu_seconds(self.proc.pid) - before) / n

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


def bench_scrape(quick: bool) -> list[Row]:
    n, runs = (50, 3) if quick else (200, 5)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_node_tree(Path(tmp))
        files = counter_file_count(root)
        ne = NodeExporter(root)
        try:
            pairs = []
            for _ in range(runs + 1):  # the first pair is the warm-up
                pairs.append((fabricd_per_scrape(root, n), ne.per_scrape(n), floor_per_scrape(root, n)))
        finally:
            ne.close()
    pairs = pairs[1:]
    fab, nex, flo = (Stat.of([p[i] for p in pairs]) for i in range(3))
    ratio = Stat.of([p[0] / p[1] for p in pairs if p[1] > 0])
    ratio_floor = Stat.of([p[0] / p[2] for p in pairs if p[2] > 0])
    note = f"{files} counter files, {n} scrapes per run"
    return [
        _row("scrape", "fabricd collect, CPU per scrape", fab, "s", note),
        _row("scrape", "node_exporter (infiniband only), CPU per scrape", nex, "s", note + ", over HTTP"),
        _row("scrape", "bare Python open+read of every counter file", flo, "s", "the floor"),
        _row("scrape", "ratio fabricd / node_exporter", ratio, "x", "goal <= 0.5"),
        _row("scrape", "ratio fabricd / bare-Python floor", ratio_floor, "x", ""),
    ]


# --------------------------------------------------------------------------- 2. agent footprint


def bench_footprint(quick: bool) -> list[Row]:
    seconds = 15 if quick else 60
    with tempfile.TemporaryDirectory() as tmp:
        root = write_node_tree(Path(tmp) / "sys")
        # No central: the agent spools, which is its worst steady state (it also serializes to disk).
        proc = subprocess.Popen(
            [PY, "-m", "fabricd", "agent", "--node", "bench", "--sysfs-root", str(root), "--interval", "1",
             "--central", f"http://127.0.0.1:{free_port()}", "--data-dir", str(Path(tmp) / "data")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(5)  # warm-up: imports, discovery, first batches
            cpu0, t0 = pid_cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu = (pid_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            rss = pid_rss_bytes(proc.pid)
        finally:
            proc.terminate()
            proc.wait(15)
    return [
        _row("footprint", "fabricd agent steady CPU at 1 s interval", Stat.of([cpu * 100]), "%",
             f"over {seconds} s, central down (spooling)"),
        _row("footprint", "fabricd agent peak RSS", Stat.of([rss / 2**20]), "MiB", ""),
    ]


# --------------------------------------------------------------------------- report

SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "scrape": bench_scrape,
    "footprint": bench_footprint,
}


def _row(section: str, what: str, stat: Stat, unit: str, note: str) -> Row:
    return {"section": section, "what": what, "unit": unit, "note": note, **stat.as_dict()}


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.3g} {unit}".strip()


def table(rows: list[Row]) -> str:
    lines = ["| section | measurement | median | min | max | runs | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['section']} | {r['what']} | {_fmt(r['median'], r['unit'])} | {_fmt(r['min'], r['unit'])} "
                     f"| {_fmt(r['max'], r['unit'])} | {r['runs']} | {r['note']} |")  # fmt: skip
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {"cpu": cpu, "cores": str(os.cpu_count()), "python": platform.python_version(),
            "commit": commit.stdout.strip() or "unknown", "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def write_docs(rows: list[Row], info: dict[str, str]) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    head = doc.read_text().split("<!-- bench:start -->")[0] if doc.exists() else "# Benchmarks\n\n"
    body = (f"<!-- bench:start -->\nLatest run: {info['date']}, commit `{info['commit']}`, "
            f"{info['cpu']} ({info['cores']} cores), Python {info['python']}.\n\n{table(rows)}\n")  # fmt: skip
    doc.write_text(head + body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer runs and shorter windows")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument("--compare", type=Path, help="an earlier bench-results JSON to compare medians against")
    args = ap.parse_args()
    chosen = args.only.split(",") if args.only else list(SECTIONS)
    rows: list[Row] = []
    for name in chosen:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        rows.extend(SECTIONS[name](args.quick))
    info = machine()
    print(table(rows))
    out = REPO / "bench-results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    if args.compare:
        old = {(r["section"], r["what"]): r for r in json.loads(args.compare.read_text())["rows"]}
        for r in rows:
            o = old.get((r["section"], r["what"]))
            if o and o["median"]:
                print(f"{r['what']}: {r['median'] / o['median']:.2f}x of previous", file=sys.stderr)
    if not args.no_docs:
        write_docs(rows, info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
