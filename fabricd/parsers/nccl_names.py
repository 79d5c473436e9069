"""Names an NCCL-tests log gives by the way: the collective of a binary or command line, and NCCL's
version from its ``NCCL_VERSION_CODE``. Pure helpers of ``fabricd.parsers.nccl``."""

from __future__ import annotations

import re

_OP_NAME = re.compile(r"([a-z_]+?)_perf")
_OP_WORD = re.compile(r"(?:^|[\s/=])([a-z_]+?_perf)(?:_mpi)?\b")


def op_from_name(name: str) -> str:
    """``all_reduce_perf_mpi`` or ``/opt/nccl-tests/build/all_gather_perf`` -> the operation name."""
    base = name.rsplit("/", 1)[-1]
    match = _OP_NAME.search(base)
    return match.group(1) if match else ""


def version_of_code(code: int) -> str:
    """``NCCL_VERSION_CODE`` -> ``2.29.7`` (nccl.h: major*10000 + minor*100 + patch since 2.9)."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code >= 20900 else str(code)


def op_in(line: str) -> str:
    """The collective a command line or banner names (``srun ... all_gather_perf -b 8``)."""
    m = _OP_WORD.search(line)
    return op_from_name(m.group(1)) if m else ""
