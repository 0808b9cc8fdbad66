"""The report as the tests read it: every output of a project rendered in one pass, and the
committed project's outputs rendered once per process, since no test writes to it (the `repo`
fixture's contract). A render costs a second or more; the suite reads the committed one some fifty
times."""

from functools import cache
from pathlib import Path

from omniprobe.config.project import Project
from omniprobe.report.paths import DETAILS_FILE, HARNESS_FILE, REPORT_FILE
from omniprobe.report.render import render_outputs as _render_outputs

from .conftest import REPO


@cache
def _committed_outputs() -> dict[Path, str]:
    return _render_outputs(Project(REPO))


def render_outputs(project: Project) -> dict[Path, str]:
    if project.root.resolve() == REPO:
        return dict(_committed_outputs())
    return _render_outputs(project)


def render_report(project: Project) -> str:
    return render_outputs(project)[REPORT_FILE]


def render_harness(project: Project) -> str:
    return render_outputs(project)[HARNESS_FILE]


def render_details(project: Project) -> str:
    return render_outputs(project)[DETAILS_FILE]


def render_report_and_details(project: Project) -> str:
    """REPORT.md and report/DETAILS.md together, from one render."""
    outputs = render_outputs(project)
    return outputs[REPORT_FILE] + outputs[DETAILS_FILE]
