"""A server's log as plain lines, the way vLLM writes it undone: every parser and every recorded
log tail reads this, never the raw text.

vLLM-Omni forces VLLM_LOGGING_COLOR=1, so the log is full of ANSI colour codes; vLLM's
NewLineFormatter repeats the record's prefix (`LEVEL MM-DD HH:MM:SS [file.py:N] `) after a `\\r\\n`
on every line of a multi-line message, a traceback included; and each worker process prefixes
every line it writes with `(Name pid=N) `. Left in, they hide a traceback's `Traceback ...` and
exception lines from the parsers (which read them at the start of a line), so a crash would be
named by a later symptom.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# vllm/utils: `_add_prefix` writes "(EngineCore_DP0 pid=1234) " before each line of a worker;
# a worker's worker adds its own.
_PROCESS = re.compile(r"^(?:\([^()\n]+ pid=\d+\) )+")
# vllm/logger.py _FORMAT: "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s",
# its date format "%m-%d %H:%M:%S" (VLLM_LOGGING_PREFIX, empty by default, is not undone).
_RECORD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
                     r"(?:\.\d+)? \[[^\]\n]+:\d+\] ")


def plain_log(text: str) -> str:
    """`text` with ANSI escapes, worker prefixes and vLLM's record prefixes removed, and `\\r\\n`
    line ends made `\\n`."""
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(_RECORD.sub("", _PROCESS.sub("", line)) for line in text.split("\n"))
