"""Intel E800 series (``ice``) ``ethtool -S`` names: per-priority XON/XOFF, link pause, drops, CRC.

Source: ``drivers/net/ethernet/intel/ice/ice_ethtool.c`` (torvalds/linux @ 000773c0):
``ice_gstrings_pf_stats`` (``link_xon_rx.nic``, ``rx_crc_errors.nic``, ``rx_dropped.nic``, ...) and
``__ice_get_strings`` (``tx_priority_%u_xon.nic``, ``rx_priority_%u_xoff.nic``). The ``.nic`` names are
the physical port's (PF) counters; the unsuffixed ``rx_dropped`` is the VSI's and is left unmapped.
XOFF frames ask the peer to stop (what other drivers call pause frames); XON frames lift the pause.
"""

from __future__ import annotations

from fabricd.drivers.ethtool import EthtoolDriver, P, rule

DRIVER = EthtoolDriver(
    name="ice",
    kernel_drivers=("ice",),
    source="drivers/net/ethernet/intel/ice/ice_ethtool.c",
    rules=(
        rule(r"rx_priority_([0-7])_xoff\.nic", "rx_pause_frames", "frames", priority=P),
        rule(r"tx_priority_([0-7])_xoff\.nic", "tx_pause_frames", "frames", priority=P),
        rule(r"rx_priority_([0-7])_xon\.nic", "rx_pause_resume_frames", "frames", priority=P),
        rule(r"tx_priority_([0-7])_xon\.nic", "tx_pause_resume_frames", "frames", priority=P),
        rule(r"link_xoff_rx\.nic", "rx_pause_frames", "frames", priority="global"),
        rule(r"link_xoff_tx\.nic", "tx_pause_frames", "frames", priority="global"),
        rule(r"link_xon_rx\.nic", "rx_pause_resume_frames", "frames", priority="global"),
        rule(r"link_xon_tx\.nic", "tx_pause_resume_frames", "frames", priority="global"),
        rule(r"rx_crc_errors\.nic", "rx_crc_errors", "frames"),
        rule(r"rx_dropped\.nic", "rx_discards", "packets"),
        rule(r"tx_dropped_link_down\.nic", "tx_discards", "packets"),
    ),
)
