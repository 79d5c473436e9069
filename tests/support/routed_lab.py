"""A routed leaf-spine of network namespaces with real ECMP (issue 16 §6).

Every element is a namespace ``<prefix>-<element>``. Switches are Linux routers (``ip_forward``);
each leaf has one multipath route per other leaf's host prefix over every spine, with
``fib_multipath_hash_policy=3`` and fields 0x37 (the L4 hash of the headers: addresses, ports,
protocol), so flows with different ports take different spines and one flow always the same. The kernel's flow hash is symmetric
(``__flow_hash_consistentify`` orders addresses and ports), and every leaf lists its spines in one
order, so a probe's reply comes back over the spine the probe went up. ICMP errors are not rate
limited (``icmp_ratelimit=0``) so a traceroute per flow gets every answer, and IPv6 is off so a
cable carries only what the lab sends. Neighbours on the cables are permanent (no ARP).

    leaf i (1-based), host k:  host 10.(k-1).i.2/24 on eth0  -  leaf 10.(k-1).i.1/24 on swp<k>
    leaf i ~ spine j:          leaf 10.ij.0.1/30 on swp<hosts+j>  -  spine 10.ij.0.2/30 on swp<i>

(with one host per leaf: gpu-a1 10.0.1.2 - rack1-leaf - spine-a / spine-b - rack2-leaf - gpu-b1 10.0.2.2)

``SMALL`` (two leaves, one host each) is what the path-tracing test needs; ``LEAF_SPINE`` is the
acceptance lab of issue 16: three leaves of four hosts under two spines. Three leaves, not two: in a
two-leaf fabric every packet over ``leaf-1~spine-1`` also crosses ``spine-1~leaf-2`` (there is no
other way through spine-1), so no end-to-end measurement can tell those two links apart; a third
leaf's pairs through spine-1 clear the healthy one.

``Wiring(lldp=True)`` starts an lldpd in every namespace (switches too, as SONiC runs lldpd), named
after its element and announcing port ids as interface names. ``Wiring(management=True)`` adds a
management network: a bridge in namespace ``<prefix>-mgmt``, a ``mgmt0`` in every element
(``10.250.<m>.<n+2>/24``) and one veth to the root namespace (``10.250.<m>.1``, ``mgmt_gateway``),
where the central runs: agents report over it, never over the fabric under test. ``m`` comes from
the prefix, so two labs on one machine (two test sessions) do not share a subnet. lldpd is kept off
``mgmt0``.

Torn down on exit, also when the body raised, and at interpreter exit (``atexit``) should a test
runner die between the two: processes first, then the namespaces (which take their veths along,
the management uplink included); teardown checks that nothing with the prefix is left. A runner
killed outright (SIGKILL, a lost CI machine) runs neither: each lab leaves its owner's pid in
``OWNERS_DIR``, and the next lab to start removes every lab whose owner is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fabricd.topology import LEAF, SPINE, HcaPort, Switch, Topology
from tests.support.lab import delete_namespace, stale_namespaces

OWNERS_DIR = Path("/run/fabricd-routed-lab")  # <prefix>.pid: the process that built that lab
LLDP_SOCKET_DIR = Path("/tmp")  # lldpd cannot be reached through a socket under pytest's 0700 tmp_path


@dataclass(frozen=True, slots=True)
class Wiring:
    racks: tuple[tuple[str, tuple[str, ...]], ...]  # (leaf, the hosts cabled to it, in port order)
    spines: tuple[str, ...]
    lldp: bool = False
    management: bool = False

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(leaf for leaf, _ in self.racks)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for _, hosts in self.racks for h in hosts)

    @property
    def switches(self) -> tuple[str, ...]:
        return (*self.leaves, *self.spines)

    @property
    def elements(self) -> tuple[str, ...]:
        return (*self.hosts, *self.switches)

    def leaf_of(self, host: str) -> str:
        return next(leaf for leaf, hosts in self.racks if host in hosts)

    def leaf_index(self, leaf: str) -> int:
        return self.leaves.index(leaf) + 1

    def host_index(self, host: str) -> int:
        return dict(self.racks)[self.leaf_of(host)].index(host) + 1

    def uplink_port(self, leaf: str, spine: str) -> str:
        """The leaf's interface towards ``spine``."""
        hosts = len(dict(self.racks)[leaf])
        return f"swp{hosts + self.spines.index(spine) + 1}"

    def downlink_port(self, spine: str, leaf: str) -> str:
        """The spine's interface towards ``leaf``."""
        return f"swp{self.leaf_index(leaf)}"


SMALL = Wiring((("rack1-leaf", ("gpu-a1",)), ("rack2-leaf", ("gpu-b1",))), ("spine-a", "spine-b"))
LEAF_SPINE = Wiring(
    (
        ("ib-leaf-3", ("gpu-a17", "gpu-a18", "gpu-a19", "gpu-a20")),
        ("ib-leaf-4", ("gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04")),
        ("ib-leaf-5", ("gpu-c09", "gpu-c10", "gpu-c11", "gpu-c12")),
    ),
    ("ib-spine-1", "ib-spine-2"),
    lldp=True,
    management=True,
)
SPINES = SMALL.spines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def _remove(prefix: str) -> None:
    """Every namespace of a lab and its management uplink (processes in them are killed)."""
    if Path(f"/sys/class/net/{prefix}mg").exists():
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh("ip", "link", "del", f"{prefix}mg")
    for ns in stale_namespaces(prefix):
        with contextlib.suppress(subprocess.CalledProcessError):
            delete_namespace(ns)


def _sh(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30).stdout


@dataclass
class RoutedLab:
    prefix: str
    wiring: Wiring = SMALL

    def __post_init__(self) -> None:
        self._daemons: list[subprocess.Popen[bytes]] = []
        self._atexit = False

    # --- names and addresses -------------------------------------------------------------------

    def ns(self, element: str) -> str:
        return f"{self.prefix}-{element}"

    @property
    def mgmt_ns(self) -> str:
        return f"{self.prefix}-mgmt"

    def exec(self, element: str, *argv: str) -> str:
        return _sh("ip", "netns", "exec", self.ns(element), *argv)

    def host_net(self, host: str) -> str:
        """The first three octets of the host's cable to its leaf (a /24: host .2, leaf .1)."""
        w = self.wiring
        return f"10.{w.host_index(host) - 1}.{w.leaf_index(w.leaf_of(host))}"

    def address(self, host: str) -> str:
        return f"{self.host_net(host)}.2"

    @property
    def mgmt_net(self) -> str:
        return f"10.250.{zlib.crc32(self.prefix.encode()) % 250}"

    @property
    def mgmt_gateway(self) -> str:
        """The root namespace's address on the management network (where the central listens)."""
        return f"{self.mgmt_net}.1"

    def mgmt_address(self, element: str) -> str:
        return f"{self.mgmt_net}.{self.wiring.elements.index(element) + 2}"

    def lldp_socket(self, element: str) -> Path:
        return LLDP_SOCKET_DIR / f"{self.ns(element)}-lldpd.sock"

    def fabric_interfaces(self, element: str) -> list[str]:
        """The element's cabled interfaces (what lldpd and the agents' collectors watch)."""
        w = self.wiring
        if element in w.hosts:
            return ["eth0"]
        if element in w.leaves:
            return [f"swp{k}" for k in range(1, len(dict(w.racks)[element]) + len(w.spines) + 1)]
        return [f"swp{i}" for i in range(1, len(w.leaves) + 1)]

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> RoutedLab:
        self._clear_leftovers()
        atexit.register(self.teardown)
        self._atexit = True
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _clear_leftovers(self) -> None:
        """Labs whose owner died before its teardown (a killed runner) must not break this one."""
        OWNERS_DIR.mkdir(parents=True, exist_ok=True)
        for marker in OWNERS_DIR.glob("*.pid"):
            if not _alive(int(marker.read_text() or "0")):
                _remove(marker.stem)
                marker.unlink(missing_ok=True)
        _remove(self.prefix)  # this prefix's own, whoever left it
        (OWNERS_DIR / f"{self.prefix}.pid").write_text(str(os.getpid()))

    def teardown(self) -> None:
        if self._atexit:
            atexit.unregister(self.teardown)
            self._atexit = False
        for proc in self._daemons:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._daemons:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._daemons = []
        with contextlib.suppress(subprocess.CalledProcessError):  # none: no management network
            if Path(f"/sys/class/net/{self.prefix}mg").exists():
                _sh("ip", "link", "del", f"{self.prefix}mg")  # now: a namespace's own veths go later
        for ns in (*(self.ns(e) for e in self.wiring.elements), self.mgmt_ns):
            with contextlib.suppress(subprocess.CalledProcessError):
                if Path(f"/var/run/netns/{ns}").exists():
                    delete_namespace(ns)
        for element in self.wiring.elements:
            self.lldp_socket(element).unlink(missing_ok=True)
            self.lldp_config(element).unlink(missing_ok=True)
        (OWNERS_DIR / f"{self.prefix}.pid").unlink(missing_ok=True)
        assert stale_namespaces(self.prefix) == []
        assert not Path(f"/sys/class/net/{self.prefix}mg").exists()  # the management uplink went too

    def _cable(self, a: str, a_if: str, a_ip: str, b: str, b_if: str, b_ip: str) -> None:
        _sh("ip", "link", "add", f"{self.prefix}t0", "type", "veth", "peer", "name", f"{self.prefix}t1")
        for tmp, element, name, ip in ((f"{self.prefix}t0", a, a_if, a_ip), (f"{self.prefix}t1", b, b_if, b_ip)):
            _sh("ip", "link", "set", tmp, "netns", self.ns(element))
            self.exec(element, "ip", "link", "set", tmp, "name", name)
            self.exec(element, "ip", "addr", "add", ip, "dev", name)
            self.exec(element, "ip", "link", "set", name, "up")
        # Permanent neighbours: no ARP on the cables, so counted packets are the test's alone.
        for here, here_if, there, there_if, there_ip in ((a, a_if, b, b_if, b_ip), (b, b_if, a, a_if, a_ip)):
            mac = json.loads(self.exec(there, "ip", "-j", "link", "show", "dev", there_if))[0]["address"]
            ip = there_ip.split("/")[0]
            self.exec(here, "ip", "neigh", "replace", ip, "lladdr", mac, "dev", here_if, "nud", "permanent")

    def _build(self) -> None:
        w = self.wiring
        for element in w.elements:
            _sh("ip", "netns", "add", self.ns(element))
            self.exec(element, "ip", "link", "set", "lo", "up")
            self.exec(element, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0")
            # no IPv6 (router solicitations, MLD): a link carries only what the test sends
            self.exec(element, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            self.exec(element, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        for element in w.switches:
            self.exec(element, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for leaf in w.leaves:
            # Policy 3 (custom fields: addresses, protocol, ports) hashes the headers, as a switch
            # ASIC does. Policy 1 would take a forwarded packet's existing L4 hash instead
            # (net/ipv4/route.c, fib_multipath_hash), and veth keeps the hash the sender's socket
            # gave it (sk_txhash, random per socket): two sockets sending the same 5-tuple could
            # then take two spines, which no switch would do.
            self.exec(leaf, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_fields=0x0037")
            self.exec(leaf, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=3")
        for leaf, hosts in w.racks:
            i = w.leaf_index(leaf)
            for k, host in enumerate(hosts, 1):
                net = self.host_net(host)
                self._cable(host, "eth0", f"{net}.2/24", leaf, f"swp{k}", f"{net}.1/24")
                self.exec(host, "ip", "route", "add", "default", "via", f"{net}.1")
            for j, spine in enumerate(w.spines, 1):
                leaf_ip, spine_ip = f"10.{i}{j}.0.1/30", f"10.{i}{j}.0.2/30"
                self._cable(leaf, w.uplink_port(leaf, spine), leaf_ip, spine, w.downlink_port(spine, leaf), spine_ip)
        for leaf in w.leaves:
            i = w.leaf_index(leaf)
            hops = [word for j in range(1, len(w.spines) + 1) for word in ("nexthop", "via", f"10.{i}{j}.0.2")]
            for host in w.hosts:
                if w.leaf_of(host) != leaf:
                    self.exec(leaf, "ip", "route", "add", f"{self.host_net(host)}.0/24", *hops)
        for j, spine in enumerate(w.spines, 1):
            for host in w.hosts:
                i = w.leaf_index(w.leaf_of(host))
                self.exec(spine, "ip", "route", "add", f"{self.host_net(host)}.0/24", "via", f"10.{i}{j}.0.1")
        if w.management:
            self._management()
        if w.lldp:
            self._lldpd()

    def _management(self) -> None:
        mgmt, root_if = self.mgmt_ns, f"{self.prefix}mg"
        _sh("ip", "netns", "add", mgmt)
        _sh("ip", "-n", mgmt, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", mgmt, "link", "set", "br0", "up")
        _sh("ip", "link", "add", root_if, "type", "veth", "peer", "name", "up0", "netns", mgmt)
        _sh("ip", "addr", "add", f"{self.mgmt_gateway}/24", "dev", root_if)
        _sh("ip", "link", "set", root_if, "up")
        _sh("ip", "-n", mgmt, "link", "set", "up0", "master", "br0", "up")
        for n, element in enumerate(self.wiring.elements):
            _sh(
                "ip",
                "link",
                "add",
                "mgmt0",
                "netns",
                self.ns(element),
                "type",
                "veth",
                "peer",
                "name",
                f"p{n}",
                "netns",
                mgmt,
            )
            _sh("ip", "-n", mgmt, "link", "set", f"p{n}", "master", "br0", "up")
            self.exec(element, "ip", "addr", "add", f"{self.mgmt_address(element)}/24", "dev", "mgmt0")
            self.exec(element, "ip", "link", "set", "mgmt0", "up")

    def _lldpd(self) -> None:
        """One lldpd per namespace: named after its element, port ids as interface names (what a
        switch's LLDP says: ``swp3``), a frame every second so the lab converges in seconds.

        The settings go in a file given with ``-O``: lldpd starts paused, applies it, then sends
        (lldpd(8)). Set afterwards with lldpcli, the first frames went out under the machine's
        hostname with a MAC port id: a second neighbour (another MSAP) on the leaf's port for the
        frames' TTL (120 s), which the central took for a second host on that cable."""
        addresses: dict[str, list[str]] = {e: [] for e in self.wiring.elements}
        for address, element in sorted(self.owners().items()):
            addresses[element].append(address)
        for element in self.wiring.elements:
            if self.wiring.management:
                addresses[element].insert(0, self.mgmt_address(element))
            sock = self.lldp_socket(element)
            sock.unlink(missing_ok=True)
            conf = self.lldp_config(element)
            conf.write_text(
                f"configure system hostname {element}\n"
                "configure lldp portidsubtype ifname\n"
                "configure lldp tx-interval 1\n"
            )
            argv = ["ip", "netns", "exec", self.ns(element), "lldpd", "-d", "-u", str(sock), "-O", str(conf)]
            argv += ["-I", ",".join(self.fabric_interfaces(element))]
            # Every address of the element as a management address: a router answers a traced
            # probe from the interface it came in on, and the central places a hop by the
            # addresses each chassis advertises (fabricd/topology/traced.py).
            argv += ["-m", ",".join(addresses[element])]
            self._daemons.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for element in self.wiring.elements:  # up: it answers, under its own name
            self._lldpcli(element, "show", "chassis")

    def lldp_config(self, element: str) -> Path:
        return LLDP_SOCKET_DIR / f"{self.ns(element)}-lldpd.conf"

    def _lldpcli(self, element: str, *words: str, seconds: float = 20.0) -> None:
        """An lldpcli command, retried while the daemon starts (its socket may exist before it answers)."""
        deadline = time.monotonic() + seconds
        while True:
            proc = subprocess.run(
                ["ip", "netns", "exec", self.ns(element), "lldpcli", "-u", str(self.lldp_socket(element)), *words],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{element}: lldpcli {' '.join(words)}: {proc.stderr.strip()}")
            time.sleep(0.2)

    def lldp_command(self, element: str) -> tuple[list[str], list[str]]:
        """The lldp collector's two commands for ``element``'s lldpd (run inside its namespace)."""
        sock = str(self.lldp_socket(element))
        return ["lldpctl", "-u", sock, "-f", "json"], ["lldpcli", "-u", sock, "show", "chassis", "-f", "json"]

    # --- faults ---------------------------------------------------------------------------------

    def qdisc(self, element: str, ifname: str, *spec: str) -> None:
        """``tc qdisc replace dev IFNAME <spec>`` inside ``element`` (a fault on one direction of a cable)."""
        self.exec(element, "tc", "qdisc", "replace", "dev", ifname, *spec)

    def clear_qdisc(self, element: str, ifname: str) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # none there: nothing to clear
            self.exec(element, "tc", "qdisc", "del", "dev", ifname, "root")

    def next_hop(self, src: str, dst: str, proto: str, sport: int, dport: int) -> str:
        """The spine the source's leaf sends this 5-tuple to: the kernel's own FIB lookup with the
        multipath hash (``ip route get ... ipproto sport dport``), an oracle for the lab's flows."""
        w = self.wiring
        leaf = w.leaf_of(src)
        argv = [
            "ip",
            "-j",
            "route",
            "get",
            self.address(dst),
            "from",
            self.address(src),
            "iif",
            f"swp{w.host_index(src)}",
        ]
        argv += ["ipproto", proto, "sport", str(sport), "dport", str(dport)]
        (route,) = json.loads(self.exec(leaf, *argv))
        return next(s for s in w.spines if route["dev"] == w.uplink_port(leaf, s))

    # --- what the lab is, as fabricd sees it ---------------------------------------------------

    def topology(self) -> Topology:
        w = self.wiring
        topo = Topology(link_layer="ethernet")
        for s in w.spines:
            topo.add_switch(Switch(s, SPINE))
        for leaf in w.leaves:
            topo.add_switch(Switch(leaf, LEAF))
            for s in w.spines:
                topo.connect_switches(leaf, s, (w.uplink_port(leaf, s), w.downlink_port(s, leaf)))
        for host in w.hosts:
            leaf = w.leaf_of(host)
            topo.add_hca_port(HcaPort(f"{host}/eth0", host, "eth0", netdev="eth0"))
            topo.connect_host(f"{host}/eth0", leaf, ("eth0", f"swp{w.host_index(host)}"))
        return topo

    def owners(self) -> dict[str, str]:
        """Every fabric address in the lab -> the element that owns it (what the agents' interfaces say)."""
        out = {}
        for element in self.wiring.elements:
            for link in json.loads(self.exec(element, "ip", "-j", "addr", "show")):
                if link.get("ifname") == "mgmt0":
                    continue
                for a in link.get("addr_info", []):
                    if a.get("family") == "inet" and a["local"] != "127.0.0.1":
                        out[a["local"]] = element
        return out

    def rx_packets(self, element: str, ifname: str) -> int:
        stats = json.loads(self.exec(element, "ip", "-j", "-s", "link", "show", "dev", ifname))
        return int(stats[0]["stats64"]["rx"]["packets"])

    def drop_counters(self) -> dict[str, int]:
        """Every packet the lab's kernel dropped so far, by where: each fabric interface's rx and tx
        drops (a veth's are its peer's full backlog), each host's UDP receive errors (/proc/net/snmp,
        per namespace), and the machine's backlog drops (``/proc/net/softnet_stat``, second column,
        all CPUs): when something opens on a healthy lab, these say whether the lab's own kernel lost
        the probes (a starved machine) or not (read in tests/test_leafspine_lab.py's failures)."""
        out: dict[str, int] = {}
        for element in self.wiring.elements:
            cabled = set(self.fabric_interfaces(element))
            for link in json.loads(self.exec(element, "ip", "-j", "-s", "link", "show")):
                if link["ifname"] in cabled:
                    for way in ("rx", "tx"):
                        out[f"{element}:{link['ifname']}:{way}_dropped"] = int(link["stats64"][way]["dropped"])
            if element in self.wiring.hosts:
                rows = [line.split() for line in self.exec(element, "cat", "/proc/net/snmp").splitlines()]
                names, values = [r for r in rows if r[0] == "Udp:"]
                for name in ("InErrors", "RcvbufErrors"):
                    out[f"{element}:udp_{name}"] = int(values[names.index(name)])
        softnet = Path("/proc/net/softnet_stat").read_text().splitlines()
        out["softnet_dropped"] = sum(int(line.split()[1], 16) for line in softnet)
        return out

    def forget(self, procs: Sequence[subprocess.Popen[bytes]]) -> None:
        """Processes ended by their owner: no longer the lab's to stop."""
        self._daemons = [p for p in self._daemons if p not in procs]
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def spawn(
        self, element: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A process inside ``element``'s namespace, stopped with the lab (its output in ``log``)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(element), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        self._daemons.append(proc)
        return proc


@contextlib.contextmanager
def routed_lab(prefix: str, wiring: Wiring = SMALL) -> Iterator[RoutedLab]:
    with RoutedLab(prefix, wiring) as lab:
        yield lab
