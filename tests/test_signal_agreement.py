"""One signal, one number: the agent's exported ECN ratio, the incident rule's signal and the report's
plotted value agree on the same samples.

A RoCE port (mlx5 sysfs tree, the simulator's writer) is read by the real infiniband collector for a
few scrapes in which the ECN-marked share of received packets changes (and once drops below the
1,000 packets/s floor). The agent's pipeline (``RateEngine`` then ``derive``) turns the readings
into samples and its exporter renders them (``fabricd_derived_ecn_marked_ratio``). The same batches
are stored by the central (``Store.ingest``), the detection loop opens a congestion incident with the
real engine, and the incident report is built the way ``GET /api/v1/incidents/{id}/report`` builds
it. Once with the agent's derived samples stored (the report plots them) and once without (the
report computes the signal from the stored counters, with the signal table's function).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.infiniband import InfinibandCollector
from fabricd.collector import CollectorContext
from fabricd.counters import RateEngine
from fabricd.derived import derive
from fabricd.detect.engine import DetectionEngine
from fabricd.detect.signals import Extractor
from fabricd.exposition import render
from fabricd.model import Batch, IncidentKind, Sample
from fabricd.report import ReportQuery, build_report
from fabricd.server import db
from fabricd.server.app import create_app
from fabricd.server.auth import ANONYMOUS
from fabricd.server.detection import DetectionLoop, EngineFeed
from fabricd.server.report_source import ServiceSource
from fabricd.settings import ServerSettings
from fabricd.sim.sysfstree import MLX5_CONG_COUNTERS, DeviceTree, PortTree, write_infiniband_tree

NODE, DEVICE, PORT = "node-007", "mlx5_0", "1"
T0, STEP = 1_700_000_000.0, 10.0
# Per scrape interval: (received packets, ECN-marked packets). 2,000 packets in 10 s is 200/s: below
# the 1,000/s floor, so that interval has no ratio anywhere.
TRAFFIC = [(4_000_000, 480_000), (4_000_000, 300_000), (5_000_000, 600_000), (2_000, 1_000), (4_000_000, 520_000)]
TRAFFIC += [(4_000_000, 470_000)] * 3


def _tree(root: Path, received: int, marked: int) -> None:
    hw = {name: 0 for name in MLX5_CONG_COUNTERS} | {"np_ecn_marked_roce_packets": marked, "lifespan": 10}
    counters = {"port_rcv_packets": received, "port_xmit_packets": received, "port_rcv_data": received * 1024}
    port = PortTree(link_layer="Ethernet", rate="200 Gb/sec (2X NDR)", counters=counters, hw_counters=hw)
    write_infiniband_tree(root, {DEVICE: DeviceTree(ports={PORT: port})})


def _agent_scrapes(root: Path) -> list[tuple[float, list[Sample]]]:
    """What the agent ships: every scrape's samples and the signals it derived from them."""
    collector = InfinibandCollector(CollectorContext(NODE, root))
    engine = RateEngine()
    received = marked = 1_000_000
    out = []
    try:
        for i, (dr, dm) in enumerate([(0, 0), *TRAFFIC]):
            received, marked = received + dr, marked + dm
            _tree(root, received, marked)
            samples = engine.update(T0 + i * STEP, collector.scrape())
            out.append((T0 + i * STEP, samples + derive(samples)))
    finally:
        collector.close()
    return out


def _exported(scrapes: list[tuple[float, list[Sample]]]) -> dict[float, float]:
    """The ECN ratio the agent's exporter renders, per scrape."""
    got = {}
    for ts, samples in scrapes:
        for family in text_string_to_metric_families(render(samples, NODE).decode()):
            for s in family.samples:
                if s.name == "fabricd_derived_ecn_marked_ratio" and s.labels["port"] == PORT:
                    got[ts] = s.value
    return got


def _central(tmp: Path, scrapes: list[tuple[float, list[Sample]]]) -> tuple[object, int]:
    settings = ServerSettings(db=f"sqlite:///{tmp / 'fabricd.db'}", data_dir=tmp, token_cache_seconds=0)
    svc = create_app(settings).state.services
    db.prepare(svc.store.engine)
    for k, (ts, samples) in enumerate(scrapes):
        svc.store.writer.ingest(Batch(NODE, "test", f"{NODE}-{k}", samples, created_ts=ts), ts, 20_000)
    engine = DetectionEngine()
    loop = DetectionLoop(
        svc.store.stream, svc.store.incidents, EngineFeed(engine), svc.metrics, clock=lambda: scrapes[-1][0]
    )
    while loop.step():
        pass
    incidents = [r for r in svc.store.incidents.query() if r.kind == IncidentKind.CONGESTION.value]
    assert [r.element for r in incidents] == [f"{NODE}/{DEVICE}"]
    return svc, incidents[0].id


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[float, list[Sample]]]:
    return _agent_scrapes(tmp_path_factory.mktemp("sys"))


def test_the_agent_exports_the_ratio_with_its_floor(scrapes: list[tuple[float, list[Sample]]]) -> None:
    exported = _exported(scrapes)
    intervals = {T0 + (i + 1) * STEP: traffic for i, traffic in enumerate(TRAFFIC)}
    expected = {ts: m / r for ts, (r, m) in intervals.items() if r / STEP >= 1000}
    assert exported == pytest.approx(expected, rel=1e-12)
    assert T0 + 4 * STEP not in exported  # 200 received packets/s: no ratio, not a noisy one


@pytest.mark.parametrize("ship_derived", [True, False], ids=["derived stored", "counters only"])
def test_exported_ratio_incident_evidence_and_report_plot_agree(
    scrapes: list[tuple[float, list[Sample]]], tmp_path: Path, ship_derived: bool
) -> None:
    exported = _exported(scrapes)
    shipped = [(ts, [s for s in samples if ship_derived or s.reading.source != "derived"]) for ts, samples in scrapes]
    svc, incident_id = _central(tmp_path, shipped)
    source = ServiceSource(svc, ANONYMOUS)  # type: ignore[arg-type]
    stored = source.get("series", node=NODE, counter="ecn_marked_ratio", limit=10)
    assert len(stored) == (1 if ship_derived else 0)  # without it the report must compute the signal
    inc = source.get("incident", id=incident_id)
    evidence = [e for e in inc["evidence"] if e["signal"] == "ecn_marked_ratio"]
    assert evidence and all(e["value"] == round(exported[e["ts"]], 6) for e in evidence)
    report = build_report(source, ReportQuery(incident_id=incident_id, pad_seconds=600.0), scrapes[-1][0])
    plotted = report.plot(f"port-{NODE}-{DEVICE}-{PORT}").data["signal:ecn_marked_ratio"]
    assert dict(zip(plotted["ts"], plotted["values"], strict=True)) == exported  # the same floats


def test_the_detectors_see_the_exported_value_at_every_scrape(scrapes: list[tuple[float, list[Sample]]]) -> None:
    seen: dict[str, dict[float, float]] = defaultdict(dict)

    def emit(signal: str, node: str, device: str, port: str, labels: object, ts: float, value: float) -> None:
        seen[signal][ts] = value

    engine = DetectionEngine()
    engine.extractor = Extractor(emit)  # the engine's signal stage, its output kept instead of ruled on
    for _, samples in scrapes:
        engine.process([(NODE, s) for s in samples if s.reading.source != "derived"])
    assert seen["ecn_marked_ratio"] == _exported(scrapes)
