"""Summaries derived from records: cells from per-request records (what the verdict rules read for
attempts the package measured), runs with their cells, and the facts of an environment manifest."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.classify.failure_cause import is_card_evidence
from omniprobe.classify.outcome import cell_outcome, cell_structure
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.common import OomSignature
from omniprobe.evidence.models.environment import EnvManifest
from omniprobe.evidence.models.offline import OfflineRun
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.models.runs import Cell, ServeRun
from omniprobe.evidence.quantities import Range
from omniprobe.evidence.repeats import standing


@dataclass(frozen=True)
class OfflineResult:
    """One line of an offline run as the report lists it: its failed init, or a fixture's cell."""

    configuration: str
    fixture: str | None
    seeds: list[int] | None
    outcome: str
    structure: str
    oom: OomSignature | None
    note: str | None


def offline_results(runs: list[OfflineRun]) -> list[OfflineResult]:
    """Each run's failed init, if any, then its cells, run by run."""
    found = []
    for run in runs:
        if run.init_failed is not None:
            found.append(OfflineResult(run.configuration, None, None, run.init_failed,
                                       "unchecked", run.init.oom, run.init.note))
        found += [OfflineResult(run.configuration, c.fixture, c.seeds, c.outcome, c.structure,
                                c.oom, c.note) for c in run.cells]
    return found


def _range(values: list[float | None]) -> Range | None:
    present = [v for v in values if v is not None]
    return Range.of(present) if present else None


def cell_from(records: list[RequestRecord]) -> Cell:
    """One fixture under one flag set. Its seeds and its figures come from the same records: the
    wall and peak ranges are over every seed when all of them succeeded, and absent otherwise (an
    OOM cell quotes no ok seed's wall as if it were the cell's)."""
    ok = records if all(r.outcome == "ok" for r in records) else []
    oom = next((r.oom for r in records if r.oom is not None), None)
    breach = next((r.emulation_breach for r in records if r.emulation_breach is not None), None)
    return Cell(fixture=records[0].fixture, seeds=sorted({r.seed for r in records}),
                outcome=cell_outcome([r.outcome for r in records]),
                structure=cell_structure(records),
                wall_s=_range([r.wall_s for r in ok]),
                server_peak_mb=_range([r.server_peak_mb for r in ok]),
                oom=oom, inputs=records[0].inputs, emulation_breach=breach)


def current_requests(requests: list[RequestRecord]) -> list[RequestRecord]:
    """The records that stand (evidence/repeats.py's rule)."""
    return standing(requests)


def cells_from_requests(requests: list[RequestRecord]) -> dict[str, list[Cell]]:
    """flag set -> its cells, in the order the fixtures were first requested; a request that
    failed for a cause other than the card measured nothing, and is left out."""
    grouped: dict[str, dict[str, list[RequestRecord]]] = {}
    for record in current_requests(requests):
        if not is_card_evidence(record.outcome, record.cause):
            continue
        grouped.setdefault(record.flag_set, {}).setdefault(record.fixture, []).append(record)
    return {flag_set: [cell_from(records) for records in fixtures.values()]
            for flag_set, fixtures in grouped.items()}


@dataclass(frozen=True)
class ServeRunView:
    """A flag set's run (its server lifetimes) with all of its cells, stored or derived from
    request records."""

    attempt: LoadedAttempt
    run: ServeRun
    cells: tuple[Cell, ...]

    @property
    def flag_set(self) -> str:
        return self.run.flag_set


def run_views(attempt: LoadedAttempt) -> list[ServeRunView]:
    derived = cells_from_requests(attempt.requests)
    return [ServeRunView(attempt, run, (*run.cells, *derived.get(run.flag_set, []))) for run in attempt.runs]


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
