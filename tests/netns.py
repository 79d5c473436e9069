"""Network namespaces and veth pairs for tests that need a real kernel datapath.

``veth_pair(prefix)`` creates two namespaces joined by a veth link, each end addressed and up, with
IPv6 off (so no router solicitations or DAD move counters behind a test's back), and always tears
them down, even when the test fails. Names start with the caller's prefix (each engineer has one)
plus a random suffix, so concurrent runs never collide.

    with veth_pair("fdnl") as pair:
        pair.run_a(["tc", "qdisc", "add", "dev", pair.if_a, "root", "tbf", ...])
        send_udp(pair, count=50)
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.helpers import need_binary, need_root

COMMAND_TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class VethPair:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr_a: str = "10.211.0.1"
    addr_b: str = "10.211.0.2"

    def run_a(self, argv: Sequence[str]) -> str:
        return run_in(self.ns_a, argv)

    def run_b(self, argv: Sequence[str]) -> str:
        return run_in(self.ns_b, argv)


def ip(*args: str) -> str:
    return _run([need_binary("ip"), *args])


def _run(argv: Sequence[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def run_in(netns: str, argv: Sequence[str]) -> str:
    """Run ``argv`` inside ``netns`` (``ip netns exec``) and return its stdout."""
    return _run([need_binary("ip"), "netns", "exec", netns, *argv])


@contextmanager
def namespace(name: str) -> Iterator[str]:
    need_root()
    ip("netns", "add", name)
    try:
        run_in(name, ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
        run_in(name, ["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
        ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run([need_binary("ip"), "netns", "del", name], capture_output=True, check=False)


@contextmanager
def veth_pair(prefix: str, queues: int = 1) -> Iterator[VethPair]:
    """Two fresh namespaces ``<prefix>-<rand>a``/``b`` joined by veth ``<prefix><rand>a``/``b``
    with ``queues`` rx and tx queues per end (``ethtool -L`` can then lower the active count)."""
    tag = secrets.token_hex(3)
    pair = VethPair(f"{prefix}-{tag}a", f"{prefix}-{tag}b", f"{prefix}{tag}a", f"{prefix}{tag}b")
    with namespace(pair.ns_a), namespace(pair.ns_b):
        q = ("numrxqueues", str(queues), "numtxqueues", str(queues))
        ip(
            "link",
            "add",
            pair.if_a,
            "netns",
            pair.ns_a,
            *q,
            "type",
            "veth",
            "peer",
            "name",
            pair.if_b,
            "netns",
            pair.ns_b,
            *q,
        )
        for ns, ifname, addr in ((pair.ns_a, pair.if_a, pair.addr_a), (pair.ns_b, pair.if_b, pair.addr_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            ip("-n", ns, "link", "set", ifname, "up")
        _static_neighbours(pair)
        yield pair  # deleting the namespaces deletes the veth ends inside them


def mac_of(netns: str, ifname: str) -> str:
    return str(json.loads(ip("-n", netns, "-j", "link", "show", ifname))[0]["address"])


def _static_neighbours(pair: VethPair) -> None:
    # No ARP on the wire: every datagram a test sends is one frame, and none waits in (or is
    # dropped from) the unresolved-neighbour queue.
    ip("-n", pair.ns_a, "neigh", "replace", pair.addr_b, "lladdr", mac_of(pair.ns_b, pair.if_b), "dev", pair.if_a)
    ip("-n", pair.ns_b, "neigh", "replace", pair.addr_a, "lladdr", mac_of(pair.ns_a, pair.if_a), "dev", pair.if_b)


_SENDER = """
import socket, sys
dst, port, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = 0
for _ in range(count):
    try:
        s.sendto(b"x" * size, (dst, port))
        sent += 1
    except OSError:
        pass  # ENOBUFS when a qdisc drops: the drop is what the caller wants to see
print(sent)
"""


def send_udp(pair: VethPair, count: int, size: int = 100, port: int = 9) -> int:
    """Send ``count`` UDP datagrams from side a to side b; returns how many ``sendto`` accepted."""
    out = pair.run_a([sys.executable, "-c", _SENDER, pair.addr_b, str(port), str(count), str(size)])
    return int(out.strip())
