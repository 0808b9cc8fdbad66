"""Where a project's inputs live: hosts.toml, fixtures/, evidence/, templates/ (and its report.toml)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omniprobe import project_files as files
from omniprobe.errors import InputError, Problem


class NoProject(InputError):
    """No folder at or above the start holds hosts.toml."""


@dataclass(frozen=True)
class Project:
    root: Path

    @property
    def hosts_file(self) -> Path:
        return self.root / files.HOSTS_FILE

    @property
    def sim_file(self) -> Path:
        return self.root / files.SIM_FILE

    @property
    def fixtures_file(self) -> Path:
        return self.root / files.FIXTURES_DIR / files.FIXTURES_FILE

    @property
    def evidence_dir(self) -> Path:
        return self.root / files.EVIDENCE_DIR

    @property
    def templates_dir(self) -> Path:
        return self.root / files.TEMPLATES_DIR

    @property
    def report_settings_file(self) -> Path:
        """The report's title and the issues it cites, kept with the templates."""
        return self.templates_dir / files.REPORT_SETTINGS_FILE

    @property
    def report_file(self) -> Path:
        return self.root / files.REPORT_FILE

    @property
    def schema_dir(self) -> Path:
        return self.root / files.SCHEMA_DIR

    @property
    def artifacts_dir(self) -> Path:
        """Large outputs (logs, images, timelines) live outside git."""
        return Path(os.environ.get("OMNIPROBE_ARTIFACTS", self.root / files.ARTIFACTS_DIR))


def find_project(start: str | Path | None = None) -> Project:
    """The nearest folder at or above `start` (default: cwd) that holds hosts.toml."""
    env = os.environ.get("OMNIPROBE_ROOT")
    if env:
        return Project(Path(env).resolve())
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / files.HOSTS_FILE).is_file():
            return Project(folder)
    raise NoProject([Problem(str(here), "", "no hosts.toml here or in any folder above it; "
                                          "run inside an omniprobe project or set OMNIPROBE_ROOT")])
