import shutil
from pathlib import Path

import pytest

from omniprobe.project import Project

REPO = Path(__file__).resolve().parents[1]
PROJECT_PARTS = (
    "hosts.toml",
    "fixtures",
    "evidence",
    "templates",
    "schemas",
    "deploy",
    "REPORT.md",
)


@pytest.fixture
def repo() -> Project:
    return Project(REPO)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A private copy of the committed project, safe to break."""
    for part in PROJECT_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part)
        elif src.exists():
            shutil.copy2(src, tmp_path / part)
    return Project(tmp_path)
