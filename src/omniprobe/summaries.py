"""Summaries derived from records: cells from per-request records, runs with their cells, and
the facts of an environment manifest."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .evidence import Cell, EnvManifest, LoadedAttempt, RequestRecord, ServeRun
from .quantities import Range

# Worst first: a cell's outcome is the worst of its requests'.
_OUTCOME_ORDER = ("oom", "timeout", "error", "ok")


def cell_from_requests(fixture: str, requests: list[RequestRecord]) -> Cell:
    outcome = min((r.outcome for r in requests), key=_OUTCOME_ORDER.index)
    qualities = {r.quality for r in requests}
    if outcome != "ok":
        quality = "unchecked"
    elif "broken" in qualities:
        quality = "broken"
    elif qualities == {"sound"}:
        quality = "sound"
    else:
        quality = "unchecked"
    ok = [r for r in requests if r.outcome == "ok"]
    peaks = [r.server_peak_mb for r in requests if r.server_peak_mb is not None]
    ooms = [r.oom for r in requests if r.oom is not None]
    return Cell(
        fixture=fixture,
        seeds=sorted({r.seed for r in requests}),
        outcome=outcome,
        quality=quality,
        wall_s=Range.of(r.wall_s for r in ok) if ok else None,
        server_peak_mb=Range.of(peaks) if peaks else None,
        oom=ooms[0] if ooms else None,
    )


def cells_from_requests(requests: list[RequestRecord]) -> dict[str, list[Cell]]:
    """Per flag set, one cell per fixture, in the order fixtures first appear."""
    grouped: dict[str, dict[str, list[RequestRecord]]] = defaultdict(dict)
    for record in requests:
        grouped[record.flag_set].setdefault(record.fixture, []).append(record)
    return {
        flag_set: [cell_from_requests(fixture, recs) for fixture, recs in by_fixture.items()]
        for flag_set, by_fixture in grouped.items()
    }


@dataclass(frozen=True)
class RunView:
    """One server lifetime with all of its cells, stored or derived from request records."""

    attempt: LoadedAttempt
    run: ServeRun
    cells: tuple[Cell, ...]

    @property
    def flag_set(self) -> str:
        return self.run.flag_set


def run_views(attempt: LoadedAttempt) -> list[RunView]:
    derived = cells_from_requests(attempt.requests)
    return [RunView(attempt, run, (*run.cells, *derived.get(run.flag_set, []))) for run in attempt.runs]


def manifest_summary(manifest: EnvManifest) -> dict:
    """The few facts the report shows for a host's environment."""
    gpu = manifest.host_facts.gpu
    counts = {status: sum(c.status == status for c in manifest.checks)
              for status in ("pass", "fail", "skip")}
    return {
        "host": manifest.host,
        "ok": manifest.ok,
        "python": manifest.python.version,
        "gpu": gpu.name if gpu else None,
        "vram_mib": gpu.memory_total_mib if gpu else None,
        "compute_capability": gpu.compute_capability if gpu else None,
        "driver": gpu.driver_version if gpu else None,
        "packages": [{"name": p.name, "pin": p.pin, "resolved": p.resolved}
                     for p in manifest.pins],
        "checks": counts,
        "failed": [f"{c.name}: {c.detail}" for c in manifest.failed_checks],
        "freeze_count": len(manifest.freeze),
        "uv": manifest.uv_version,
        "action": manifest.action,
        "total_s": manifest.timings.total_s,
    }
