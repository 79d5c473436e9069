"""The netns lab: N hosts (network namespaces) on one bridge, with tbf/pfifo bottlenecks on chosen links.

Topology: every host ``h`` is namespace ``<prefix>-<h>`` with interface ``fl-<h>`` (address
``10.211.0.<i+1>/24``, MAC ``02:fd:1a:00:00:<i+1>``) cabled by a veth pair to port ``fl-<h>-sw`` of
bridge ``flbr0`` in namespace ``<prefix>-sw``. Neighbours and the bridge FDB are static so a
congested or lossy link never loses an ARP reply or floods unknown unicast to innocent ports.

A bottleneck is a ``tbf`` (optionally with a ``pfifo`` child for a small packet limit) on one
direction of one host's link: ``TO_HOST`` is the switch port's egress towards the host (a congested
downlink), ``FROM_HOST`` is the host's own uplink egress. The kernel here has no netem/red.

``Lab`` is a context manager; it first deletes stale namespaces with its prefix, and always tears
everything down on exit (processes it spawned, then the namespaces, which takes their veths along),
even when the body raised. Sockets for in-process agents are opened inside a host namespace by a
short-lived thread that ``setns()``s into it (a socket keeps the namespace it was created in).

``python tests/support/lab.py demo`` runs the congestion demonstration (``make demo``);
``python tests/support/lab.py blast ...`` is the bulk sender the lab starts inside a namespace;
``stream``/``sink`` are the two ends of a TCP bulk flow with a clamped receive window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import enum
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000  # <linux/sched.h>
DEFAULT_PREFIX = "fdlab"
BRIDGE = "flbr0"
SUBNET = "10.211.0."
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
# How the lab starts this module inside a namespace: by path, so no package need be importable there.
SELF = (sys.executable, str(Path(__file__).resolve()))


class Direction(enum.StrEnum):
    TO_HOST = "to_host"  # switch port egress towards the host
    FROM_HOST = "from_host"  # the host's own uplink egress


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """A token bucket (``tbf``) with its queue limit; ``fifo_packets`` swaps in a small pfifo."""

    rate_bits_per_second: int
    limit_bytes: int = 150_000
    burst_bytes: int = 16_000
    fifo_packets: int | None = None


@dataclass(frozen=True, slots=True)
class QdiscStats:
    kind: str
    handle: int
    parent: int
    sent_packets: int
    sent_bytes: int
    drops: int
    overlimits: int
    backlog_bytes: int
    backlog_packets: int


class CommandRunner(Protocol):
    """Runs one setup command; raises ``subprocess.CalledProcessError`` (with stderr) on failure."""

    def __call__(self, argv: Sequence[str]) -> None: ...


def run_command(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)


def _libc_setns(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a throwaway thread that has joined namespace ``ns``; the caller's is untouched."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            _libc_setns(NETNS_DIR / ns)
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=body, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def stale_namespaces(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{prefix}-"))


def _kill_namespace_pids(ns: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    for pid in out.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def delete_namespace(ns: str, run: CommandRunner = run_command) -> None:
    _kill_namespace_pids(ns)  # a leftover sender would keep the namespace (and its veth) alive
    run(["ip", "netns", "del", ns])


class Lab:
    def __init__(
        self,
        hosts: Sequence[str],
        *,
        prefix: str = DEFAULT_PREFIX,
        run: CommandRunner = run_command,
    ) -> None:
        if len(hosts) > 250 or any(len(h) > 8 or not h.isalnum() for h in hosts):
            raise ValueError("up to 250 alphanumeric host names of at most 8 characters (IFNAMSIZ)")
        self.hosts = list(hosts)
        self.prefix = prefix
        self.run = run
        self.switch_ns = f"{prefix}-sw"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.created: list[str] = []

    # --- naming ---------------------------------------------------------------------------------

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def index(self, host: str) -> int:
        return self.hosts.index(host)

    def address(self, host: str) -> str:
        return f"{SUBNET}{self.index(host) + 1}"

    def mac(self, host: str) -> str:
        return f"02:fd:1a:00:00:{self.index(host) + 1:02x}"

    def host_iface(self, host: str) -> str:
        return f"fl-{host}"

    def switch_port(self, host: str) -> str:
        return f"fl-{host}-sw"

    # --- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        for ns in stale_namespaces(self.prefix):
            delete_namespace(ns, self.run)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()

    def _add_ns(self, ns: str) -> None:
        self.run(["ip", "netns", "add", ns])
        self.created.append(ns)
        self.run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _build(self) -> None:
        self._add_ns(self.switch_ns)
        self.run(["ip", "-n", self.switch_ns, "link", "add", BRIDGE, "type", "bridge"])
        self.run(["ip", "-n", self.switch_ns, "link", "set", BRIDGE, "up"])
        for host in self.hosts:
            self._add_host(host)
        for host in self.hosts:
            self._static_neighbours(host)

    def _add_host(self, host: str) -> None:
        ns, iface, port = self.ns(host), self.host_iface(host), self.switch_port(host)
        self._add_ns(ns)
        self.run(
            [
                "ip",
                "link",
                "add",
                iface,
                "netns",
                ns,
                "address",
                self.mac(host),
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch_ns,
            ]
        )
        self.run(["ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", iface])
        self.run(["ip", "-n", ns, "link", "set", iface, "up"])
        self.run(["ip", "-n", self.switch_ns, "link", "set", port, "master", BRIDGE, "up"])
        self.run(["bridge", "-n", self.switch_ns, "fdb", "replace", self.mac(host), "dev", port, "master", "static"])

    def _static_neighbours(self, host: str) -> None:
        for other in self.hosts:
            if other != host:
                self.run(
                    [
                        "ip",
                        "-n",
                        self.ns(host),
                        "neigh",
                        "replace",
                        self.address(other),
                        "lladdr",
                        self.mac(other),
                        "dev",
                        self.host_iface(host),
                        "nud",
                        "permanent",
                    ]
                )

    def teardown(self) -> None:
        for proc in self.processes:
            _stop(proc)
        self.processes = []
        errors = []
        for ns in reversed(self.created):
            try:
                delete_namespace(ns, self.run)
            except (subprocess.SubprocessError, OSError) as exc:
                errors.append(f"{ns}: {exc}")
        self.created = []
        if errors:
            raise RuntimeError("lab teardown left namespaces behind: " + "; ".join(errors))

    # --- bottlenecks ----------------------------------------------------------------------------

    def _link_end(self, host: str, direction: Direction) -> tuple[str, str]:
        if direction is Direction.TO_HOST:
            return self.switch_ns, self.switch_port(host)
        return self.ns(host), self.host_iface(host)

    def shape(self, host: str, direction: Direction, bottleneck: Bottleneck) -> None:
        ns, dev = self._link_end(host, direction)
        b = bottleneck
        self.run(
            [
                "tc",
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                f"{b.rate_bits_per_second}bit",
                "burst",
                str(b.burst_bytes),
                "limit",
                str(b.limit_bytes),
            ]
        )
        if b.fifo_packets is not None:
            self.run(
                [
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    "pfifo",
                    "limit",
                    str(b.fifo_packets),
                ]
            )

    def qdisc_stats(self, host: str, direction: Direction) -> list[QdiscStats]:
        """Every qdisc on one link end, read over netlink (pyroute2) from inside the namespace.

        The read runs in ``in_netns``'s own thread: pyroute2's sync API starts an event loop, which
        cannot nest in a caller's running one.
        """
        ns, dev = self._link_end(host, direction)
        return in_netns(ns, lambda: _read_qdiscs(dev))

    # --- traffic --------------------------------------------------------------------------------

    def open_socket(
        self, host: str, family: int = socket.AF_INET, kind: int = socket.SOCK_DGRAM, proto: int = 0
    ) -> socket.socket:
        return in_netns(self.ns(host), lambda: socket.socket(family, kind, proto))

    def socket_factory(self, host: str) -> Callable[[int], socket.socket]:
        """A ``fabricd.probe.SocketFactory`` making UDP sockets inside ``host``."""
        return lambda family: self.open_socket(host, family)

    def spawn(self, host: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(host), *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.processes.append(proc)
        return proc

    def blast(
        self,
        src: str,
        dst: str,
        *,
        rate_bytes_per_second: int,
        seconds: float,
        port: int = 9,
        size: int = 1200,
        poisson: bool = False,
    ) -> subprocess.Popen[bytes]:
        """A bounded UDP bulk flow from ``src`` to ``dst`` (a separate process inside ``src``)."""
        argv = [
            *SELF,
            "blast",
            self.address(dst),
            str(port),
            str(rate_bytes_per_second),
            str(seconds),
            str(size),
            *(["--poisson"] if poisson else []),
        ]
        return self.spawn(src, argv)

    def stream(
        self,
        src: str,
        dst: str,
        *,
        window_bytes: int,
        seconds: float,
        port: int = 5201,
    ) -> subprocess.Popen[bytes]:
        """A TCP bulk flow from ``src`` to ``dst`` whose receive window is clamped to ``window_bytes``.

        Congestion without loss: TCP never has more than the advertised window in flight, so behind
        a bottleneck with a larger queue limit the flow keeps a standing queue of about the window
        and nothing is dropped (a UDP flow above the bottleneck rate fills the queue and then drops
        the excess). Returns the sender; the sink is started first and ends on its own.
        """
        address = self.address(dst)
        self.spawn(dst, [*SELF, "sink", address, str(port), str(window_bytes), str(seconds + 5)])
        return self.spawn(src, [*SELF, "stream", address, str(port), str(seconds)])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)
    if proc.stderr is not None:
        proc.stderr.close()


def _read_qdiscs(dev: str) -> list[QdiscStats]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=dev)[0]
        return [_qdisc_stats(msg) for msg in ipr.get_qdiscs(index=index)]


def _qdisc_stats(msg: Any) -> QdiscStats:
    stats2 = msg.get_attr("TCA_STATS2")
    basic = stats2.get_attr("TCA_STATS_BASIC") or {}
    queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
    return QdiscStats(
        kind=msg.get_attr("TCA_KIND"),
        handle=msg["handle"],
        parent=msg["parent"],
        sent_packets=basic.get("packets", 0),
        sent_bytes=basic.get("bytes", 0),
        drops=queue.get("drops", 0),
        overlimits=queue.get("overlimits", 0),
        backlog_bytes=queue.get("backlog", 0),
        backlog_packets=queue.get("qlen", 0),
    )


# --- the bulk sender (runs as its own process inside a namespace) --------------------------------


def blast(
    address: str,
    port: int,
    rate_bytes_per_second: int,
    seconds: float,
    size: int,
    poisson: bool = False,
    sport: int = 0,
) -> int:
    """Send UDP datagrams at a paced rate for a bounded time; returns how many were sent.

    Paced finely (what is owed every ~0.5 ms), not in big bursts: a bursty sender leaves a small FIFO
    room between bursts and other flows slip through, which is not what a congested link looks like.
    ``poisson`` draws the gaps from an exponential distribution instead (same mean rate): the
    arrivals of many independent senders, which overflow a small FIFO now and then even below the
    link rate (M/D/1/K) while leaving it room most of the time.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if sport:  # a chosen source port: the flow's ECMP path is chosen with it (the routed lab)
        sock.bind(("", sport))
    payload = bytes(size)
    packets_per_second = rate_bytes_per_second / size
    rng = random.Random()
    start = time.monotonic()
    sent, due = 0, 0.0
    while (elapsed := time.monotonic() - start) < seconds:
        while due <= elapsed:
            with contextlib.suppress(OSError):  # ENOBUFS under a full qdisc is the point
                sock.sendto(payload, (address, port))
            sent += 1
            due += rng.expovariate(packets_per_second) if poisson else 1.0 / packets_per_second
        time.sleep(0.0005)
    return sent


def sink(address: str, port: int, window_bytes: int, seconds: float) -> int:
    """Accept one TCP connection and read it to the end; returns the bytes received.

    ``TCP_WINDOW_CLAMP`` on the listener is inherited by the accepted socket (tcp(7)): the window
    this receiver advertises, hence what the sender may have in flight, stays at ``window_bytes``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, window_bytes)
        listener.bind((address, port))
        listener.listen(1)
        listener.settimeout(seconds)
        conn, _ = listener.accept()
        total = 0
        with conn:
            conn.settimeout(seconds)
            while chunk := conn.recv(1 << 16):
                total += len(chunk)
        return total


def stream(address: str, port: int, seconds: float, sport: int = 0) -> int:
    """Send a TCP bulk flow for a bounded time (retrying the connect while the sink starts).

    Congestion control is pinned to cubic, which is loss-based and so keeps all it may send in the
    bottleneck queue; a host defaulting to BBR would drain the queue it measures (BBR's design),
    leaving no standing queue to see.
    """
    deadline = time.monotonic() + seconds
    sock = _connect(address, port, deadline, sport)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
    payload = bytes(1 << 16)
    sent = 0
    with sock:
        sock.settimeout(max(1.0, seconds))
        while time.monotonic() < deadline:
            sock.sendall(payload)
            sent += len(payload)
    return sent


def _connect(address: str, port: int, deadline: float, sport: int = 0) -> socket.socket:
    while True:
        try:
            return socket.create_connection((address, port), timeout=1.0, source_address=("", sport) if sport else None)
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


# --- demo ---------------------------------------------------------------------------------------


async def _demo(seconds: float) -> None:
    from collectors import REGISTRY
    from collectors.pingmesh import PingmeshCollector, PingmeshFactories
    from fabricd.collector import build

    with Lab(["h0", "h1", "h2", "h3"]) as lab:
        lab.shape("h2", Direction.TO_HOST, Bottleneck(rate_bits_per_second=8_000_000))
        agents = []
        for host in lab.hosts:
            peers = [{"name": o, "address": lab.address(o), "rate_per_second": 20} for o in lab.hosts if o != host]
            agent = build(
                "pingmesh",
                {"peers": peers, "listen_address": lab.address(host)},
                node=host,
                sysfs_root=Path("/sys"),
                registry=REGISTRY,
                factories=[PingmeshFactories(socket=lab.socket_factory(host))],
            )
            assert isinstance(agent, PingmeshCollector)
            agents.append(agent)
        print("h0 sends a bulk flow to h2 through an 8 Mbit/s tbf on h2's downlink; p50 RTT from h1:")
        lab.blast("h0", "h2", rate_bytes_per_second=2_000_000, seconds=seconds / 2, size=1200)
        for second in range(int(seconds)):
            await asyncio.sleep(1)
            per_agent = [await a.collect() for a in agents]
            p50 = {r.device: r.value for r in per_agent[1] if r.counter == "rtt_p50"}
            print(
                f"t={second + 1:2d}s  "
                + "  ".join(f"{h}: {p50.get(h, float('nan')) * 1e3:7.2f} ms" for h in ("h0", "h2", "h3"))
            )
        for agent in agents:
            await agent.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/support/lab.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("blast", help="paced UDP bulk sender")
    b.add_argument("address")
    b.add_argument("port", type=int)
    b.add_argument("rate", type=int, help="bytes per second")
    b.add_argument("seconds", type=float)
    b.add_argument("size", type=int)
    b.add_argument("--poisson", action="store_true", help="exponential gaps instead of even pacing")
    b.add_argument("--sport", type=int, default=0, help="source port (default: any)")
    k = sub.add_parser("sink", help="TCP receiver with a clamped window")
    k.add_argument("address")
    k.add_argument("port", type=int)
    k.add_argument("window", type=int, help="bytes")
    k.add_argument("seconds", type=float)
    t = sub.add_parser("stream", help="TCP bulk sender")
    t.add_argument("address")
    t.add_argument("port", type=int)
    t.add_argument("seconds", type=float)
    t.add_argument("--sport", type=int, default=0, help="source port (default: any)")
    d = sub.add_parser("demo", help="congestion demo on a 4-host lab (needs root)")
    d.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args(argv)
    if args.cmd == "blast":
        blast(args.address, args.port, args.rate, args.seconds, args.size, args.poisson, args.sport)
    elif args.cmd == "sink":
        sink(args.address, args.port, args.window, args.seconds)
    elif args.cmd == "stream":
        stream(args.address, args.port, args.seconds, args.sport)
    else:
        asyncio.run(_demo(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
