"""Cyclic garbage collector settings for fabricd's long-running processes (and ``fabricd eval``).

CPython runs a young-generation collection every 700 net allocations, and every object alive at
that moment is promoted; a full collection walks the whole heap once the promoted objects exceed a
quarter of it. fabricd's hot paths allocate in bursts of objects that all live a little while (an
ingest batch decoded into 480 samples, 20,000 points read back for detection, 480,000 rows for a
fleet ``/metrics``), so with the default thresholds each burst is promoted and triggers full
collections over a heap of series identities and detection state. Measured in the central service
(``docs/storage.md``): decoding a batch 4.2 -> 2.4 us a sample and reading points back for
detection 8.0 -> 4.0 us a sample with the thresholds below.

The code makes few reference cycles (asyncio's exceptions and futures are the usual ones), so
collecting young objects every 100,000 allocations costs little memory; full collections still
run (after 20 x 50 young ones, and CPython's quarter-of-the-heap rule), so cyclic garbage that
was promoted is reclaimed within seconds at the rates that matter.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (100_000, 20, 50)  # young allocations, young collections per middle, middle per full


def tune_for_service() -> None:
    """Freeze what exists now (modules, settings, the app: it lives as long as the process) and
    raise the collection thresholds. Call once, after start-up and before serving."""
    gc.collect()  # leave no garbage in the permanent generation
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


@contextmanager
def raised(thresholds: tuple[int, int, int] = THRESHOLDS) -> Iterator[None]:
    """``THRESHOLDS`` for one batch job in a process that is not a service (``fabricd eval``), the
    previous ones after it and a full collection at the end."""
    saved = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.collect()


_pause_lock = threading.Lock()
_pausers = 0
_was_enabled = True


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic GC while the block builds many objects that live to its end; thread-safe and
    re-entrant: the collector is enabled again when the last concurrent block ends (if it was
    enabled when the first one began)."""
    global _pausers, _was_enabled
    with _pause_lock:
        if _pausers == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pausers += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pausers -= 1
            if _pausers == 0 and _was_enabled:
                gc.enable()
