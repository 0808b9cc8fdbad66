"""What one offline entry's runner processes produced (their lifetimes, the build and any init
failure), and its failed init on record."""

from __future__ import annotations

from dataclasses import dataclass, field

from omniprobe.evidence.models.offline import DiffusersBuild, OfflineRun, RunnerLifetime
from omniprobe.evidence.models.runs import InitResult


@dataclass
class EntryState:
    """What one entry's runner processes produced, for its offline run (a resumed attempt's
    earlier lifetimes included)."""

    init_s: float | None = None
    failure: InitResult | None = None
    lifetimes: list[RunnerLifetime] = field(default_factory=list)
    build: DiffusersBuild | None = None
    survives_failure: bool = False
    closed: str | None = None  # why the runner now running closed early (its lifetime keeps it)

    @classmethod
    def resumed(cls, run: OfflineRun | None) -> EntryState:
        """What a resumed attempt's run of the entry holds (a failed init is superseded by a
        fresh build)."""
        if run is None:
            return cls()
        ready = run.init is not None and run.init.outcome == "ready"
        return cls(init_s=run.init.time_s if ready else None, lifetimes=list(run.lifetimes),
                   build=run.build)


def init_failure(run: OfflineRun | None) -> InitResult | None:
    """An entry's failed init on record, if any (plan.init_settled says whether it stands)."""
    return run.init if run is not None and run.init_failed is not None else None
