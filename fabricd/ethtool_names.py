"""Kept for ``collectors/ethtool.py``'s import only: the tables are in ``fabricd.drivers.ethtool``.

The per-driver rules moved to ``fabricd/drivers/ethtool/<driver>.py`` and the neutral names to
``fabricd.drivers.vocabulary``; import from there. (This module goes once the collector's import
line changes; it is left so that change can land with the collector's own edits.)
"""

from __future__ import annotations

from fabricd.drivers.ethtool import MICROSECONDS_PER_SECOND, Neutral, all_rules, is_queue_stat, neutral

__all__ = ["MICROSECONDS_PER_SECOND", "Neutral", "all_rules", "is_queue_stat", "neutral"]
