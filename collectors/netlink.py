"""Interface stats64 and qdisc statistics through rtnetlink (pyroute2), optionally inside a netns.

The side effect sits behind ``NetlinkSource`` (one method, ``snapshot``); the default dumps
RTM_GETLINK and RTM_GETQDISC with pyroute2's ``AsyncIPRoute``. Turning the dump into readings is
pure (``link_readings``, ``qdisc_readings``) and tested on values alone.

Counter widths (they decide wrap handling downstream):
- ``IFLA_STATS64`` is ``struct rtnl_link_stats64``: every field ``__u64``; ``IFLA_CARRIER_CHANGES``
  is a ``__u32`` (include/uapi/linux/if_link.h).
- qdisc ``TCA_STATS2``/``TCA_STATS_BASIC`` is ``struct gnet_stats_basic { __u64 bytes; __u32 packets; }``
  and ``TCA_STATS_QUEUE`` is ``struct gnet_stats_queue { __u32 qlen, backlog, drops, requeues,
  overlimits; }`` (include/uapi/linux/gen_stats.h). The kernel assigns its 64-bit packet count to
  the 32-bit field (net/core/gen_stats.c, ``gnet_stats_copy_basic``), so packets, drops,
  overlimits and requeues wrap at 2^32; ``qlen`` and ``backlog`` are levels (gauges).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Protocol

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.model import Kind, Labels, Reading, labels_of

SOURCE = "netlink"
IFF_LOOPBACK = 0x8
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1  # also clsact's parent
TC_H_UNSPEC = 0

# rtnl_link_stats64 field -> (neutral name, unit); the field name stays as the raw counter.
LINK_FIELDS: dict[str, str] = {
    "rx_bytes": "bytes",
    "tx_bytes": "bytes",
    "rx_packets": "packets",
    "tx_packets": "packets",
    "rx_errors": "packets",
    "tx_errors": "packets",
    "rx_dropped": "packets",
    "tx_dropped": "packets",
    "rx_missed_errors": "packets",
}


@dataclass(frozen=True, slots=True)
class LinkStats:
    ifindex: int
    ifname: str
    loopback: bool
    stats64: dict[str, int] = field(default_factory=dict)
    carrier_changes: int | None = None


@dataclass(frozen=True, slots=True)
class QdiscStats:
    ifindex: int
    kind: str
    handle: int
    parent: int
    bytes: int
    packets: int
    drops: int
    overlimits: int
    requeues: int
    backlog_bytes: int
    backlog_packets: int


@dataclass(frozen=True, slots=True)
class NetlinkSnapshot:
    links: list[LinkStats]
    qdiscs: list[QdiscStats]


class NetlinkSource(Protocol):
    async def snapshot(self) -> NetlinkSnapshot: ...


# ---------------------------------------------------------------------------------------------
# pyroute2 messages -> typed values
# ---------------------------------------------------------------------------------------------


def link_from_msg(msg: Any) -> LinkStats:
    stats = msg.get_attr("IFLA_STATS64")
    return LinkStats(
        ifindex=int(msg["index"]),
        ifname=str(msg.get_attr("IFLA_IFNAME")),
        loopback=bool(msg["flags"] & IFF_LOOPBACK),
        stats64={k: int(v) for k, v in dict(stats).items()} if stats is not None else {},
        carrier_changes=msg.get_attr("IFLA_CARRIER_CHANGES"),
    )


def qdisc_from_msg(msg: Any) -> QdiscStats | None:
    stats2 = msg.get_attr("TCA_STATS2")
    if stats2 is None:
        return None
    basic = stats2.get_attr("TCA_STATS_BASIC") or {}
    queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
    return QdiscStats(
        ifindex=int(msg["index"]),
        kind=str(msg.get_attr("TCA_KIND")),
        handle=int(msg["handle"]),
        parent=int(msg["parent"]),
        bytes=int(basic.get("bytes", 0)),
        packets=int(basic.get("packets", 0)),
        drops=int(queue.get("drops", 0)),
        overlimits=int(queue.get("overlimits", 0)),
        requeues=int(queue.get("requeues", 0)),
        backlog_bytes=int(queue.get("backlog", 0)),
        backlog_packets=int(queue.get("qlen", 0)),
    )


class Pyroute2Source:
    """rtnetlink dumps through one long-lived ``AsyncIPRoute`` (in ``netns`` when given)."""

    def __init__(self, netns: str | None = None) -> None:
        self._netns = netns
        self._ipr: Any = None

    async def _open(self) -> Any:
        if self._ipr is None:
            from pyroute2 import AsyncIPRoute  # lazy: a missing pyroute2 disables this collector only

            # flags=0: never create the namespace (pyroute2's default O_CREAT would).
            ipr = AsyncIPRoute(netns=self._netns, flags=0) if self._netns else AsyncIPRoute()
            await ipr.setup_endpoint()
            self._ipr = ipr
        return self._ipr

    async def snapshot(self) -> NetlinkSnapshot:
        ipr = await self._open()
        links = [link_from_msg(msg) async for msg in await ipr.get_links()]
        qdiscs = [q async for msg in await ipr.get_qdiscs() if (q := qdisc_from_msg(msg)) is not None]
        return NetlinkSnapshot(links, qdiscs)

    async def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None


# ---------------------------------------------------------------------------------------------
# Pure mapping to readings
# ---------------------------------------------------------------------------------------------


def tc_handle(value: int) -> str:
    """tc's ``major:minor`` spelling in hex (``0x10000`` -> ``1:0``), with the special parents named."""
    if value == TC_H_ROOT:
        return "root"
    if value == TC_H_INGRESS:
        return "ingress"
    if value == TC_H_UNSPEC:
        return "none"
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


def link_readings(link: LinkStats) -> list[Reading]:
    out = [
        Reading(SOURCE, link.ifname, "", name, float(link.stats64[name]), unit, Kind.COUNTER, (), name, 64)
        for name, unit in LINK_FIELDS.items()
        if name in link.stats64
    ]
    if link.carrier_changes is not None:
        out.append(
            Reading(
                SOURCE,
                link.ifname,
                "",
                "carrier_changes",
                float(link.carrier_changes),
                "",
                Kind.COUNTER,
                (),
                "carrier_changes",
                32,
            )
        )
    return out


def qdisc_labels(q: QdiscStats) -> Labels:
    return labels_of({"qdisc": q.kind, "handle": tc_handle(q.handle), "parent": tc_handle(q.parent)})


def qdisc_readings(ifname: str, q: QdiscStats) -> list[Reading]:
    labels = qdisc_labels(q)

    def reading(counter: str, value: int, unit: str, kind: Kind, width: int) -> Reading:
        return Reading(SOURCE, ifname, "", counter, float(value), unit, kind, labels, f"qdisc_{counter}", width)

    return [
        reading("bytes", q.bytes, "bytes", Kind.COUNTER, 64),
        reading("packets", q.packets, "packets", Kind.COUNTER, 32),
        reading("drops", q.drops, "packets", Kind.COUNTER, 32),
        reading("overlimits", q.overlimits, "events", Kind.COUNTER, 32),
        reading("requeues", q.requeues, "packets", Kind.COUNTER, 32),
        reading("backlog_bytes", q.backlog_bytes, "bytes", Kind.GAUGE, 0),
        reading("backlog_packets", q.backlog_packets, "packets", Kind.GAUGE, 0),
    ]


# ---------------------------------------------------------------------------------------------
# The collector
# ---------------------------------------------------------------------------------------------


def _matcher(pattern: str) -> Callable[[str], bool]:
    if pattern.startswith("re:"):
        regex = re.compile(pattern[3:])
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatchcase(name, pattern)


class NetlinkOptions(CollectorOptions):
    interfaces: list[str] = []  # globs or ``re:<regex>``; empty = every non-loopback interface
    exclude: list[str] = []
    netns: str | None = None
    qdiscs: bool = True


def default_source(options: NetlinkOptions) -> NetlinkSource:
    return Pyroute2Source(options.netns)


@dataclass(frozen=True, slots=True)
class NetlinkFactories(CollectorFactories):
    source: Callable[[NetlinkOptions], NetlinkSource] = default_source


class NetlinkCollector:
    name: ClassVar[str] = "netlink"
    Options = NetlinkOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, NetlinkOptions)
        self._opts = ctx.options
        self._source = ctx.factories_for(NetlinkFactories).source(self._opts)
        self._include = [_matcher(p) for p in self._opts.interfaces]
        self._exclude = [_matcher(p) for p in self._opts.exclude]

    def select(self, link: LinkStats) -> bool:
        if any(m(link.ifname) for m in self._exclude):
            return False
        if self._include:
            return any(m(link.ifname) for m in self._include)
        return not link.loopback

    async def collect(self) -> Sequence[Reading]:
        snap = await self._source.snapshot()
        names = {link.ifindex: link.ifname for link in snap.links if self.select(link)}
        out = [r for link in snap.links if link.ifindex in names for r in link_readings(link)]
        if self._opts.qdiscs:
            out += [r for q in snap.qdiscs if q.ifindex in names for r in qdisc_readings(names[q.ifindex], q)]
        return out

    async def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            await close()
