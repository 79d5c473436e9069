"""Strip the prefixes job launchers put in front of every line of a program's output.

- Open MPI ``--tag-output`` / ``--output tag``: ``[1,0]<stdout>:`` (``[jobid,rank]<stream>:``);
- MPICH / Intel MPI ``-prepend-rank`` / ``-l``: ``[0] ``;
- Slurm ``srun --label``: `` 0: `` (the task id, right-aligned);
- pdsh / clush: ``host: ``, also what nccl-tests itself prints before a failure
  (``gpu-1-1: Test CUDA failure ...``).

A ``host: `` prefix is only taken off when what follows looks like nccl-tests or NCCL output, so an
ordinary ``Warning: ...`` line keeps its text. ``rehash`` gives back the ``#`` that old nccl-tests
releases and pastes from rendered web pages leave out of header and summary lines.
"""

from __future__ import annotations

import re

_OPEN_MPI = re.compile(r"\[\d{1,20},\d{1,20}\]<(?:stdout|stderr|stddiag)>:\s?")
_RANK = re.compile(r"\[\d{1,20}\]\s")
_SRUN = re.compile(r"\s*\d{1,20}:(?:\s|$)")
_HOST = re.compile(r"[A-Za-z][\w.-]*:\s+")
# What a pdsh-prefixed nccl-tests line starts with once the host is gone.
_TOOL_TEXT = re.compile(
    r"\s*(?:#|\d|N/A|NCCL|RCCL|HIP |ROCm |Hostname|Librccl|rccl-tests|nccl-tests|Test |\.\. |\S+:\d{1,20}:\d{1,20} \[)"
)


def unprefix(line: str) -> str:
    """``line`` without its launcher prefixes (at most two, e.g. pdsh around srun)."""
    for _ in range(2):
        for pattern in (_OPEN_MPI, _RANK, _SRUN):
            if m := pattern.match(line):
                line = line[m.end() :]
                break
        else:
            m = _HOST.match(line)
            if m is None or not _TOOL_TEXT.match(line[m.end() :]):
                return line
            line = line[m.end() :]
    return line


# nccl-tests header and summary lines written without their "#": nccl-tests before 2019-03
# (NVIDIA/nccl-tests b188a15..dcf8189, src/common.cu) printed ``nThread 1 nGpus 8 ...`` and
# `` Out of bounds values : 0 OK`` bare, and a paste from a rendered GitHub page loses every "#"
# (NVIDIA/nccl-tests#37: `` Out of bounds values : 2 FAILED``, ``  size  count  type  time ...``).
_BARE_HEADER = re.compile(
    r"(?:nThreads?:?\s+\d{1,20}\s+nGpus|Using devices\s*$|Collective test starting:"
    r"|Rank\s+\d{1,20}\s+(?:Group\s+\d{1,20}\s+)?(?:Pid\s+\d{1,20}\s+)?on\s+\S+\s+device\s+\d{1,20}\s+\["
    r"|size\s+count\s+type\s|Out of bounds values\s*:|Avg bus bandwidth\s*:)"
)


def rehash(line: str) -> str:
    """A stripped nccl-tests header or summary line with its ``#`` back when it lost it."""
    return "# " + line if _BARE_HEADER.match(line) else line
