"""What one offline entry's runner processes produced (its logs, timelines, build, host RAM and
any init failure), and its last failed init on record."""

from __future__ import annotations

from dataclasses import dataclass, field

from omniprobe.evidence.models.common import ArtifactRef
from omniprobe.evidence.models.offline import DiffusersBuild, HostRamCheck, OfflineCell
from omniprobe.evidence.models.runs import TimelineSummary


@dataclass
class EntryState:
    """What one entry's runner processes produced, for its offline.json rows (a resumed attempt's
    earlier rows included)."""

    init_s: float | None = None
    failure: OfflineCell | None = None
    logs: list[ArtifactRef] = field(default_factory=list)
    timelines: list[TimelineSummary] = field(default_factory=list)
    build: DiffusersBuild | None = None
    survives_failure: bool = False
    host_ram: list[HostRamCheck] = field(default_factory=list)

    @classmethod
    def resumed(cls, rows: list[OfflineCell]) -> EntryState:
        """What a resumed attempt's rows of the entry hold (a fixture's row, where there is one:
        an init failure's row is superseded by a fresh build)."""
        row = next((r for r in rows if r.fixture is not None), rows[0] if rows else None)
        if row is None:
            return cls()
        return cls(init_s=row.init_s, logs=list(row.logs), timelines=list(row.timelines),
                   build=row.build, host_ram=list(row.host_ram))


def init_failure(rows: list[OfflineCell]) -> OfflineCell | None:
    """An entry's last failed init on record, if any (plan.init_settled says whether it stands)."""
    return next((r for r in reversed(rows) if r.outcome in ("init-oom", "init-error", "timeout")
                 and r.fixture is None), None)
