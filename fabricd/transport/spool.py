"""The on-disk spool: batches kept while the central service is unreachable (docs/transport.md).

One file per batch, named by its creation key (nanoseconds, strictly increasing, also across
restarts) so a directory listing is the drain order, whichever task spooled a batch first:

    <dir>/00000000000000000042.batch      header + batch id + encoded body
    <dir>/quarantine/00000000000000000041.batch (+ .reason)  files that failed their check

A file is written under a temporary name, fsync'ed, renamed into place, and the directory is
fsync'ed: the rename is atomic, so after ``put`` returns the batch survives kill -9 and power loss
(POSIX rename(2); the fsync-then-rename pattern of SQLite's and LevelDB's manifests). Every file
carries its own length and CRC-32, so a file damaged anyway (a filesystem without data ordering, a
disk error, a hand edit) is detected when read, moved to ``quarantine/`` and reported, and the
intact files around it are still sent. The spool is bounded in bytes: a new batch makes room by
dropping the oldest ones (the caller counts them).

The methods are blocking and thread-safe; the transport calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"FDSPOOL1"  # the trailing digit is the file-format version
# magic, flags, id length, reserved, body length; then crc32 over everything after the magic
_PREFIX = struct.Struct(">8sBBHI")
_CRC = struct.Struct(">I")
HEADER_SIZE = _PREFIX.size + _CRC.size
FLAG_GZIP = 0x01
FLAG_JSON = 0x02
SUFFIX = ".batch"
QUARANTINE = "quarantine"
# Quarantined files are kept for an operator to inspect, not forever.
QUARANTINE_KEEP = 64


class SpoolWriteError(OSError):
    """A batch could not be spooled; ``reason`` is ``disk_full``, ``too_large`` or ``spool_error``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class CorruptSpoolFile(ValueError):
    """A spool file failed its magic, length or CRC check."""


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    path: Path
    size: int


@dataclass(frozen=True, slots=True)
class SpooledBatch:
    batch_id: str
    body: bytes
    flags: int

    @property
    def gzip(self) -> bool:
        return bool(self.flags & FLAG_GZIP)

    @property
    def json(self) -> bool:
        return bool(self.flags & FLAG_JSON)


def pack(batch_id: str, body: bytes, flags: int) -> bytes:
    """One spool file's bytes (pure; the format is in docs/transport.md)."""
    bid = batch_id.encode()
    if len(bid) > 255:
        raise ValueError("batch id longer than 255 bytes")
    prefix = _PREFIX.pack(MAGIC, flags, len(bid), 0, len(body))
    return prefix + _CRC.pack(_checksum(prefix, bid, body)) + bid + body


def _checksum(prefix: bytes, bid: bytes, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(bid, zlib.crc32(prefix[len(MAGIC) :])))


def unpack(data: bytes) -> SpooledBatch:
    """Parse and verify one spool file's bytes; raises CorruptSpoolFile saying what is wrong."""
    if len(data) < HEADER_SIZE:
        raise CorruptSpoolFile(f"truncated header ({len(data)} of {HEADER_SIZE} bytes)")
    magic, flags, id_len, _, body_len = _PREFIX.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _PREFIX.size)
    if magic != MAGIC:
        raise CorruptSpoolFile(f"bad magic {magic!r}")
    expected = HEADER_SIZE + id_len + body_len
    if len(data) != expected:
        raise CorruptSpoolFile(f"length {len(data)} bytes, header says {expected} (truncated or extended)")
    bid, body = data[HEADER_SIZE : HEADER_SIZE + id_len], data[HEADER_SIZE + id_len :]
    if _checksum(data[: _PREFIX.size], bid, body) != crc:
        raise CorruptSpoolFile("crc32 mismatch")
    return SpooledBatch(bid.decode(errors="replace"), body, flags)


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self._entries: dict[int, Entry] = {}
        self._bytes = 0
        self._last_key = 0
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def open(self) -> None:
        """Create the folders and index what a previous run left (leftover temp files are deleted)."""
        with self._lock:
            (self.dir / QUARANTINE).mkdir(parents=True, exist_ok=True)
            for path in self.dir.iterdir():
                self._index(path)
            self._last_key = max(self._entries, default=0)

    def next_key(self, now_ns: int) -> int:
        """A key for a new batch: creation order, above every key already on disk."""
        with self._lock:
            self._last_key = max(self._last_key + 1, now_ns)
            return self._last_key

    def _index(self, path: Path) -> None:
        if path.name.endswith(".tmp"):
            # never renamed into place, so ``put`` never returned for it: nobody was promised it
            path.unlink(missing_ok=True)
        elif path.suffix == SUFFIX and path.stem.isdigit():
            size = path.stat().st_size
            self._entries[int(path.stem)] = Entry(int(path.stem), path, size)
            self._bytes += size

    def put(self, batch_id: str, body: bytes, flags: int, key: int | None = None) -> list[Entry]:
        """Store one batch durably under ``key`` (default: now); returns the oldest entries dropped."""
        data = pack(batch_id, body, flags)
        if len(data) > self.max_bytes:
            raise SpoolWriteError("too_large", f"batch of {len(data)} bytes exceeds spool.max_bytes")
        with self._lock:
            dropped = self._make_room(len(data))
            seq = key if key is not None else max(self._last_key + 1, time.time_ns())
            self._last_key = max(self._last_key, seq)
            path = self.dir / f"{seq:020d}{SUFFIX}"
            self._write_durably(path, data)
            previous = self._entries.get(seq)  # the same batch spooled again (shutdown race)
            if previous is not None:
                self._forget(previous)
            self._entries[seq] = Entry(seq, path, len(data))
            self._bytes += len(data)
        return dropped

    def _make_room(self, size: int) -> list[Entry]:
        dropped = []
        while self._entries and self._bytes + size > self.max_bytes:
            entry = self._entries[min(self._entries)]
            self._forget(entry)
            entry.path.unlink(missing_ok=True)
            dropped.append(entry)
        return dropped

    def _write_durably(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            self._fsync_dir(path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            reason = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "spool_error"
            raise SpoolWriteError(reason, f"cannot write {path}: {exc.strerror or exc}") from exc

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        # The rename is durable only once the directory entry is on disk too.
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def oldest(self, skip: Collection[int] = ()) -> Entry | None:
        """The oldest batch, leaving out the keys in ``skip`` (batches parked for later)."""
        with self._lock:
            keys = [k for k in self._entries if k not in skip] if skip else self._entries
            return self._entries[min(keys)] if keys else None

    def entries(self) -> list[Entry]:
        with self._lock:
            return [self._entries[k] for k in sorted(self._entries)]

    def read(self, entry: Entry) -> SpooledBatch:
        """The entry's batch; raises CorruptSpoolFile (or FileNotFoundError if it was dropped)."""
        return unpack(entry.path.read_bytes())

    def remove(self, entry: Entry) -> None:
        """Delete a batch the central acknowledged (a no-op if it was dropped meanwhile)."""
        with self._lock:
            if self._entries.get(entry.seq) == entry:
                self._forget(entry)
            entry.path.unlink(missing_ok=True)

    def quarantine(self, entry: Entry, reason: str) -> Path:
        """Move a damaged or rejected batch aside, with a ``.reason`` note for the operator."""
        with self._lock:
            if self._entries.get(entry.seq) == entry:
                self._forget(entry)
            target = self.dir / QUARANTINE / entry.path.name
            try:
                os.replace(entry.path, target)
            except FileNotFoundError:
                return target
            self._note(target, reason)
            return target

    def quarantine_bytes(self, name: str, data: bytes, reason: str) -> Path:
        """Keep a batch that never reached the spool (rejected live) in quarantine."""
        with self._lock:
            target = self.dir / QUARANTINE / f"live-{name}{SUFFIX}"
            self._write_durably(target, data)
            self._note(target, reason)
            return target

    def _note(self, target: Path, reason: str) -> None:
        target.with_suffix(".reason").write_text(reason + "\n")
        self._trim_quarantine()

    def _trim_quarantine(self) -> None:
        files = sorted((self.dir / QUARANTINE).glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime_ns)
        for old in files[: max(0, len(files) - QUARANTINE_KEEP)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".reason").unlink(missing_ok=True)

    def _forget(self, entry: Entry) -> None:
        del self._entries[entry.seq]
        self._bytes -= entry.size
