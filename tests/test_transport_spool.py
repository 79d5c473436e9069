"""The on-disk spool: durable, ordered, bounded, and honest about damaged files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricd.transport.spool import (
    FLAG_GZIP,
    QUARANTINE,
    CorruptSpoolFile,
    Spool,
    SpoolWriteError,
    pack,
    unpack,
)
from tests.helpers import REPO, need_binary, need_root


def _open(path: Path, max_bytes: int = 1 << 20) -> Spool:
    spool = Spool(path, max_bytes)
    spool.open()
    return spool


def test_pack_unpack_round_trip() -> None:
    got = unpack(pack("batch-1", b"\x1f\x8b payload", FLAG_GZIP))
    assert (got.batch_id, got.body, got.gzip, got.json) == ("batch-1", b"\x1f\x8b payload", True, False)


def test_every_truncation_and_any_flipped_byte_is_detected() -> None:
    data = pack("batch-1", bytes(range(200)), FLAG_GZIP)
    for cut in range(len(data)):
        with pytest.raises(CorruptSpoolFile):
            unpack(data[:cut])
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x40
        with pytest.raises(CorruptSpoolFile):
            unpack(bytes(flipped))


def test_batches_survive_reopening_in_order_and_numbering_continues(tmp_path: Path) -> None:
    spool = _open(tmp_path)
    for i in range(3):
        spool.put(f"b{i}", b"x" * 10, 0)
    again = _open(tmp_path)
    assert [again.read(e).batch_id for e in again.entries()] == ["b0", "b1", "b2"]
    again.put("b3", b"y", 0)
    assert [again.read(e).batch_id for e in again.entries()][-1] == "b3"
    assert again.size_bytes == sum(e.size for e in again.entries())


def test_a_write_interrupted_before_rename_leaves_nothing_behind(tmp_path: Path) -> None:
    spool = _open(tmp_path)
    spool.put("b0", b"x", 0)
    (tmp_path / ".00000000000000000001.batch.tmp").write_bytes(b"FDSPOOL1 half")
    again = _open(tmp_path)
    assert [again.read(e).batch_id for e in again.entries()] == ["b0"]
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_full_spool_drops_the_oldest_batches_and_stays_within_its_bound(tmp_path: Path) -> None:
    one = len(pack("b00", b"x" * 100, 0))
    spool = _open(tmp_path, max_bytes=3 * one)
    dropped = [e for i in range(5) for e in spool.put(f"b{i:02d}", b"x" * 100, 0)]
    assert len(dropped) == 2
    assert [spool.read(e).batch_id for e in spool.entries()] == ["b02", "b03", "b04"]
    assert spool.size_bytes <= 3 * one


def test_a_batch_larger_than_the_whole_spool_is_refused(tmp_path: Path) -> None:
    spool = _open(tmp_path, max_bytes=64)
    with pytest.raises(SpoolWriteError) as err:
        spool.put("big", b"x" * 100, 0)
    assert err.value.reason == "too_large"


def test_quarantine_moves_the_file_aside_with_its_reason(tmp_path: Path) -> None:
    spool = _open(tmp_path)
    spool.put("b0", b"x", 0)
    entry = spool.entries()[0]
    target = spool.quarantine(entry, "corrupt spool file: crc32 mismatch")
    assert len(spool) == 0 and spool.size_bytes == 0
    assert target.parent == tmp_path / QUARANTINE and target.exists()
    assert "crc32 mismatch" in target.with_suffix(".reason").read_text()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, so the disk really fills (ENOSPC from the kernel, not from a mock)."""
    need_root()
    mount = need_binary("mount")
    point = tmp_path / "tiny"
    point.mkdir()
    subprocess.run([mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run([need_binary("umount"), str(point)], check=True)


@pytest.mark.root
def test_a_full_disk_is_reported_as_disk_full_and_the_spool_recovers(tiny_fs: Path) -> None:
    spool = _open(tiny_fs, max_bytes=1 << 30)  # the byte bound is far away: the disk fills first
    body = os.urandom(8000)
    stored = 0
    with pytest.raises(SpoolWriteError) as err:
        for i in range(100):
            spool.put(f"b{i}", body, 0)
            stored += 1
    assert err.value.reason == "disk_full"
    assert not list(tiny_fs.glob(".*.tmp"))  # the half-written temp file was removed
    assert len(spool) == stored and all(spool.read(e).body == body for e in spool.entries())
    spool.remove(spool.entries()[0])  # the central acknowledged one: room again
    spool.put("after", body, 0)
    assert spool.read(spool.entries()[-1]).batch_id == "after"


_WRITER = """
import sys
from pathlib import Path
from fabricd.transport.spool import Spool
spool = Spool(Path(sys.argv[1]), 1 << 30)
spool.open()
i = 0
while True:
    spool.put(f"b{i}", bytes([i % 256]) * 20000, 0)
    print(f"b{i}", flush=True)
    i += 1
"""


def test_kill_9_mid_write_loses_no_acknowledged_batch_and_leaves_no_damaged_file(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO
    ) as proc:
        assert proc.stdout is not None
        acked = [proc.stdout.readline().strip() for _ in range(40)]
        proc.send_signal(signal.SIGKILL)
    spool = _open(tmp_path, max_bytes=1 << 30)
    found = [spool.read(e).batch_id for e in spool.entries()]  # raises if any file is damaged
    assert found[: len(acked)] == acked
    assert found == [f"b{i}" for i in range(len(found))]  # in order, no hole
