"""Live runs that went wrong, replayed from the central's own database (``tests/cases/live``):
the batches in the order and at the times the central received them, through its detector."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from tests.support.relive import replay_stored

CASES = Path(__file__).parent / "cases" / "live"


def _unpacked(case: str, tmp_path: Path) -> Path:
    out = tmp_path / "central.db"
    with gzip.open(CASES / case / "central.db.gz") as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def test_the_demos_receivers_past_the_hold_are_the_fabric_links_not_their_own(tmp_path: Path) -> None:
    """`make demo`'s scenario live, 1 run in 5: four receivers' host links opened beside the right
    link, their marks a second past the three-interval hold while the link's pairs were one scrape
    short of the guard. While bad pairs elsewhere are coming in, a receiver waits on (up to twice
    the hold), and then the open link claims its marks."""
    opened = replay_stored(_unpacked("demo_receivers_past_the_hold", tmp_path))
    assert sorted({(o.kind, o.element) for o in opened}) == [("congestion", "leaf-02~spine-01")]


def test_receivers_marked_behind_several_leaves_wait_for_the_probes_however_long(tmp_path: Path) -> None:
    """Another live demo: the probes through the uplink stayed under the pair guard for a minute,
    and six receivers behind four leaves opened their own host links once the hold ran out (a CI
    run of ``tests/test_demo.py`` did the same). Receivers marked behind two leaves at least are
    the ends of one fabric queue's flows: they wait for the probes, which name the link (late)."""
    opened = replay_stored(_unpacked("demo_probes_under_the_guard", tmp_path))
    assert sorted({(o.kind, o.element) for o in opened}) == [("congestion", "leaf-02~spine-01")]
