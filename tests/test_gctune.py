"""GC settings of the long-running processes (fabricd/gctune.py)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

from fabricd import gctune


def test_paused_is_reentrant_and_shared_between_threads() -> None:
    assert gc.isenabled()
    inner_started, release = threading.Event(), threading.Event()
    seen_in_thread: list[bool] = []

    def other() -> None:
        with gctune.paused():
            inner_started.set()
            release.wait(5)
        seen_in_thread.append(gc.isenabled())

    with gctune.paused():
        t = threading.Thread(target=other)
        t.start()
        assert inner_started.wait(5)
        with gctune.paused():  # nested in one thread
            assert not gc.isenabled()
        assert not gc.isenabled()
    # The first block ended while the thread's block still runs: GC stays off until the last ends.
    assert not gc.isenabled()
    release.set()
    t.join(5)
    assert seen_in_thread == [True] and gc.isenabled()


def test_paused_keeps_gc_off_if_it_was_off() -> None:
    gc.disable()
    try:
        with gctune.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_tune_for_service_freezes_start_up_and_raises_thresholds() -> None:
    code = (
        "import gc; from fabricd import gctune; before = gc.get_freeze_count(); gctune.tune_for_service(); "
        "print(before, gc.get_freeze_count() > 1_000, gc.get_threshold())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 2)
    assert out[0] == "0" and out[1] == "True"
    assert out[2].strip() == str(gctune.THRESHOLDS)


def test_raised_restores_the_thresholds() -> None:
    before = gc.get_threshold()
    with gctune.raised():
        assert gc.get_threshold() == gctune.THRESHOLDS
    assert gc.get_threshold() == before
