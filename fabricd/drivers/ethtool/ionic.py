"""AMD Pensando (``ionic``) ``ethtool -S`` names: per-priority pause and its duration, errors.

Source: ``drivers/net/ethernet/pensando/ionic/ionic_stats.c`` (``ionic_port_stats_desc``);
``*_pripause_{p}_1us_count`` are microseconds; ``frames_*_pripause`` is the sum over priorities.
"""

from __future__ import annotations

from fabricd.drivers.ethtool import US, EthtoolDriver, P, rule

DRIVER = EthtoolDriver(
    name="ionic",
    kernel_drivers=("ionic",),
    source="drivers/net/ethernet/pensando/ionic/ionic_stats.c",
    rules=(
        rule(r"frames_rx_pripause", "rx_pause_frames", "frames", priority="all"),
        rule(r"frames_tx_pripause", "tx_pause_frames", "frames", priority="all"),
        rule(r"frames_rx_pause", "rx_pause_frames", "frames", priority="global"),
        rule(r"frames_tx_pause", "tx_pause_frames", "frames", priority="global"),
        rule(r"rx_pripause_([0-7])_1us_count", "rx_pause_duration", "seconds", US, P),
        rule(r"tx_pripause_([0-7])_1us_count", "tx_pause_duration", "seconds", US, P),
        rule(r"rx_pause_1us_count", "rx_pause_duration", "seconds", US, "global"),
        rule(r"frames_rx_pri_([0-7])", "rx_priority_packets", "packets", priority=P),
        rule(r"frames_tx_pri_([0-7])", "tx_priority_packets", "packets", priority=P),
        rule(r"frames_rx_bad_fcs", "rx_crc_errors", "frames"),
        rule(r"frames_rx_dropped", "rx_discards", "packets"),
    ),
)
