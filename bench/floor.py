"""The floor for reading sysfs counters from Python: open, read and close every counter file once
per scrape, parse nothing. ``python bench/floor.py SYSFS_ROOT N``."""

from __future__ import annotations

import os
import sys


def counter_files(root: str) -> list[str]:
    top = os.path.join(root, "class", "infiniband")
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(top):
        if os.path.basename(dirpath) in {"counters", "counters_ext", "hw_counters"}:
            out.extend(os.path.join(dirpath, f) for f in files)
    return out


def main() -> None:
    root, n = sys.argv[1], int(sys.argv[2])
    files = counter_files(root)
    for _ in range(n):
        for path in files:
            with open(path, "rb") as f:
                f.read()


if __name__ == "__main__":
    main()
