"""The one error family of omniprobe, and one shape for every input error.

Every error a command expects is an `OmniprobeError` of one category, and each category has its
exit code; `omniprobe.cli.main` prints them (no traceback) and returns that code. Anything else
escaping a command is a bug, and keeps its traceback.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is not imported for this: the sim starts without it
    from pydantic import ValidationError


@dataclass(frozen=True)
class Problem:
    file: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.message}"


class OmniprobeError(Exception):
    """Base of every error a command expects; `exit_code` says its category to the caller."""

    exit_code = 1

    def lines(self) -> list[str]:
        """What the command line prints, one `error: ` line each."""
        return str(self).splitlines() or [type(self).__name__]


class InputError(OmniprobeError):
    """Bad input: a file (or an argument) is not what it must be; carries every problem found,
    not just the first, each naming the file, the field and what was expected."""

    exit_code = 2

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]


class Refusal(OmniprobeError):
    """What was asked cannot be done as asked (an unknown host, a fixture the source does not
    state, a flag set the host does not run); raised before any work, so no evidence is made."""

    exit_code = 3


class EnvironmentFailure(OmniprobeError):
    """The machine cannot run the work: the probe env fails a check, the port is taken, the GPU
    is busy."""

    exit_code = 4


class HarnessError(OmniprobeError):
    """The harness or what it supervises broke its contract (e.g. a runner wrote what the
    protocol does not allow); the attempt keeps what finished before."""

    exit_code = 5


class Interrupted(OmniprobeError):
    """Ctrl-C or SIGTERM, raised once the session has stopped its server and closed its files."""

    exit_code = 130


# Each exit code in one line (docs/guide.md's exit-code table says more): a failed nox session's last
# line quotes it, since nox itself exits 1 for every failure. This module imports only the
# standard library at run time, so the noxfile reads this table from its source.
EXIT_MEANINGS = {
    0: "done",
    1: "done, but the answer is no: a check failed, or a probe left cells unsettled (its "
       "`unsettled:` lines name them)",
    2: "bad input: a file or an argument, named above with the field and what was expected",
    3: "refused before any work (an unknown host, a fixture the source does not state); no "
       "evidence was written",
    4: "this machine cannot run it: the env fails a check, the port is taken, the GPU is busy",
    5: "the harness or a process it supervises broke its contract",
    130: "interrupted (after the server was stopped)",
}


# Where a message line wraps: read at a glance, still wide enough for a path and its field.
MESSAGE_WIDTH = 100


def wrapped(prefix: str, line: str, width: int = MESSAGE_WIDTH) -> list[str]:
    """One message line as printed: `prefix` first, wrapped at `width` between words, each
    continuation indented under the text. A path, URL or command word is never split: a word
    longer than the width stands alone on its line."""
    lead = line[:len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line, width=width, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix) + lead + "  ",
                         break_long_words=False, break_on_hyphens=False) or [prefix.rstrip()]


def json_path(loc: Iterable[int | str]) -> str:
    """Render a pydantic error location as a JSON path such as `$.runs[2].cells[0].wall_s`."""
    out = "$"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def problems_from_validation(
    file: str | Path, exc: ValidationError, render_loc=json_path
) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        message = err["msg"]
        if err["type"] == "value_error":  # our own validators' words, without pydantic's label
            message = message.removeprefix("Value error, ")
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (not part of the schema)"
        elif "input" in err and err["type"] not in {"value_error", "assertion_error"}:
            message = f"{message} (got {_short(err['input'])})"
        problems.append(Problem(str(file), render_loc(err["loc"]), message))
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
