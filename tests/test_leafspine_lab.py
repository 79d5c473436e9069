"""Issue 16's acceptance on a routed leaf-spine of network namespaces with real ECMP
(tests/support/routed_lab.py: three leaves of four hosts, two spines, lldpd everywhere), real
``fabricd agent`` processes in every namespace and a real ``fabricd server``
(tests/support/routed_fleet.py). Nothing is uploaded by hand: no topology, no routes.

- The central's topology, assembled from the agents' LLDP, is the lab's wiring: every link, both
  ends, the port names at both ends; hosts and switches classed from it (``gpu-a17`` a host,
  ``ib-leaf-3`` a leaf).
- Faults while traffic runs, each on one leaf-spine link, one direction (the leaf's egress towards
  the spine): congestion, a ``tbf`` with a TCP flow keeping a standing queue in it; loss, a ``tbf``
  with a tiny ``pfifo`` that Poisson arrivals overflow. The flows are pinned to the faulty link by
  their 5-tuple (the kernel's own multipath lookup, ``RoutedLab.next_hop``). Each fault opens one
  incident, nothing else opens while it lasts, and nothing but an earlier fault's incident is open
  when it starts, unless the lab's own kernel dropped packets where that incident points (then the
  lab, not the detector, was lossy: a fresh central, and the check again).

One lab, one central and one set of agents for the module (building them takes ~30 s of a
machine); each fault is short (it ends once its incident has opened, plus a few scrapes in which
nothing else may open).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabricd.topology import ElementKind, from_doc, to_doc
from tests.helpers import need_binary, need_root
from tests.support.lab import SELF
from tests.support.routed_fleet import (
    INTERVAL_SECONDS,
    LabCentral,
    lab_central,
    start_agent,
    start_agents,
    stop_agents,
    wait_for,
)
from tests.support.routed_lab import LEAF_SPINE, RoutedLab

pytestmark = [pytest.mark.root, pytest.mark.slow]
PREFIX = f"fdls{os.getpid() % 1000}"
PROBE_PORT = 33434  # pingmesh's responder port (collectors/pingmesh.py DEFAULT_PORT)
RATE = "8mbit"  # the faulty link's rate: 1 MB/s
QUIET_SCRAPES = 3  # after the incident opened: scrapes in which nothing else may open
FAULT_SECONDS = 60.0  # upper bound of one fault's traffic (it is stopped once judged)
LOSS_WINDOW_SECONDS = 60.0  # probe_loss's window (rules/detection/loss.yaml)
FRESH_TRIES = 3  # fresh centrals started until one opens nothing in its restart's wake (_clean_start)


@dataclass
class Lab:
    net: RoutedLab
    central: LabCentral
    data: Path
    agents: list[subprocess.Popen[bytes]]
    tracing: bool = True
    baselined: bool = False  # the central has had every pair long enough for its RTT baselines
    faults: set[tuple[str, str]] = field(default_factory=set)  # (kind, element) this central opened for a fault
    drops: dict[str, int] = field(default_factory=dict)  # kernel drop counters at the last clean start or fault end

    def restart(self, tracing: bool) -> None:
        """The agents again, with path tracing on or off, on a fresh central (no routes, no incidents)."""
        before = set(_incidents(self.central))  # the earlier faults' (winding down)
        stop_agents(self.agents)
        self.net.forget(self.agents)
        self.agents = start_agents(self.net, self.central, self.data / f"agents-{tracing}", _options(tracing))
        self.tracing, self.baselined = tracing, False
        self.faults.clear()
        _clean_start(self, before)


def _options(tracing: bool) -> dict[str, dict[str, Any]]:
    return {"pingmesh": {"trace_paths": tracing}}


def _clean_start(lab: Lab, before: set[str] | None = None) -> None:
    """Every agent up and probing, and nothing opened meanwhile (but the incidents ``before``): the
    agents start one after another, and the probes to hosts whose agent has not started yet go
    unanswered (before the responder starts, fabricd/detect/responders.py: packet_loss opened on
    ib-spine-1, 46 pairs). Then a fresh central, so that each test starts from nothing."""
    hosts = lab.net.wiring.hosts
    pairs = len(hosts) * (len(hosts) - 1)
    wait_for("every probe pair measured", lambda: len(lab.central.get("/api/v1/pingmesh")) >= pairs, 120)
    time.sleep(5 * INTERVAL_SECONDS)  # the last agent's first scrapes (its peers' first probes to it)
    opened = {k: i for k, i in _incidents(lab.central).items() if k not in (before or set())}
    assert opened == {}, f"the fleet's start: {_describe(opened)}"
    # A fresh central: every agent drains what it spooled while the central was away, all at once
    # on this machine's 2 cores, and for a moment replies come late everywhere. One CI run (at
    # 9805d4d) saw 60 pairs on every leaf, pairs within one leaf among them, each lose 1-6 probes
    # within 2.6 s, and packet_loss opened on gpu-b04's host link: 8 peers had lost 1 probe of
    # ~150 to it, over the 0.3 % threshold. That burst is the harness's (a restarted central),
    # not the fabric's, so the central starts afresh until it opens nothing in the restart's wake;
    # after that, anything opened before a fault is still a stray (``_run_fault``).
    for _ in range(FRESH_TRIES):
        lab.central.fresh()
        if lab.tracing:  # every pair's route, from the agents' traces (none uploaded)
            wait_for("every pair traced", lambda: _routes(lab.central) >= pairs, 120)
        _quiet(lab, pairs)
        if not (opened := _incidents(lab.central)):
            lab.drops = lab.net.drop_counters()
            return
    assert opened == {}, f"every fresh central, {FRESH_TRIES} of them: {_describe(opened)}"


def _quiet(lab: Lab, pairs: int, scrapes: int = 3, seconds: float = 60.0) -> None:
    """Until ``scrapes`` scrapes in a row have every pair measured without a lost probe (bounded):
    a restart starves a 2-core machine's agents for a while, and RTT baselines taken then are
    noise, not the fabric's normal."""
    deadline, clean = time.monotonic() + seconds, 0
    while clean < scrapes and time.monotonic() < deadline:
        time.sleep(INTERVAL_SECONDS)
        matrix = lab.central.get("/api/v1/pingmesh", since=f"-{INTERVAL_SECONDS:g}s")
        ok = len(matrix) >= pairs and not any(p["loss_ratio"] for p in matrix)
        clean = clean + 1 if ok else 0


def _routes(central: LabCentral) -> int:
    """How many probe pairs have a route (0 while the central has no topology yet: 404)."""
    resp = httpx.get(f"{central.local}/api/v1/topology", timeout=20)
    return len(resp.json()["routes"]) if resp.status_code == 200 else 0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    need_root()
    for tool in ("ip", "tc", "lldpd", "lldpctl", "lldpcli"):
        need_binary(tool)
    data = tmp_path_factory.mktemp("leafspine")
    with RoutedLab(PREFIX, LEAF_SPINE) as net, lab_central(data / "central", net) as central:
        built = Lab(net, central, data, start_agents(net, central, data / "agents", _options(True)))
        _clean_start(built)
        try:
            yield built
        finally:
            stop_agents(built.agents)


def expected_document(net: RoutedLab) -> dict[str, Any]:
    return to_doc(net.topology())


def _links(doc: dict[str, Any]) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return sorted(
        (link["a"], link["b"], tuple((c["a_port"], c["b_port"]) for c in link.get("cables", [])))
        for link in doc["links"]
    )


def _elements(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return sorted((e["id"], e["type"], e.get("tier", ""), e.get("netdev", "")) for e in doc["elements"])


def test_the_discovered_topology_is_the_wiring(lab: Lab) -> None:
    want = expected_document(lab.net)

    def complete() -> dict[str, Any] | None:
        found = lab.central.get("/api/v1/topology/discovered")
        return found if _links(found["document"]) == _links(want) else None

    found = wait_for("every cable discovered", complete, 90)
    assert found["problems"] == []
    assert _elements(found["document"]) == _elements(want)
    topo = from_doc(found["document"])
    kinds = {e: topo.element(e).kind for e in ("gpu-a17", "ib-leaf-3", "ib-spine-1", "ib-leaf-3~ib-spine-1")}  # type: ignore[union-attr]
    assert kinds == {
        "gpu-a17": ElementKind.NODE,
        "ib-leaf-3": ElementKind.SWITCH,
        "ib-spine-1": ElementKind.SWITCH,
        "ib-leaf-3~ib-spine-1": ElementKind.FABRIC_LINK,
    }
    assert (topo.switches["ib-leaf-3"].tier, topo.switches["ib-spine-1"].tier) == ("leaf", "spine")
    assert topo.links["gpu-a17/eth0~ib-leaf-3"].ports == (("eth0", "swp1"),)
    assert topo.links["ib-leaf-5~ib-spine-2"].ports == (("swp6", "swp3"),)
    # what detection localizes over: nothing was pushed, so the discovered graph
    active = lab.central.get("/api/v1/topology")
    assert (_links(active), _elements(active)) == (_links(want), _elements(want))


# Upgrading the agents "a slice at a time" (docs/operations.md) stops each one's probe responder for
# the seconds it takes to come back, and its peers lose the probes sent meanwhile: every pair to it
# at once, which opened packet_loss or link_flap on its healthy host link. Its new responder start
# says those probes were unanswerable (fabricd/detect/responders.py). An agent back later than the
# settlement's lateness (0.5 x 2 s + 5 s here; CI's load once made a 3 s stop that long) is left out
# first: its peers' losses were judged before its new start arrived, and opened packet_loss. While
# it is left out they are not observed now.
RESTARTED = "gpu-b04"
QUICK_SECONDS = 3.0  # a scrape and a half of the lab's
PAST_LATENESS_SECONDS = 0.5 * INTERVAL_SECONDS + 5.0 + 2 * INTERVAL_SECONDS


@pytest.mark.parametrize(
    "down", [pytest.param(QUICK_SECONDS, id="quick"), pytest.param(PAST_LATENESS_SECONDS, id="slow")]
)
def test_an_agent_restarted_opens_nothing(lab: Lab, down: float) -> None:
    index = lab.net.wiring.elements.index(RESTARTED)
    before = _incidents(lab.central)
    stopped = time.time()
    lab.agents[index].terminate()
    lab.net.forget([lab.agents[index]])
    time.sleep(down)
    home = lab.data / ("agents" if lab.tracing else f"agents-{lab.tracing}") / RESTARTED
    lab.agents[index] = start_agent(lab.net, RESTARTED, home)

    def back() -> bool:
        found = lab.central.get(
            "/api/v1/series", node=RESTARTED, source="pingmesh", counter="responder_start_time_seconds", since="-20s"
        )
        return any(pt["value"] > stopped for series in found for pt in series["points"])

    wait_for(f"{RESTARTED}'s agent back", back, 60)
    time.sleep(10 * INTERVAL_SECONDS)  # its peers' lost probes reported and past the rules' for
    new = {k: i for k, i in _incidents(lab.central).items() if k not in before}
    if new:
        _explain(lab, new)
    assert new == {}, _describe(new)

    def increase(counter: str) -> float:
        found = lab.central.get("/api/v1/series", device=RESTARTED, source="pingmesh", counter=counter, since="-60s")
        return sum(s["points"][-1]["value"] - s["points"][0]["value"] for s in found if s["points"])

    # what the peers lost while it was down, none of it answered late: the test had losses to weigh
    assert increase("probes_lost") - increase("probes_late") >= len(lab.net.wiring.hosts) - 1


# --- faults -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str  # the incident it must open
    leaf: str
    spine: str
    src: str  # the flow that loads the faulty link: src (behind leaf) -> dst, over spine
    dst: str

    @property
    def link(self) -> str:
        return f"{self.leaf}~{self.spine}"


# On two leaves and two spines: no probe pair crosses both links (a pair crosses one spine).
CONGESTION = Fault("congestion", "ib-leaf-3", "ib-spine-1", "gpu-a17", "gpu-b01")
LOSS = Fault("packet_loss", "ib-leaf-4", "ib-spine-2", "gpu-b02", "gpu-c10")


def _flow_port(net: RoutedLab, fault: Fault, proto: str, dport: int) -> int:
    """A source port whose flow the kernel sends over the fault's spine."""
    for sport in range(41000, 41200):
        if net.next_hop(fault.src, fault.dst, proto, sport, dport) == fault.spine:
            return sport
    raise AssertionError(f"no {proto} port of {fault.src} -> {fault.dst} hashes onto {fault.spine}")


def _congest(net: RoutedLab, fault: Fault, log: Path) -> list[subprocess.Popen[bytes]]:
    """An 8 Mbit/s tbf with a 200 kB queue, loaded by TCP (cubic) with a 120 kB window: a standing
    ~120 kB queue (120 ms at 1 MB/s), never a drop."""
    uplink = net.wiring.uplink_port(fault.leaf, fault.spine)
    net.qdisc(fault.leaf, uplink, "root", "handle", "1:", "tbf", "rate", RATE, "burst", "16000", "limit", "200000")
    sport, dst = _flow_port(net, fault, "tcp", 5201), net.address(fault.dst)
    sink = net.spawn(fault.dst, [*SELF, "sink", dst, "5201", "120000", str(FAULT_SECONDS + 5)], log)
    stream = [*SELF, "stream", dst, "5201", str(FAULT_SECONDS), "--sport", str(sport)]
    return [sink, net.spawn(fault.src, stream, log)]


def _drop(net: RoutedLab, fault: Fault, log: Path) -> list[subprocess.Popen[bytes]]:
    """An 8 Mbit/s tbf with a 2-packet bucket in front of a 3-packet pfifo, offered Poisson arrivals
    at 60 % of its rate: the FIFO overflows when arrivals bunch (M/D/1/K) and every flow through
    it, probes included, loses some packets, while most probes still find the queue empty (the
    fastest probe of a scrape is not delayed: no standing queue, so no congestion)."""
    uplink = net.wiring.uplink_port(fault.leaf, fault.spine)
    net.qdisc(fault.leaf, uplink, "root", "handle", "1:", "tbf", "rate", RATE, "burst", "3000", "limit", "150000")
    net.qdisc(fault.leaf, uplink, "parent", "1:1", "handle", "10:", "pfifo", "limit", "3")
    sport = _flow_port(net, fault, "udp", 9)
    blast = [*SELF, "blast", net.address(fault.dst), "9", "600000", str(FAULT_SECONDS), "1200", "--poisson"]
    return [net.spawn(fault.src, [*blast, "--sport", str(sport)], log)]


def _no_loss_in_window(lab: Lab) -> None:
    """Until no pair has lost a probe within the loss rule's window (bounded): a loss fault starts
    from a fabric whose pairs all lose nothing. A CI run (untraced) saw pairs into one host losing a
    probe a minute from before the fault, on a saturated machine, and they rode on the fault's pairs
    (fabricd/detect/cover.py). Past the bound the fault starts anyway: the lab's noise is part of
    what the test measures, and the assertions are unchanged."""
    deadline = time.monotonic() + LOSS_WINDOW_SECONDS + 30.0
    while time.monotonic() < deadline:
        matrix = lab.central.get("/api/v1/pingmesh", since=f"-{LOSS_WINDOW_SECONDS:g}s")
        if not any(p["loss_ratio"] for p in matrix):
            return
        time.sleep(INTERVAL_SECONDS)
    lossy = sorted({f"{p['src']}|{p['dst']}" for p in matrix if p["loss_ratio"]})
    print(f"the loss fault starts with {len(lossy)} pairs lossy in the last {LOSS_WINDOW_SECONDS:g} s: {lossy}")


def _incidents(central: LabCentral) -> dict[str, dict[str, Any]]:
    return {i["key"]: i for i in central.get("/api/v1/incidents", limit=1000)}


def _describe(incidents: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(i["kind"], i["element"], i["summary"]) for i in incidents.values()]


def _run_fault(lab: Lab, fault: Fault) -> dict[str, dict[str, Any]]:
    """A clean baseline, then the fault with its traffic until an incident of its kind has opened,
    plus a few scrapes; returns every incident that opened meanwhile (the fault is cleared after)."""
    before, strays = _baseline(lab)
    dropped = _kernel_drops(lab) if strays else {}
    if strays and all(_lab_lost(lab, stray, dropped) for stray in strays):
        # The lab's kernel dropped packets where the stray says (a veth whose peer's backlog was
        # full on a starved machine, say): a true finding on this lab, not the detector's noise;
        # the test needs a healthy fabric.
        print(f"the lab itself lost packets; a fresh central: {_stray_report(lab, strays, dropped)}")
        _clean_start(lab, set(before))
        lab.baselined = False
        lab.faults.clear()
        before, strays = _baseline(lab)
    assert strays == [], _stray_report(lab, strays, _kernel_drops(lab))
    if fault.kind == "packet_loss":
        _no_loss_in_window(lab)
    log = lab.data / f"{fault.kind}-{lab.tracing}.log"
    procs = (_congest if fault.kind == "congestion" else _drop)(lab.net, fault, log)
    try:

        def opened() -> list[dict[str, Any]]:
            return [i for k, i in _incidents(lab.central).items() if k not in before and i["kind"] == fault.kind]

        try:
            wait_for(f"a {fault.kind} incident", opened, 90)
        except AssertionError:
            _explain_probes(lab)
            raise
        time.sleep(QUIET_SCRAPES * INTERVAL_SECONDS)
        new = {k: i for k, i in _incidents(lab.central).items() if k not in before}
        lab.faults.update((i["kind"], i["element"]) for i in new.values() if i["kind"] == fault.kind)
    finally:
        for proc in procs:
            proc.terminate()
        lab.net.forget(procs)
        # The queue drains before the qdisc goes (200 kB at 1 MB/s: 0.2 s): deleting a qdisc drops
        # what it holds, probes included, which would be a loss the fault never caused.
        time.sleep(1.0)
        lab.net.clear_qdisc(fault.leaf, lab.net.wiring.uplink_port(fault.leaf, fault.spine))
        lab.drops = lab.net.drop_counters()  # the next fault's strays are judged on drops after this one
    print(f"{fault.kind} on {fault.link}, tracing {lab.tracing}: before {_describe(before)}; opened {_describe(new)}")
    _explain(lab, new)
    return new


def _baseline(lab: Lab) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The incidents open once every pair has its RTT baseline, and those of them that no earlier
    fault opened: nothing may be open but an earlier fault's incident (still winding down); the
    lab's noise alone once opened congestion on a healthy spine before any fault."""
    if not lab.baselined:  # rtt baselines need 6 scrapes of every pair (latency.yaml)
        time.sleep(8 * INTERVAL_SECONDS)
        lab.baselined = True
    before = _incidents(lab.central)
    return before, [i for i in before.values() if (i["kind"], i["element"]) not in lab.faults]


def _kernel_drops(lab: Lab) -> dict[str, int]:
    """The lab's kernel drop counters that rose since ``lab.drops`` was read (the clean start, or the
    last fault's end: ``RoutedLab.drop_counters``)."""
    now = lab.net.drop_counters()
    return {k: v - lab.drops.get(k, 0) for k, v in now.items() if v != lab.drops.get(k, 0)}


def _lab_lost(lab: Lab, stray: dict[str, Any], dropped: dict[str, int]) -> bool:
    """Whether the lab's own fabric dropped packets at the stray's place: an interface of an element
    it or one of its candidates names (a link names both its ends), not a host's socket (the
    responders report those, and the detector must not count them: fabricd/detect/responders.py)."""
    inc = lab.central.get(f"/api/v1/incidents/{stray['id']}")
    places = {stray["element"], *(c["element"] for c in inc["candidates"])}
    ends = {end for place in places for end in place.split("~")}
    return any(key.split(":")[0] in ends and ":udp_" not in key for key in dropped)


def _stray_report(lab: Lab, strays: list[dict[str, Any]], dropped: dict[str, int]) -> str:
    """What opened on the healthy lab, its pairs' lossy readings, and what the lab's kernel dropped
    meanwhile (``dropped``, ``_kernel_drops``): the lab's noise or the detector's."""
    lines = [f"opened before any fault: {_describe({i['key']: i for i in strays})}"]
    lines.append(f"kernel drops since the clean start or the last fault: {dropped or 'none'}")
    for stray in strays:
        affected = set(lab.central.get(f"/api/v1/incidents/{stray['id']}")["affected"])
        for p in lab.central.get("/api/v1/pingmesh", since="-120s"):
            if f"{p['src']}|{p['dst']}" in affected and p["loss_ratio"]:
                lines.append(f"  {p['src']}|{p['dst']} at {p['ts']}: loss {p['loss_ratio']}")
    return "\n".join(lines)


def _explain_probes(lab: Lab) -> None:
    """When nothing opened: each pair that lost or was slow in the last minute, with its route
    (read when a test fails: the incidents say nothing then)."""
    resp = httpx.get(f"{lab.central.local}/api/v1/topology", timeout=20)
    routes = {(r["src"], r["dst"]): r for r in resp.json().get("routes", [])} if resp.is_success else {}
    matrix = lab.central.get("/api/v1/pingmesh", since="-60s")
    print(f"no incident; {len(matrix)} pair readings in the last 60 s, {len(routes)} routes")
    for p in sorted(matrix, key=lambda p: (p["src"], p["dst"], p["ts"])):
        if p["loss_ratio"] or (p["p99_seconds"] or 0) > 0.01:
            route = routes.get((p["src"], p["dst"]), {})
            print(f"  {p['src']}|{p['dst']} loss {p['loss_ratio']} p99 {p['p99_seconds']}: {route}")


def _explain(lab: Lab, incidents: dict[str, dict[str, Any]]) -> None:
    """Each incident's pairs with the route the central has for them (read when a test fails)."""
    resp = httpx.get(f"{lab.central.local}/api/v1/topology", timeout=20)
    routes = {(r["src"], r["dst"]): r for r in resp.json().get("routes", [])} if resp.is_success else {}

    def spines(elements: list[str] | None) -> list[str] | None:
        return None if elements is None else [e for e in elements if "~ib-spine" in e]

    for summary in incidents.values():
        inc = lab.central.get(f"/api/v1/incidents/{summary['id']}")
        print(f"  {inc['kind']} {inc['element']} candidates {inc['candidates']} ambiguous {inc.get('ambiguous')}")
        for pair in inc["affected"]:
            src, _, dst = pair.partition("|")
            route = routes.get((src, dst), {})
            print(f"    {pair}: {spines(route.get('elements'))} reply {spines(route.get('reply'))}")


# Traced congestion used to pass only some runs (the link's share of slow probed paths sat at the
# pair guard's 75 %). Three causes, each with its own unit test: a probe is its round trip and only
# the request was traced (responders now trace their replies: the lab's Linux hash is symmetric, so
# every pair crossing the link either way is slow); a link is one element for both directions
# (directed votes); and the software routers that forwarded the fault's TCP flow slowed a dozen
# unrelated pairs through the spine by ~100 us, which outvoted the link by count (the votes now
# weigh each pair's queue delay, log-scaled). Since: 10 of 10 local runs, the link first by 0.06-0.19.
@pytest.mark.parametrize("fault", [pytest.param(CONGESTION, id="congestion"), pytest.param(LOSS, id="loss")])
def test_a_fault_on_one_uplink_is_one_incident_on_that_link(lab: Lab, fault: Fault) -> None:
    new = _run_fault(lab, fault)
    assert [(i["kind"], i["element"]) for i in new.values()] == [(fault.kind, fault.link)], _describe(new)
    (summary,) = new.values()
    inc = lab.central.get(f"/api/v1/incidents/{summary['id']}")
    assert (inc["ambiguous"], inc["candidates"][0]["element"]) == (False, fault.link), inc["candidates"]


# Without traces the lab's congestion rests on RTT alone (Linux routers mark no ECN), every round
# trip crosses two of a leaf's uplinks, and the lab's RTT noise on a 2-core machine (17 agents, a
# central, lldpd in 17 namespaces) flagged 30-50 of the 132 pairs at 6-40 sigma at any time. Much of
# that was the prober's common mode (delays._host_share): replayed offline, a run's stored scrapes
# flag 19-28 pairs a scrape outside its faults with the second lowest path's excess taken as a
# quieter host, and 3-13 with the median path's (a congestion opened on a healthy leaf beside the
# fault in 3 of 3 runs here and one CI run, none in 4 runs since). A pair of
# that noise below the leaf vetoed "one of its uplinks" (right in 2 of 5 runs) until weak pairs below
# the leaf beside far stronger ones through its uplinks were set aside (votes.below_is_noise). Untraced
# loss once opened nothing within 90 s, before the lab's lldpd got its settings at start (a phantom
# host on a cable). Every run since both changes passed: 4 fresh-clone CI runs, 5 local ones. The
# fifth CI run named ib-leaf-4 itself for the loss: on its saturated cores 2 of the 12 pairs below
# the leaf lost a probe or two a minute (lossy pairs all weigh 1, so no strength set them apart);
# pairs below a switch are now also noise when a far smaller share of them is bad. A CI run (at
# a326e81) opened gpu-b01's host link beside ib-leaf-4 for the loss: most of gpu-b01's pairs to
# other leaves hashed onto the lossy spine and fired first; its pairs below the leaf now have to
# elect its link too (fabricd/detect/below.py, tests/test_detect_loss.py).
@pytest.mark.parametrize("fault", [pytest.param(CONGESTION, id="congestion"), pytest.param(LOSS, id="loss")])
def test_without_path_tracing_the_fault_is_ambiguous_among_the_leafs_uplinks(lab: Lab, fault: Fault) -> None:
    if lab.tracing:
        lab.restart(tracing=False)
    new = _run_fault(lab, fault)
    # "one of ib-leaf-3's 2 uplinks": the leaf is where the candidates meet, and they are its uplinks
    assert [(i["kind"], i["element"]) for i in new.values()] == [(fault.kind, fault.leaf)], _describe(new)
    (summary,) = new.values()
    inc = lab.central.get(f"/api/v1/incidents/{summary['id']}")
    uplinks = sorted(f"{fault.leaf}~{s}" for s in lab.net.wiring.spines)
    candidates = sorted((c["element"], c["weight"]) for c in inc["candidates"])
    assert (inc["ambiguous"], candidates) == (True, [(u, 0.5) for u in uplinks]), inc["candidates"]
