"""Render REPORT.md, report/HARNESS.md, report/DETAILS.md and their figures; check that the
committed ones are fresh."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from omniprobe.atomic import write_text_atomic
from omniprobe.config.project import Project
from omniprobe.config.report_settings import load_report_settings
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.validate import load_valid_project
from omniprobe.report.paths import (
    CAPACITY_DIR,
    DETAILS_FILE,
    HARNESS_FILE,
    REPORT_FILE,
    TIMELINES_DIR,
)
from omniprobe.report.templating import environment
from omniprobe.report.views import build_context

TEMPLATES = {REPORT_FILE: "report.md.j2", HARNESS_FILE: "harness.md.j2",
             DETAILS_FILE: "details.md.j2"}


def render_outputs(project: Project) -> dict[Path, str]:
    """Every file the report consists of, relative to the project root: REPORT.md, HARNESS.md,
    DETAILS.md and their figures."""
    loaded = load_valid_project(project)
    settings = load_report_settings(project.report_settings_file)
    env = environment(project, loaded.hosts)
    context = build_context(loaded, settings, project.root)
    outputs = {path: _render(project, env, name, context) for path, name in TEMPLATES.items()}
    for section in context["sections"]:
        outputs.update({Path(t.path): t.svg for t in section.timelines})
    outputs.update({Path(e.figure.path): e.figure.svg for e in context["emulations"].values()
                    if e.figure})
    diffusers = context["diffusers"]
    if diffusers is not None:
        searched = [diffusers.capacity, *(m.capacity for m in diffusers.other_models)]
        outputs.update({Path(c.figure_path): c.figure_svg for c in searched if c is not None})
    return outputs


def _render(project: Project, env: jinja2.Environment, name: str, context: dict) -> str:
    """One template rendered; a missing or malformed one is an input error naming its file."""
    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise InputError([Problem(str(project.templates_dir / exc.name), "",
                                  "template not found (templates/ holds the report's layout)")]
                         ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise InputError([Problem(str(project.templates_dir / (exc.name or name)),
                                  f"line {exc.lineno}", f"not a valid template: {exc.message}")]
                         ) from None


def _committed_figures(project: Project) -> set[Path]:
    folders = [project.root / TIMELINES_DIR, project.root / CAPACITY_DIR]
    return {p.relative_to(project.root) for folder in folders if folder.is_dir()
            for p in folder.rglob("*.svg")}


@dataclass(frozen=True)
class Written:
    """What `write_report` did: the files it wrote (new or changed), the figures it removed (no
    longer rendered), and how many it left as they were."""
    wrote: list[Path]
    removed: list[Path]
    unchanged: int


def _committed_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def write_report(project: Project) -> Written:
    """Write REPORT.md, HARNESS.md and their figures where they differ from a fresh render;
    figures no longer rendered are removed."""
    outputs = render_outputs(project)
    wrote = []
    for rel, text in outputs.items():
        path = project.root / rel
        # Not a file (a folder in its place): writing it says so, naming it.
        if not path.is_file() or _committed_text(path) != text:
            write_text_atomic(path, text)
            wrote.append(rel)
    removed = sorted(_committed_figures(project) - set(outputs))
    for stale in removed:
        (project.root / stale).unlink()
    return Written(wrote=sorted(wrote), removed=removed, unchanged=len(outputs) - len(wrote))


def stale_summary(committed: str | None, fresh: str | None) -> str | None:
    """One line on how a committed report file differs from a fresh render; None when it does
    not."""
    if committed == fresh:
        return None
    if committed is None:
        return "missing: a fresh render writes it"
    if fresh is None:
        return "no longer rendered: a fresh render removes it"
    old, new = committed.splitlines(), fresh.splitlines()
    first = next((n for n, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                 min(len(old), len(new)))
    changed = [line for line in difflib.unified_diff(old, new, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    added = sum(line.startswith("+") for line in changed)
    return (f"differs from a fresh render: {added} line(s) added, {len(changed) - added} "
            f"removed, the first at line {first + 1}")


def stale_files(project: Project) -> dict[Path, str]:
    """Each committed report file that differs from a fresh render, with a one-line summary;
    empty when every one is fresh."""
    outputs = render_outputs(project)
    found = {}
    for rel in sorted(set(outputs) | _committed_figures(project)):
        summary = stale_summary(_committed_text(project.root / rel), outputs.get(rel))
        if summary is not None:
            found[rel] = summary
    return found
