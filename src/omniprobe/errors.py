"""One shape for every input error: the file, the path of the bad field, what was expected."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError


@dataclass(frozen=True)
class Problem:
    file: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.message}"


class InputError(Exception):
    """Raised when an input file is bad; carries every problem found, not just the first."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


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
        if err["type"] == "missing":
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
