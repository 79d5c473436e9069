"""NCCL-tests stand-in command: ``python -m fabricd.sim.standin all_reduce_perf FILE``.

The simulator writes, every interval, the output the node's next run would print (real NCCL-tests
format, ``fabricd.sim.nccl``); this command prints it, like the real binary prints its table. The
first word names the collective, so the collector's ``op_from_command`` sees ``all_reduce_perf``.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m fabricd.sim.standin <op>_perf FILE", file=sys.stderr)
        return 2
    try:
        text = Path(argv[1]).read_text()
    except OSError as exc:
        print(f"Test failure standin: cannot read {argv[1]}: {exc.strerror}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
