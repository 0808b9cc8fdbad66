"""Why an init or a request failed, read off its log or error text: the card, the server software,
or the harness and its environment; and, from the signs a killed process leaves
(`host_ram_cause`), the card's host when it ran out of RAM. Only the card's and its host's
failures are evidence about the card.

The rules are tried in order and the first that matches decides:

- a CUDA out-of-memory is the card's, wherever it is raised;
- what stops a process before the model can run is the environment's, even when upstream code
  raised it: a missing module, a program that cannot start, a rejected argument, a port in use, a
  permission refused;
- any other traceback is the card's when its innermost frame outside torch and the standard
  library is in the model's code (hosts.toml model_code), else the server software's;
- a connection that failed, with nothing else in the text, is the environment's;
- anything else is not classified (None), and is not evidence about the card either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from omniprobe.classify.host_ram import memory_failure
from omniprobe.classify.oom import is_oom, traceback_frames
from omniprobe.evidence.models.common import FailureCause

_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"(?m)^([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$")
_REASON_CHARS = 300


def _is_torch_or_stdlib(frame: dict[str, str]) -> bool:
    path = frame["file"]
    return ("/torch/" in path or path.startswith("<frozen ")
            or ("/lib/python3" in path and "-packages/" not in path))


@dataclass(frozen=True)
class Rule:
    label: str
    pattern: re.Pattern[str]  # group 1: the detail the reason quotes


def _rule(label: str, pattern: str) -> Rule:
    return Rule(label, re.compile(pattern))


# The environment's causes, looked for in the last traceback (or the whole text when it has none).
ENVIRONMENT_RULES: tuple[Rule, ...] = (
    _rule("import error", r"(?:ModuleNotFoundError|ImportError): ([^\n]+)"),
    # `python -m MODULE` for a module that is not there: "/usr/bin/python3: No module named x".
    _rule("import error", r"(?m)^\S*python[\d.]*: (No module named [^\n]+)"),
    # The server's keeper when exec fails: "omniprobe.harness.common.supervise: cannot start X: [Errno 2] ..."
    _rule("command not found", r"cannot start ([^\n]+)"),
    _rule("command not found", r"([^\n]*: command not found)"),
    _rule("missing file", r"FileNotFoundError: ([^\n]+)"),
    # argparse: the usage line, then "prog: error: unrecognized arguments: --x".
    _rule("argument error", r"(?ms)^usage: .*?^\S[^\n]*?: error: ([^\n]+)"),
    _rule("port in use", r"([^\n]*Address already in use[^\n]*)"),
    _rule("permission refused", r"(?:PermissionError: )?([^\n]*Permission denied[^\n]*)"),
)
DEAD_CONNECTION = _rule(
    "dead connection",
    r"((?:connection failed|Connection refused|Connection reset|ConnectionError)[^\n]*)")


def _cause(kind: str, label: str, detail: str) -> FailureCause:
    return FailureCause(kind=kind, reason=f"{label}: {' '.join(detail.split())}"[:_REASON_CHARS])


def _last_traceback(text: str) -> str:
    at = text.rfind(_TRACEBACK)
    return text[at:] if at >= 0 else text


def _exception_line(scope: str) -> str:
    found = _EXCEPTION_LINE.findall(scope)
    return found[-1].strip() if found else "no exception line"


def classify_failure(text: str, model_code: tuple[str, ...]) -> FailureCause | None:
    """The cause a failed init's log, or a failed request's error text and log, shows; None when
    no rule matches. `model_code`: path fragments of the model's source files."""
    if is_oom(text):
        return _cause("card", "CUDA out of memory", "the card's memory is exhausted")
    scope = _last_traceback(text)
    for rule in ENVIRONMENT_RULES:
        match = rule.pattern.search(scope)
        if match:
            return _cause("environment", rule.label, match.group(1))
    frames = traceback_frames(scope) if _TRACEBACK in text else []
    own = [f for f in frames if not _is_torch_or_stdlib(f)] or frames
    if own:
        frame = own[-1]
        where = f"{frame['file']}:{frame['line']} in {frame['func']}: {_exception_line(scope)}"
        if any(m in frame["file"] for m in model_code):
            return _cause("card", "crash in model code", where)
        return _cause("server", "traceback in server code", where)
    match = DEAD_CONNECTION.pattern.search(text)
    if match:
        return _cause("environment", DEAD_CONNECTION.label, match.group(1))
    return None


def host_ram_cause(oom_kills: tuple[int, int] | None, returncode: int | None,
                   available_mib: Sequence[float] | None, text: str,
                   gpu_free_mib: float | None) -> FailureCause | None:
    """The host's cause of a process that ran out of host RAM (host_ram.memory_failure, whose
    arguments these are); None for a GPU OOM or anything else, which classify_failure reads."""
    found = memory_failure(oom_kills, returncode, available_mib, text, gpu_free_mib)
    if found is None or found.kind != "host-ram":
        return None
    return _cause("host", "host RAM exhausted", found.sign)


def effective_cause(outcome: str, cause: FailureCause | None) -> FailureCause | None:
    """A failure's cause as the verdicts read it: the recorded one; an OOM is the card's even
    where none is recorded (transcribed evidence records the OOM, not a cause); None for a
    success or an unclassified failure."""
    if outcome in ("ok", "ready"):
        return None
    if cause is not None:
        return cause
    if outcome == "oom":
        return FailureCause(kind="card", reason="CUDA out of memory")
    return None


def is_card_evidence(outcome: str, cause: FailureCause | None) -> bool:
    """Whether a result says something about the card: every success, and the failures of the
    card and of its host (its RAM)."""
    if outcome in ("ok", "ready"):
        return True
    found = effective_cause(outcome, cause)
    return found is not None and found.kind in ("card", "host")


def cause_text(outcome: str, cause: FailureCause | None) -> str:
    """How the report names a failure that is not the card's."""
    found = effective_cause(outcome, cause)
    if found:
        return f"{found.kind}: {found.reason}"
    return "timed out: not the card's answer" if outcome == "timeout" else (
        f"not classified ({outcome})")
