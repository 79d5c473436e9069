"""``fabricd report`` and ``GET /api/v1/incidents/{id}/report`` on an incident the real pipeline found.

A small simulated fabric (tests/cases/report/link-flap-small.yaml: one flapping host link) is
replayed through the agent's collectors (``fabricd.sim.eval``'s replay pieces, plus the pingmesh
collector on the simulator's model prober), stored by the central's group-commit writer and run through
the ``DetectionLoop`` with the real detection engine. The report is then built against a real
``fabricd server`` process (CLI) and the in-process app (route), and checked against the REST API.
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import struct
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabricd.cli import main
from fabricd.cli.oncall import ApiClient
from fabricd.model import Batch, Sample
from fabricd.perfmodel import Fabric, predict
from fabricd.report import ReportQuery, RestSource, build_report, write_report
from fabricd.server import db
from fabricd.server.app import create_app
from fabricd.settings import ServerSettings
from tests.support.server import ServerProcess, free_port, running

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).parent / "cases" / "report" / "link-flap-small.yaml"
FLAPPING = ("node-003", "mlx5_1", "1")  # the fault's HCA port (the scenario's `at`)
ELEMENT = "node-003/mlx5_1~leaf-01"
MIN_WIDTH, MIN_HEIGHT = 400, 200  # a plot smaller than this is not a plot anyone can read
PAD = "2m"
MODEL = Fabric(hcas_per_node=2, gpus_per_node=2, nodes_per_leaf=3)  # the scenario's topology, 400 Gb/s


@dataclass
class Fleet:
    db_url: str
    data_dir: Path
    incident_id: int
    read: str
    end_ts: float  # event time of the last scrape


# --- the simulated fleet ------------------------------------------------------------------------


def _add_pingmesh(cluster: Any, nodes: list[Any], clock: Any) -> None:
    """The real pingmesh collector, its prober swapped for the simulator's model prober."""
    from collectors.pingmesh import PeerOptions, PingmeshCollector, PingmeshOptions
    from fabricd.collector import CollectorContext
    from fabricd.probe import Target
    from fabricd.sim.probes import model_prober

    for node in nodes:
        peers = [p.dst for p in cluster.sim.fabric.probes if p.src == node.name]
        opts = PingmeshOptions(respond=False, peers=[PeerOptions(name=p, address="127.0.0.1", port=9) for p in peers])
        collector = PingmeshCollector(CollectorContext(node=node.name, options=opts))
        targets = [Target(p, "127.0.0.1", 9, 10.0) for p in peers]
        collector.prober = model_prober(cluster.sim, node.name, targets, lambda: int(clock.now * 1e9))  # type: ignore[assignment]
        node.collectors["pingmesh"] = collector


async def _replay(workdir: Path) -> tuple[Any, list[tuple[float, list[tuple[str, Sample]]]]]:
    from fabricd.clock import ManualClock
    from fabricd.sim import replay as ev
    from fabricd.sim.cluster import create
    from fabricd.sim.scenario import load

    scenario = load(str(SCENARIO), delivery={"mode": "aligned"})  # the rounds below are aligned
    cluster = create(scenario, workdir, ev.EPOCH)
    clock = ManualClock(ev.EPOCH)
    nodes = ev.build_nodes(cluster, clock)
    _add_pingmesh(cluster, nodes, clock)
    rounds = []
    try:
        for k in range(int(scenario.duration // scenario.interval) + 1):
            cluster.advance_to(k * scenario.interval)
            clock.now = ev.EPOCH + k * scenario.interval
            rounds.append((clock.now, [(n.name, s) for n in nodes for s in await ev.scrape_node(n, clock.now)]))
            await asyncio.sleep(0)  # let started NCCL runs finish
    finally:
        await ev.close_nodes(nodes)
    return cluster, rounds


def _store_and_detect(
    settings: ServerSettings, cluster: Any, rounds: list[tuple[float, list[tuple[str, Sample]]]]
) -> None:
    from fabricd.detect.engine import DetectionEngine
    from fabricd.server.detection import DetectionLoop, EngineFeed

    svc = create_app(settings).state.services
    db.prepare(svc.store.engine)
    for k, (ts, batch) in enumerate(rounds):
        per_node: dict[str, list[Sample]] = defaultdict(list)
        for node, s in batch:
            per_node[node].append(s)
        for node, samples in per_node.items():
            svc.store.writer.ingest(Batch(node, "sim", f"{node}-{k}", samples, created_ts=ts), ts, 20_000)
    engine = DetectionEngine()
    engine.set_topology(cluster.sim.fabric.topology, cluster.routes())
    loop = DetectionLoop(
        svc.store.stream, svc.store.incidents, EngineFeed(engine), svc.metrics, clock=lambda: rounds[-1][0]
    )
    while loop.step():
        pass
    svc.store.engine.dispose()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    root = tmp_path_factory.mktemp("report")
    data = root / "data"
    db_url = f"sqlite:///{data / 'fabricd.db'}"
    settings = ServerSettings(db=db_url, data_dir=data, token_cache_seconds=0)
    cluster, rounds = asyncio.run(_replay(root / "sim"))
    _store_and_detect(settings, cluster, rounds)
    svc = create_app(settings).state.services
    flaps = [r for r in svc.store.incidents.query() if r.element == ELEMENT]
    assert flaps, f"the detector found no incident at {ELEMENT}: {[r.element for r in svc.store.incidents.query()]}"
    read = svc.store.tokens.create("read", rounds[-1][0])[1]
    svc.store.engine.dispose()
    return Fleet(db_url, data, flaps[0].id, read, rounds[-1][0])


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[ServerProcess]:
    proc = ServerProcess(fleet.data_dir, db=fleet.db_url, extra=["--log-level", "warning"]).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def api(fleet: Fleet) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServerSettings(db=fleet.db_url, data_dir=fleet.data_dir, token_cache_seconds=0)
    async with running(create_app(settings, clock=lambda: fleet.end_ts)) as client:
        yield client


# --- helpers -------------------------------------------------------------------------------------------


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which the PNG spec puts first, right after the signature."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def cli(fleet: Fleet, server: ServerProcess, *args: str) -> int:
    return main(
        [
            "report",
            *args,
            "--server",
            server.url,
            "--token",
            fleet.read,
            "--pad",
            PAD,
            "--hcas-per-node",
            "2",
            "--gpus-per-node",
            "2",
            "--nodes-per-leaf",
            "3",
        ]
    )


@dataclass
class Built:
    report: Any
    client: ApiClient
    start: float  # the report's window, as the report computes it from the incident
    end: float


@pytest.fixture(scope="module")
def built(fleet: Fleet, server: ServerProcess) -> Iterator[Built]:
    """One report built over REST (as the CLI does), shared by the tests that compare it with the API."""
    client = ApiClient(server.url, fleet.read, 30.0)
    query = ReportQuery(incident_id=fleet.incident_id, pad_seconds=120.0, fabric=MODEL)
    report = build_report(RestSource(client), query, fleet.end_ts)
    inc = client.call("GET", f"/api/v1/incidents/{fleet.incident_id}")
    last = max([inc["updated_ts"], *(e["ts"] for e in inc["evidence"]), *(t["ts"] for t in inc["timeline"])])
    try:
        yield Built(report, client, inc["started_ts"] - 120.0, min(fleet.end_ts, last + 120.0))
    finally:
        client.close()


# --- the CLI -------------------------------------------------------------------------------------------


def test_cli_writes_a_self_contained_html_report_and_its_pngs(
    fleet: Fleet, server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "inc"
    assert cli(fleet, server, "--incident", str(fleet.incident_id), "--out", str(out)) == 0
    written = capsys.readouterr().out.split()
    html = (out / "report.html").read_text()
    pngs = sorted(out.glob("*.png"))
    assert str(out / "report.html") in written and all(str(p) in written for p in pngs)
    assert f"#{fleet.incident_id} link_flap at {ELEMENT}" in html
    assert "node-003/mlx5_1/1" in html and "Localization candidates" in html and "Evidence" in html
    names = {p.stem for p in pngs}
    assert {"port-node-003-mlx5_1-1", "pingmesh", "nccl-all_reduce"} <= names
    for p in pngs:
        png = p.read_bytes()
        width, height = png_size(png)
        assert width >= MIN_WIDTH and height >= MIN_HEIGHT, (p.name, width, height)
        assert base64.b64encode(png).decode() in html, f"{p.name} is not the plot embedded in report.html"
    assert "<img" in html and 'src="http' not in html  # self-contained: nothing fetched from elsewhere


def test_png_only_writes_the_plots_and_no_html(built: Built, tmp_path: Path) -> None:
    written = write_report(built.report, tmp_path, png_only=True)
    assert not (tmp_path / "report.html").exists()
    assert sorted(written) == sorted(tmp_path.glob("*.png")) and len(written) == len(built.report.plots) >= 3
    assert (tmp_path / "pingmesh.png").read_bytes() == built.report.plot("pingmesh").png


def test_cli_exit_codes_for_unknown_incident_and_unreachable_server(
    fleet: Fleet, server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(fleet, server, "--incident", "999999", "--out", str(tmp_path)) == 1
    assert "404 not_found" in capsys.readouterr().err
    nobody = f"http://127.0.0.1:{free_port()}"  # a free port: nothing listens there
    assert main(["report", "--incident", "1", "--server", nobody, "--out", str(tmp_path)]) == 3
    assert "cannot reach" in capsys.readouterr().err
    assert main(["report", "--since", "yesterday-ish", "--server", server.url]) == 2
    assert main(["report", "--incident", "1", "--link-rate", "0", "--server", server.url]) == 2
    assert "link rates must be positive" in capsys.readouterr().err
    assert not any(tmp_path.glob("*.png"))


def test_plotted_series_are_the_stored_ones(built: Built) -> None:
    plot = built.report.plot("port-node-003-mlx5_1-1")
    node, device, port = FLAPPING
    for counter in ("port_receive_data", "port_transmit_data"):
        stored = built.client.call(
            "GET",
            "/api/v1/series",
            {
                "node": node,
                "device": device,
                "port": port,
                "counter": counter,
                "since": built.start,
                "until": built.end,
            },
        )
        assert len(stored) == 1
        points = stored[0]["points"]
        assert plot.data[counter]["ts"] == [p["ts"] for p in points]
        assert plot.data[counter]["values"] == [p["rate"] for p in points]
        rates = [p["rate"] for p in points if p["rate"] is not None]
        assert len(rates) >= 10 and min(rates) < 0.8 * max(rates), "the flap should show as a dip"
    # The evidence signal link_downs_per_second is not stored (the detectors compute it): the report
    # computes it from its stored inputs with the signal's own function; here only link_downed.
    signal = plot.data["signal:link_downs_per_second"]
    downed = built.client.call(
        "GET",
        "/api/v1/series",
        {
            "node": node,
            "device": device,
            "port": port,
            "counter": "link_downed",
            "since": built.start,
            "until": built.end,
        },
    )
    honest = [(p["ts"], p["rate"]) for p in downed[0]["points"] if p["rate"] is not None]
    assert list(zip(signal["ts"], signal["values"], strict=True)) == honest
    assert sum(signal["values"]) > 0


def test_pingmesh_and_nccl_plots_are_the_stored_results(built: Built) -> None:
    ping = built.report.plot("pingmesh").data
    assert ping["nodes"] == [f"node-00{i}" for i in range(1, 7)]
    assert ping["leaf_breaks"] == [3]  # 3 nodes per leaf
    i, j = ping["nodes"].index("node-002"), ping["nodes"].index("node-003")

    def stored(counter: str) -> list[float]:
        rows = built.client.call(
            "GET",
            "/api/v1/series",
            {
                "source": "pingmesh",
                "node": "node-002",
                "device": "node-003",
                "counter": counter,
                "since": built.start,
                "until": built.end,
            },
        )
        key = "rate" if rows[0]["kind"] == "counter" else "value"
        return [p[key] for p in rows[0]["points"] if p[key] is not None]

    assert ping["p99_us"][i][j] == pytest.approx(max(stored("rtt_p99_seconds")) * 1e6)
    loss = sum(stored("probes_lost")) / sum(stored("probes_sent")) * 100
    assert ping["loss_percent"][i][j] == pytest.approx(loss) and loss > 1.0  # the pair crosses the flapping link
    nccl = built.report.plot("nccl-all_reduce").data
    runs = built.client.call("GET", "/api/v1/nccl", {"op": "all_reduce", "since": built.start, "limit": 10_000})
    by_size: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        if r["ts"] <= built.end and r["labels"].get("placement") == "out_of_place":
            by_size[int(r["labels"]["size"])].append(r["values"]["busbw_bytes_per_second"])
    assert nccl["sizes"] == sorted(by_size)
    assert nccl["measured_median"] == [statistics.median(by_size[s]) for s in nccl["sizes"]]
    assert nccl["predicted"] == [predict("all_reduce", s, 2, MODEL).busbw_bytes_per_second for s in nccl["sizes"]]


def test_range_report_lists_the_incident_and_says_when_a_window_is_empty(
    fleet: Fleet, server: ServerProcess, tmp_path: Path
) -> None:
    span = ["--since", str(fleet.end_ts - 180), "--until", str(fleet.end_ts)]
    assert cli(fleet, server, *span, "--out", str(tmp_path / "range")) == 0
    html = (tmp_path / "range" / "report.html").read_text()
    assert f"#{fleet.incident_id} link_flap at {ELEMENT}" in html and "Hottest ports" in html
    assert "node-003" in html.split("Hottest ports")[1]  # the table has rows
    empty = ["--since", "2001-01-01T00:00:00Z", "--until", "2001-01-01T01:00:00Z"]
    assert cli(fleet, server, *empty, "--out", str(tmp_path / "empty")) == 0
    html = (tmp_path / "empty" / "report.html").read_text()
    for words in (
        "No incident was open in this window.",
        "No pingmesh results in this window.",
        "No NCCL-tests results in this window.",
        "No port throughput in this window.",
    ):
        assert words in html
    assert "<img" not in html and not list((tmp_path / "empty").glob("*.png"))


# --- the REST route --------------------------------------------------------------------------------------


async def test_route_serves_the_report_as_html(fleet: Fleet, api: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {fleet.read}"}
    resp = await api.get(
        f"/api/v1/incidents/{fleet.incident_id}/report",
        headers=auth,
        params={"pad": PAD, "hcas_per_node": 2, "gpus_per_node": 2, "nodes_per_leaf": 3},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    html = resp.text
    assert f"#{fleet.incident_id} link_flap at {ELEMENT}" in html
    assert html.count("data:image/png;base64,") >= 3  # port rates, pingmesh, NCCL


async def test_route_errors_are_json(fleet: Fleet, api: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {fleet.read}"}
    missing = await api.get("/api/v1/incidents/999999/report", headers=auth)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    assert missing.json()["error"] == "not_found" and "999999" in missing.json()["message"]
    anonymous = await api.get(f"/api/v1/incidents/{fleet.incident_id}/report")
    assert anonymous.status_code == 401 and anonymous.json()["error"] == "unauthorized"
    for rate in ("fast", " ", "0"):  # the model divides by the link rate
        bad = await api.get(f"/api/v1/incidents/{fleet.incident_id}/report", headers=auth, params={"link_rate": rate})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request", (rate, bad.text)
        assert "link" in bad.json()["message"]


def test_report_shows_the_incident_as_the_cli_page_does(
    fleet: Fleet, server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evidence in units against the rule's threshold, ranked candidates and next checks: the same
    rows in the HTML report as on `fabricd incident ID`."""
    import html as html_mod
    import re

    assert cli(fleet, server, "--incident", str(fleet.incident_id), "--out", str(tmp_path)) == 0
    capsys.readouterr()
    html = (tmp_path / "report.html").read_text()
    main(["incident", str(fleet.incident_id), "--server", server.url, "--token", fleet.read])
    page = capsys.readouterr().out

    def html_rows(after: str) -> list[list[str]]:
        table = html.split(after, 1)[1].split("</table>", 1)[0]
        return [
            [html_mod.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)
            if "<td" in row
        ]

    def page_rows(title: str) -> list[list[str]]:
        section = next(p for p in page.split("\n\n") if p.startswith(title)).split("\n")
        return [re.split(r"\s{2,}", line.strip()) for line in section[2:] if line.startswith("  ")]

    evidence = html_rows("<h4>Evidence (furthest past its threshold first)</h4>")
    assert evidence and evidence == page_rows("Evidence")
    # rules/detection/loss.yaml: link_down fires above 0 events/s.
    assert {r[3] for r in evidence if r[0] == "link_downs_per_second"} == {"> 0/s"}
    cands = [[c for c in r if c] for r in html_rows("<h4>Localization candidates")]
    assert cands == page_rows("Localization")
    steps = [html_mod.unescape(s) for s in re.findall(r"<li>(.*?)</li>", html.split("<h4>Next checks</h4>", 1)[1])]
    assert steps[0].startswith(f"Inspect the cable and transceivers of {ELEMENT}: ")
    assert steps[-1] == f"The whole picture, with plots: fabricd report --incident {fleet.incident_id}"
