"""A simulated InfiniBand subnet for the tests: linux-rdma's ibsim with the real OpenSM and the real
infiniband-diags tools (Debian: ibsim-utils, opensm, infiniband-diags).

ibsim models the switches and HCAs of a fabric file and answers the MADs that the tools send; its
``libumad2sim.so`` (``LD_PRELOAD``, what ``ibsim-run`` sets) hands the tools' MADs to it instead of a
kernel HCA, so OpenSM assigns LIDs and writes forwarding tables, and ``ibnetdiscover``, ``ibtracert``
and ``ibroute`` read them, as on hardware. ``IBSIM_SOCKNAME`` gives each simulator its own socket;
the console (cable down: ``Unlink "node"[port]``) is its stdin. The simulator does not model
adaptive routing, and links are SDR.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.helpers import need_binary

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
READY = "Network simulator ready"


class Ibsim:
    def __init__(self, fabric: Path, workdir: Path) -> None:
        for tool in ("ibsim", "ibsim-run", "opensm", "ibnetdiscover", "ibtracert", "ibroute"):
            need_binary(tool)
        self.fabric, self.workdir = fabric, workdir
        self.log = workdir / "ibsim.log"
        self.socket = f"fabricd-{os.getpid()}-{time.monotonic_ns()}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a tool needs to reach this simulator (pass through ``ibsim-run``, or LD_PRELOAD)."""
        cache = self.workdir / "opensm-cache"
        cache.mkdir(exist_ok=True)
        return {"IBSIM_SOCKNAME": self.socket, "OSM_CACHE_DIR": str(cache)}

    def start(self, seconds: float = 20.0) -> Ibsim:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["ibsim", "-s", str(self.fabric)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, **self.env),
            )
        deadline = time.monotonic() + seconds
        while READY not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ibsim did not start: {self.log.read_text(errors='replace')[-1000:]}")
            time.sleep(0.05)
        self.sweep()
        return self

    def run(self, *argv: str, seconds: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ibsim-run", *argv], capture_output=True, text=True, timeout=seconds, env=dict(os.environ, **self.env)
        )

    def sweep(self) -> None:
        """One OpenSM sweep (``-o``: discover, assign LIDs, write the forwarding tables, exit)."""
        done = self.run("opensm", "-o", "-f", str(self.workdir / "opensm.log"))
        if done.returncode != 0:
            raise RuntimeError(f"opensm -o exited {done.returncode}: {done.stdout[-500:]}{done.stderr[-500:]}")

    def console(self, line: str) -> None:
        """A simulator console command, e.g. ``Unlink "ib-spine-2"[2]``."""
        assert self.proc is not None and self.proc.stdin is not None
        before = self.log.read_text(errors="replace").count("sim>")
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 10
        while self.log.read_text(errors="replace").count("sim>") <= before:  # the prompt after the command
            if time.monotonic() > deadline:
                raise RuntimeError(f"ibsim did not take {line!r}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
