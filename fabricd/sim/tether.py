"""Run a ``fabricd`` command that dies with its parent: ``python -m fabricd.sim.tether PPID ARGS...``.

``fabricd demo`` starts the central service and the agents as child processes. Killed with SIGKILL,
the demo gets no chance to stop them, and they would keep running and holding the port. This
launcher asks the kernel to send the child SIGTERM when its parent dies (``PR_SET_PDEATHSIG``,
prctl(2); it survives the ``execv`` below), checks the parent did not die before that was in place,
and then becomes ``python -m fabricd ARGS...``. SIGTERM is the graceful stop of both commands.
A launcher process, not ``Popen(preexec_fn=...)``: preexec_fn is unsafe with threads (the
simulator runs one), see the ``subprocess`` documentation.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def tie_to_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Deliver ``sig`` to this process when its parent dies; False if the parent is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # The parent may have died between fork and prctl: then we were re-parented and no signal comes.
    return os.getppid() == parent_pid


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m fabricd.sim.tether PARENT_PID FABRICD_ARGS...", file=sys.stderr)
        return 2
    if not tie_to_parent(int(argv[0])):
        return 1
    os.execv(sys.executable, [sys.executable, "-m", "fabricd", *argv[1:]])
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
