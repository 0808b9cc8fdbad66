"""Render REPORT.md, report/HARNESS.md and their figures; check that the committed ones are fresh."""

from __future__ import annotations

import difflib
from pathlib import Path

import jinja2

from omniprobe.atomic import write_text_atomic
from omniprobe.config.project import Project
from omniprobe.config.report_settings import load_report_settings
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.validate import load_valid_project
from omniprobe.report.paths import CAPACITY_DIR, HARNESS_FILE, REPORT_FILE, TIMELINES_DIR
from omniprobe.report.templating import environment
from omniprobe.report.views import build_context

TEMPLATES = {REPORT_FILE: "report.md.j2", HARNESS_FILE: "harness.md.j2"}


def render_outputs(project: Project) -> dict[Path, str]:
    """Every file the report consists of, relative to the project root: REPORT.md, HARNESS.md and
    their figures."""
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
    if diffusers is not None and diffusers.capacity is not None:
        outputs[Path(diffusers.capacity.figure_path)] = diffusers.capacity.figure_svg
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


def render_report(project: Project) -> str:
    return render_outputs(project)[REPORT_FILE]


def render_harness(project: Project) -> str:
    return render_outputs(project)[HARNESS_FILE]


def _committed_figures(project: Project) -> set[Path]:
    folders = [project.root / TIMELINES_DIR, project.root / CAPACITY_DIR]
    return {p.relative_to(project.root) for folder in folders if folder.is_dir()
            for p in folder.rglob("*.svg")}


def write_report(project: Project) -> Path:
    """Write REPORT.md, HARNESS.md and their figures; figures no longer rendered are removed."""
    outputs = render_outputs(project)
    for rel, text in outputs.items():
        write_text_atomic(project.root / rel, text)
    for stale in _committed_figures(project) - set(outputs):
        (project.root / stale).unlink()
    return project.report_file


def report_diff(project: Project) -> str:
    """A unified diff between the committed report files and a fresh render; empty when fresh."""
    outputs = render_outputs(project)
    diffs = []
    for rel in sorted(set(outputs) | _committed_figures(project)):
        path = project.root / rel
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        fresh = outputs.get(rel, "")
        if fresh != committed:
            diffs.append("".join(difflib.unified_diff(
                committed.splitlines(True), fresh.splitlines(True),
                f"{rel} (committed)", f"{rel} (fresh render)")) or f"{rel} differs\n")
    return "".join(diffs)
