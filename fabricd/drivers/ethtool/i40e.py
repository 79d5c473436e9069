"""Intel 700 series (``i40e``) ``ethtool -S`` names, both name sets: per-priority XON/XOFF, link
pause, drops, CRC.

Source: ``drivers/net/ethernet/intel/i40e/i40e_ethtool.c``. Since kernel 4.19 (the stats rework,
``i40e_gstrings_pfc_stats``) the per-priority names carry a direction suffix:
``port.rx_priority_%u_xoff_rx``, ``port.tx_priority_%u_xon_tx``, ``port.rx_priority_%u_xon_2_xoff``.
Older kernels and Intel's out-of-tree driver (SourceForge ``i40e``, ``i40e_get_strings`` with its
``HAVE_ETHTOOL_GET_SSET_COUNT`` branches) print them without: ``port.rx_priority_%u_xoff``,
``port.tx_priority_%u_xon``. Port counters (``i40e_gstrings_stats``) have the ``port.`` prefix in
both: ``port.link_xoff_rx``, ``port.rx_crc_errors``, ``port.rx_dropped``, ``port.tx_dropped_link_down``.
``xon_2_xoff`` counts the priority's XON -> XOFF transitions (entering the paused state).
"""

from __future__ import annotations

from fabricd.drivers.ethtool import EthtoolDriver, P, rule

DRIVER = EthtoolDriver(
    name="i40e",
    kernel_drivers=("i40e",),
    source="drivers/net/ethernet/intel/i40e/i40e_ethtool.c",
    rules=(
        # kernel >= 4.19 (i40e_gstrings_pfc_stats)
        rule(r"port\.rx_priority_([0-7])_xoff_rx", "rx_pause_frames", "frames", priority=P),
        rule(r"port\.tx_priority_([0-7])_xoff_tx", "tx_pause_frames", "frames", priority=P),
        rule(r"port\.rx_priority_([0-7])_xon_rx", "rx_pause_resume_frames", "frames", priority=P),
        rule(r"port\.tx_priority_([0-7])_xon_tx", "tx_pause_resume_frames", "frames", priority=P),
        # older kernels and the out-of-tree driver
        rule(r"port\.rx_priority_([0-7])_xoff", "rx_pause_frames", "frames", priority=P),
        rule(r"port\.tx_priority_([0-7])_xoff", "tx_pause_frames", "frames", priority=P),
        rule(r"port\.rx_priority_([0-7])_xon", "rx_pause_resume_frames", "frames", priority=P),
        rule(r"port\.tx_priority_([0-7])_xon", "tx_pause_resume_frames", "frames", priority=P),
        rule(r"port\.rx_priority_([0-7])_xon_2_xoff", "rx_pause_transitions", "events", priority=P),
        rule(r"port\.link_xoff_rx", "rx_pause_frames", "frames", priority="global"),
        rule(r"port\.link_xoff_tx", "tx_pause_frames", "frames", priority="global"),
        rule(r"port\.link_xon_rx", "rx_pause_resume_frames", "frames", priority="global"),
        rule(r"port\.link_xon_tx", "tx_pause_resume_frames", "frames", priority="global"),
        rule(r"port\.rx_crc_errors", "rx_crc_errors", "frames"),
        rule(r"port\.rx_dropped", "rx_discards", "packets"),
        rule(r"port\.tx_dropped_link_down", "tx_discards", "packets"),
    ),
)
