"""What every parser shares: the ``Problem`` record a parse failure becomes."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PROBLEM_TEXT = 200  # characters of the offending line kept in a problem (a log line can be huge)


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the input a parser could not read; ``line`` is 1-based (0: the whole input)."""

    line: int
    message: str
    text: str = ""


def problem(line: int, message: str, text: str = "") -> Problem:
    return Problem(line, message, text.strip()[:MAX_PROBLEM_TEXT])


def tool_message(stripped: str) -> bool:
    """A diagnostic the infiniband-diags tools print among their output (``ibwarn:``, ``ibpanic:``,
    ``ibdebug``; libibmad's ``ibwarn``/``IBPANIC`` macros, rdma-core ``libibmad/mad.h``)."""
    return stripped.lower().startswith(("ibwarn", "ibpanic", "ibdebug", "ibvdebug", "ibverror"))


# The command line a capture is pasted with: a shell prompt (``#``, ``$``, ``[root@sm01 ~]#``,
# ``user@host:~$``) or none, maybe ``sudo``, maybe a path, then the tool (guilbaults/infiniband-exporter#48:
# ``# ibqueryerrors --verbose --details ... -G 0xb8cef60300a1d92a``). STYLE.md: fixtures start with it.
_PROMPT = r"(?:.*?[#$]\s*)?(?:sudo\s+)?(?:\S*/)?"


def command_line(stripped: str, tool: str) -> bool:
    """``stripped`` is the capture's own command line running ``tool``."""
    return re.fullmatch(_PROMPT + re.escape(tool) + r"(?:\s.*)?", stripped) is not None
