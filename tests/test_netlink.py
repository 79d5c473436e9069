"""netlink collector: interface stats64 and qdisc statistics from a real tbf qdisc that drops,
checked against ``tc -s qdisc show`` and ``ip -s link show`` run in the same namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collectors.netlink import (
    LinkStats,
    NetlinkCollector,
    NetlinkFactories,
    NetlinkOptions,
    NetlinkSnapshot,
    QdiscStats,
    link_readings,
    qdisc_readings,
    tc_handle,
)
from fabricd.collector import CollectorConfigError, CollectorContext, build
from fabricd.model import Kind
from tests.helpers import need_binary
from tests.netns import VethPair, send_udp, veth_pair

PREFIX = "fdnl"


def test_tc_handles_are_spelled_like_tc() -> None:
    assert tc_handle(0x10000) == "1:0"
    assert tc_handle(0x8001_0002) == "8001:2"
    assert (tc_handle(0xFFFFFFFF), tc_handle(0xFFFFFFF1), tc_handle(0)) == ("root", "ingress", "none")


def test_qdisc_counters_carry_their_kernel_widths() -> None:
    q = QdiscStats(3, "tbf", 0x10000, 0xFFFFFFFF, 5000, 5, 7, 9, 0, 3000, 3)
    got = {r.counter: r for r in qdisc_readings("eth0", q)}
    # gnet_stats_queue is all __u32 and gnet_stats_basic.packets is __u32: they wrap at 2^32.
    assert {c: got[c].width for c in ("packets", "drops", "overlimits", "requeues")} == dict.fromkeys(
        ("packets", "drops", "overlimits", "requeues"), 32
    )
    assert got["bytes"].width == 64
    assert got["backlog_bytes"].kind is Kind.GAUGE and got["backlog_packets"].value == 3
    assert dict(got["drops"].labels) == {"qdisc": "tbf", "handle": "1:0", "parent": "root"}
    assert got["drops"].metric == "qdisc_drops" and got["drops"].device == "eth0"


def test_link_stats_are_u64_and_carrier_changes_u32() -> None:
    link = LinkStats(2, "eth0", False, {"rx_bytes": 10, "tx_packets": 3, "multicast": 1}, 4)
    got = {r.counter: r for r in link_readings(link)}
    assert set(got) == {"rx_bytes", "tx_packets", "carrier_changes"}
    assert (got["rx_bytes"].width, got["rx_bytes"].unit, got["carrier_changes"].width) == (64, "bytes", 32)


class SnapshotSource:
    """A source answering one fixed snapshot (the seam the simulator uses)."""

    def __init__(self, snap: NetlinkSnapshot) -> None:
        self.snap = snap

    async def snapshot(self) -> NetlinkSnapshot:
        return self.snap


async def test_loopback_is_excluded_unless_named() -> None:
    snap = NetlinkSnapshot(
        [LinkStats(1, "lo", True, {"rx_bytes": 1}), LinkStats(2, "eth0", False, {"rx_bytes": 2})],
        [QdiscStats(1, "noqueue", 0, 0xFFFFFFFF, 0, 0, 0, 0, 0, 0, 0)],
    )

    def make(**opts: Any) -> NetlinkCollector:
        factories = NetlinkFactories(source=lambda _: SnapshotSource(snap))
        ctx = CollectorContext("n1", options=NetlinkOptions(**opts), factories=(factories,))
        return NetlinkCollector(ctx)

    assert {r.device for r in await make().collect()} == {"eth0"}
    assert {r.device for r in await make(interfaces=["lo"]).collect()} == {"lo"}


def test_unknown_option_is_named() -> None:
    with pytest.raises(CollectorConfigError, match=r"collectors\.netlink\.qdisc"):
        build(
            "netlink",
            {"qdisc": True},
            node="n",
            sysfs_root=Path("/sys"),
            registry={"netlink": "collectors.netlink:NetlinkCollector"},
        )


# --- the real kernel ---------------------------------------------------------------------------


def tc_oracle(pair: VethPair) -> dict[str, Any]:
    out = json.loads(pair.run_a([need_binary("tc"), "-s", "-j", "qdisc", "show", "dev", pair.if_a]))
    return dict(next(q for q in out if q["kind"] == "tbf"))


def ip_oracle(pair: VethPair) -> dict[str, int]:
    """``ip -s -j link``'s stats64 ({"rx": {"bytes": ...}}) flattened to rtnl_link_stats64 names."""
    out = json.loads(pair.run_a([need_binary("ip"), "-s", "-j", "link", "show", "dev", pair.if_a]))
    stats = out[0]["stats64"]
    return {f"{way}_{field}": int(v) for way in ("rx", "tx") for field, v in stats[way].items()}


def qdisc_values(readings: Any) -> dict[str, float]:
    return {r.counter: r.value for r in readings if r.metric.startswith("qdisc_") and dict(r.labels)["qdisc"] == "tbf"}


def link_values(readings: Any) -> dict[str, float]:
    return {r.counter: r.value for r in readings if not r.metric.startswith("qdisc_")}


def between(name: str, before: float, oracle: float, after: float) -> None:
    """The oracle read sits between two collector reads: equal bounds where nothing moved."""
    low, high = min(before, after), max(before, after)
    assert low <= oracle <= high, f"{name}: tc says {oracle}, collector read {before} then {after}"


@pytest.mark.root
async def test_tbf_drops_backlog_and_overlimits_match_tc() -> None:
    with veth_pair(PREFIX) as pair:
        # 8 kbit/s drains 1 kB/s: a 6000-byte limit holds a few 1000-byte datagrams for seconds
        # and tail-drops the rest of a burst.
        pair.run_a(
            [
                need_binary("tc"),
                "qdisc",
                "replace",
                "dev",
                pair.if_a,
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                "8kbit",
                "burst",
                "1600",
                "limit",
                "6000",
            ]
        )
        sent = send_udp(pair, count=60, size=1000)
        coll = NetlinkCollector(CollectorContext("n1", options=NetlinkOptions(netns=pair.ns_a, interfaces=[pair.if_a])))
        try:
            before = await coll.collect()
            tc, ip = tc_oracle(pair), ip_oracle(pair)
            after = await coll.collect()
        finally:
            await coll.close()
    q0, q1 = qdisc_values(before), qdisc_values(after)
    assert q0["drops"] > 0 and q0["overlimits"] > 0 and q0["backlog_bytes"] > 0  # what a user looks for
    assert q0["drops"] + q0["packets"] + q0["backlog_packets"] == sent == 60  # every datagram accounted for
    for ours, theirs in [
        ("bytes", "bytes"),
        ("packets", "packets"),
        ("drops", "drops"),
        ("overlimits", "overlimits"),
        ("requeues", "requeues"),
        ("backlog_bytes", "backlog"),
        ("backlog_packets", "qlen"),
    ]:
        between(ours, q0[ours], tc[theirs], q1[ours])
    l0, l1 = link_values(before), link_values(after)
    for name in ("tx_bytes", "tx_packets", "rx_bytes", "rx_packets", "tx_dropped", "rx_dropped"):
        between(name, l0[name], ip[name], l1[name])
    assert {r.device for r in before} == {pair.if_a}
    drops = next(r for r in before if r.counter == "drops")
    assert (drops.width, drops.kind, dict(drops.labels)["handle"]) == (32, Kind.COUNTER, "1:0")
