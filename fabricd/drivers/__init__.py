"""Per-driver counter tables: what each raw driver counter means, in fabricd's neutral vocabulary.

Layout::

    fabricd/drivers/vocabulary.py     the neutral names (name -> unit, kind, meaning)
    fabricd/drivers/ib/pma.py         InfiniBand counters/ and counters_ext/ (IBA PortCounters)
    fabricd/drivers/ib/<driver>.py    one RDMA driver's hw_counters/ (mlx5.py, bnxt_re.py, ...)
    fabricd/drivers/ethtool/<drv>.py  one NIC driver's ethtool -S names (mlx5.py, bnxt_en.py, ionic.py)

Each table row says where it was taken from (kernel file and table name). The collectors
(``collectors/infiniband.py``, ``collectors/ethtool.py``), the simulator's sysfs writer, the metric
catalogue and the dashboards read these tables; detectors and derived signals only ever see the
neutral names (``fabricd.signal_table``), so a new driver changes nothing there.

Adding a driver is one module (found by ``pkgutil``, no registration line) plus one fixture folder:

- RDMA ``hw_counters``: ``fabricd/drivers/ib/<driver>.py`` defining ``DRIVER = HwDriver(...)``:
  which devices it claims (kernel driver behind ``<dev>/device/driver``, device name prefix,
  ``hca_type`` prefix) and one ``Counter`` per raw file (neutral name, unit, width, overflow, kind,
  scale, help, source). Fixture: ``tests/cases/infiniband/<case>/sys`` with ``ORIGIN.md``.
- ``ethtool -S``: ``fabricd/drivers/ethtool/<driver>.py`` defining ``DRIVER = EthtoolDriver(...)``
  with its ``ethtool -i`` driver names and its rules (regex over the raw name -> neutral name, unit,
  divisor, priority label). Fixture: ``tests/cases/ethtool/<case>/`` with ``ORIGIN.md``.
- A concept the vocabulary lacks (per-priority discards, FEC symbol errors, ...) gets a new term in
  ``vocabulary.py`` with its unit; never a second name for an existing one.

``tests/test_drivers.py`` checks every table against the vocabulary (names, units, kinds), that no
raw name is claimed twice, and that every row cites its source.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import TypeVar

D = TypeVar("D")


def discover(package: str, path: Iterable[str], kind: type[D], skip: frozenset[str] = frozenset()) -> tuple[D, ...]:
    """The ``DRIVER`` of every module of a table package, by module name (no registration list).
    Modules named in ``skip`` or starting with ``_`` hold no driver; any other without one is a bug."""
    found = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        driver = getattr(module, "DRIVER", None)
        if not isinstance(driver, kind):
            raise TypeError(f"{module.__name__} defines no DRIVER = {kind.__name__}(...)")
        found.append(driver)
    return tuple(found)
