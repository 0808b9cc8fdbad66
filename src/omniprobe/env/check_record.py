"""An environment check as recorded (pass, fail or skip, with its detail), and the lines that say
checks."""

from __future__ import annotations

from omniprobe.evidence.models.common import CheckStatus
from omniprobe.evidence.models.environment import EnvCheck


def env_check(name: str, status: CheckStatus, detail: str, expected: object = None,
           actual: object = None) -> EnvCheck:
    return EnvCheck(name=name, status=status, detail=detail,
                    expected=None if expected is None else str(expected),
                    actual=None if actual is None else str(actual))


def expected_and_got(check: EnvCheck) -> str:
    if check.expected is None and check.actual is None:
        return ""
    return f" (expected {check.expected or 'nothing'}, got {check.actual or 'nothing'})"


def describe_checks(heading: str, checks: list[EnvCheck]) -> list[str]:
    """The heading with the pass/fail/skip counts, then one line per check."""
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skip")}
    lines = [f"{heading}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip"]
    for c in checks:
        seen = expected_and_got(c) if c.status == "fail" else (f" [{c.actual}]" if c.actual else "")
        lines.append(f"  {c.status.upper():4} {c.name}: {c.detail}{seen}")
    return lines


def failure_lines(checks: list[EnvCheck]) -> list[str]:
    """One line per failed check, naming it."""
    return [f"{c.name} failed: {c.detail}{expected_and_got(c)}"
            for c in checks if c.status == "fail"]
