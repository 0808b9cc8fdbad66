"""One record per cell, the rule validate checks and a resume checks before it appends: a
second record of a cell would silently change what the summaries take."""

from __future__ import annotations

from omniprobe.errors import Problem
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.migrations import content_path
from omniprobe.evidence.models.offline import OfflineRequest
from omniprobe.evidence.models.requests import RequestRecord


def cell_of(record: RequestRecord | OfflineRequest) -> tuple:
    """The cell a request record measures: (flag set or kwarg set, fixture, seed)."""
    return (record.configuration if isinstance(record, OfflineRequest) else record.flag_set,
            record.fixture, record.seed)


def standing(records: list) -> list:
    """The records that stand: a lost request or a timeout that a later send of its cell
    superseded measured nothing, and drops out (the last record of a cell always stands)."""
    last = {cell_of(r): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if not r.sent_again_on_resume or last[cell_of(r)] == i]


def repeat_problems(attempt: LoadedAttempt) -> list[Problem]:
    """One record per cell: a second record of a (flag set or kwarg set, fixture, seed), a second
    run of a flag set or a second cell of a fixture in one run would silently change what the
    summaries take (the worst outcome of a cell's records)."""
    problems: list[Problem] = []

    def once(file: str, keyed: list[tuple[str, tuple]], what: str) -> None:
        first: dict[tuple, str] = {}
        for path, key in keyed:
            if key in first:
                problems.append(Problem(str(attempt.path / file), content_path(file, path),
                                        f"a second record of {what} {key!r}; the first is at "
                                        f"{content_path(file, first[key])}"))
            else:
                first[key] = path

    once("runs.json", [(f"$[{i}].flag_set", (r.flag_set,)) for i, r in enumerate(attempt.runs)],
         "flag set")
    for i, run in enumerate(attempt.runs):
        once("runs.json", [(f"$[{i}].cells[{j}].fixture", (c.fixture,))
                           for j, c in enumerate(run.cells)], f"run {run.flag_set!r}'s fixture")
    # A transport failure or a timeout may be followed by the resume's send of its cell; nothing
    # else may.
    kept = {id(r) for r in standing(attempt.requests)}
    once("requests.json", [(f"$[{i}]", cell_of(r)) for i, r in enumerate(attempt.requests)
                           if id(r) in kept], "(flag set, fixture, seed)")
    once("offline.json", [(f"$[{i}].{'profile' if r.profile else 'kwarg_set'}", (r.configuration,))
                          for i, r in enumerate(attempt.offline)], "kwarg set or profile")
    for i, run in enumerate(attempt.offline):
        once("offline.json", [(f"$[{i}].cells[{j}].fixture", (c.fixture,))
                              for j, c in enumerate(run.cells)],
             f"run {run.configuration!r}'s fixture")
    kept = {id(r) for r in standing(attempt.offline_requests)}
    once("offline-requests.json", [(f"$[{i}]", cell_of(r))
                                   for i, r in enumerate(attempt.offline_requests)
                                   if id(r) in kept], "(kwarg set, fixture, seed)")
    once("psnr.json", [(f"$[{i}]", (r.flag_set, r.fixture, tuple(r.seeds), r.baseline_attempt,
                                    r.comparator)) for i, r in enumerate(attempt.psnr)],
         "(flag set, fixture, seeds, baseline, comparator)")
    return problems
