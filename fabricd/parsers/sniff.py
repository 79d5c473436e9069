"""Which ``fabricd parse`` KIND a text is, from lines that only that tool prints.

A file handed to the wrong KIND (an ``ncclras`` report to ``fabricd parse nccl``, an ``ethtool -S``
dump to ``perfquery``) gets one failure that names what it is and the KIND that reads it, instead of
"truncated" or one "not a ... line" per line. Pure: text in, a name out.
"""

from __future__ import annotations

import re

# What each kind is called in a message ("this is <name>").
NAMES = {
    "nccl": "NCCL-tests output",
    "ras": "an NCCL RAS status report (ncclras)",
    "ethtool": "ethtool -S statistics",
    "perfquery": "perfquery output",
    "ibqueryerrors": "ibqueryerrors output",
    "ibnetdiscover": "ibnetdiscover output",
    "ibtracert": "ibtracert output",
    "ibstat": "ibstat/ibstatus output",
}
# Kinds ``fabricd parse`` has no KIND for: the message says so instead of naming a command.
NOT_PARSED = frozenset({"ibstat"})

_M = re.MULTILINE
# nccl-tests lines may carry a launcher's prefix: Open MPI ``[1,0]<stdout>:``, srun ``--label`` `` 0: ``.
_LAUNCHER = r"^(?:\[\d+,\d+\]<std\w+>:|\s*\d+:)?"
SIGNS: dict[str, tuple[re.Pattern[str], ...]] = {
    # nccl-tests src/common.cu and util.cu headers and footer ("#nThread" without a blank: #287); the
    # "#" may be missing (before 2019-03, pastes from web pages: fabricd.parsers.launcher.rehash), and
    # the 2017 table header is "bytes N type" (NCCL 1's tests too).
    "nccl": (
        re.compile(
            _LAUNCHER + r"\s*#?\s*(?:nThreads?:?\s+\d+\s+nGpus|[nr]ccl-tests version|Collective test starting)", _M
        ),
        re.compile(_LAUNCHER + r"\s*#?\s*(?:Avg bus bandwidth\s*:|Out of bounds values\s*:)", _M),
        re.compile(_LAUNCHER + r"\s*#?\s*(?:size\s+count\s+type|bytes\s+N\s+type)\s", _M),
    ),
    # NCCL src/ras/client_support.cc: the CUDA line, then the section headings. Its first line
    # ("NCCL version 2.26.2 compiled with CUDA 12.4") is no sign: NCCL < 2.4 printed the same line
    # at NCCL_DEBUG=VERSION in every nccl-tests log (src/init.cu showVersion).
    "ras": (
        re.compile(r"^\s*CUDA runtime version \d+, driver version \d+", _M),
        re.compile(r"^\s*(?:Job summary|Communicators\.\.\. \(\S+\)|Communicators\.\.\.)\s*$", _M),
        re.compile(r"^\s*Group\s+Comms\s+Nodes\s+Ranks\b", _M),  # the table pasted alone (NVIDIA's examples)
    ),
    # ethtool's own first line; captures start with their command line (tests/cases/ethtool).
    "ethtool": (re.compile(r"^\s*(?:NIC statistics:\s*$|#?\s*\$?\s*ethtool -S\s)", _M),),
    # infiniband-diags perfquery: "# Port counters: Lid 936 port 1", then "SymbolErrors:......0".
    "perfquery": (
        re.compile(r"^#\s*Port (?:extended )?counters:\s*Lid\s+\d+", _M),
        re.compile(r"^[A-Za-z]\w*:\.{4,}\S", _M),
    ),
    "ibqueryerrors": (
        re.compile(r"^Errors for (?:0x[0-9a-fA-F]+ )?\"", _M),
        re.compile(r"^\s+GUID 0x[0-9a-fA-F]+ port (?:\d+|ALL):", _M),
        re.compile(r"^## Summary: \d+ nodes checked", _M),
    ),
    # ibnetdiscover: node lines and their ids; -p prints one line per port ("CA 78 1 0x... 4x HDR").
    "ibnetdiscover": (
        re.compile(r"^(?:Switch|Ca|Rt)\s+\d+\s+\"[SHR]-[0-9a-fA-F]+\"", _M),
        re.compile(r"^(?:vendid|devid|sysimgguid|switchguid|caguid)=0x", _M),
        re.compile(r"^(?:CA|SW|RT)\s+\d+\s+\d+\s+0x[0-9a-fA-F]+\s+\d+x\s", _M),
    ),
    "ibtracert": (re.compile(r"^(?:From (?:ca|switch|router) \{0x|\[\d+\] -> (?:ca|switch|router) )", _M),),
    # ibstat ("CA 'mlx5_0'", "CA type: MT4129") and ibstatus ("Infiniband device 'mlx5_0' port 1 status:").
    "ibstat": (
        re.compile(r"^CA '[^']+'\s*$", _M),
        re.compile(r"^Infiniband device '[^']+' port \d+ status:", _M),
    ),
}


def kind_of(text: str) -> str | None:
    """The kind whose signs match the most lines of ``text``; ``None`` when none matches."""
    counts = {kind: sum(len(p.findall(text)) for p in signs) for kind, signs in SIGNS.items()}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else None


def other_kind(text: str, kind: str) -> str | None:
    """Why ``text`` is not ``kind``'s input, naming what it is, or ``None`` when ``text`` shows a sign
    of ``kind`` or of nothing known (an unknown text keeps the parser's own failures)."""
    if any(p.search(text) for p in SIGNS.get(kind, ())):
        return None
    found = kind_of(text)
    if found is None or found == kind:
        return None
    where = "`fabricd parse` has no KIND for it" if found in NOT_PARSED else f"read it with `fabricd parse {found}`"
    return f"not {NAMES.get(kind, kind)}: this is {NAMES[found]}; {where}"
