"""Pure parts of the central service: time parameters and the per-port view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fabricd.model import Kind
from fabricd.portview import port_views, select_ports
from fabricd.timeparse import iso, parse_duration, parse_time
from tests.support.server import ib_sample

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "text,expected",
    [
        ("now", NOW),
        ("-15m", NOW - 900),
        ("-2h", NOW - 7200),
        ("-1d", NOW - 86400),
        ("-30s", NOW - 30),
        ("2027-01-15T08:00:00Z", 1_800_000_000.0),
        ("2027-01-15T09:00:00+01:00", 1_800_000_000.0),
        ("2027-01-15T08:00:00", 1_800_000_000.0),
        ("1799999000", 1_799_999_000.0),
    ],
)
def test_time_parameters(text: str, expected: float) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "-15", "15m", "-1y", "", "nan"])
def test_bad_time_parameters_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(text, NOW)


def test_durations_and_iso() -> None:
    assert (parse_duration("30s"), parse_duration("5m"), parse_duration("90")) == (30.0, 300.0, 90.0)
    with pytest.raises(ValueError):
        parse_duration("0s")
    assert iso(NOW) == "2027-01-15T08:00:00Z" and iso(None) == "-"


def test_port_view_reads_vendor_neutral_signals() -> None:
    latest = [
        ("n1", ib_sample(NOW, rate=25e9)),
        (
            "n1",
            ib_sample(
                NOW, counter="rate", name="link_rate", unit="bytes_per_second", value=50e9, kind=Kind.GAUGE, rate=None
            ),
        ),
        ("n1", ib_sample(NOW, counter="symbol_error", name="symbol_errors", unit="", rate=2.0)),
        ("n1", ib_sample(NOW, counter="port_rcv_errors", name="port_receive_errors", unit="", rate=1.0)),
        (
            "n2",
            ib_sample(
                NOW,
                device="eth0",
                port="",
                counter="rx_prio3_pause_duration",
                name="rx_pause_duration",
                unit="seconds",
                rate=0.3,
                labels=(("priority", "3"),),
            ),
        ),
        (
            "n2",
            ib_sample(
                NOW,
                device="eth0",
                port="",
                counter="rx_prio4_pause_duration",
                name="rx_pause_duration",
                unit="seconds",
                rate=0.1,
                labels=(("priority", "4"),),
            ),
        ),
    ]
    # eth0's pause durations come from ethtool (infiniband readings without a port are device-level)
    latest = [(n, replace(s, reading=replace(s.reading, source="ethtool")) if n == "n2" else s) for n, s in latest]
    views = {(v.node, v.device): v for v in port_views(latest)}
    ib = views[("n1", "mlx5_0")]
    assert (ib.tx, ib.utilization, ib.errors) == (25e9, 0.5, 3.0)
    assert views[("n2", "eth0")].pause == 0.3  # the worst priority
    assert [v.node for v in select_ports(list(views.values()), None, "pause", 1)] == ["n2"]
    assert [v.node for v in select_ports(list(views.values()), None, "throughput", 5)] == ["n1", "n2"]
