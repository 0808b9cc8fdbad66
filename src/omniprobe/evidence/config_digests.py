"""An attempt built from committed model configs (random weights) records each file's sha256
(`environment.served.config_digests`); the configs under models/ may change after. A config
that differs from the one the attempt recorded makes the attempt's figures another model's, so
validate names it, unless the attempt's own configs were kept beside it:
`artifacts/<host>/<attempt>/configs/<component>.json`, each with the recorded sha256."""

from __future__ import annotations

import re

from omniprobe.config.diffusers import COMPONENT_NAME
from omniprobe.config.project import Project
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.files import ATTEMPT_FILE
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.migrations import content_path
from omniprobe.safe_io import confine, read_bytes

KEPT = "configs"  # the folder under the attempt's artifacts that keeps its own configs


def kept_configs_dir(project: Project, attempt: LoadedAttempt):
    return project.artifacts_dir / attempt.host / attempt.id / KEPT


def _digest(path) -> str | None:
    try:
        return sha256_bytes(read_bytes(path))
    except InputError:
        return None


def config_problems(attempt: LoadedAttempt, project: Project) -> list[Problem]:
    """Each recorded config digest the committed file (and no kept copy) matches."""
    environment = attempt.meta.environment
    served = environment.served if environment is not None else None
    if served is None or not served.config_digests:
        return []
    file = str(attempt.path / ATTEMPT_FILE)
    where = content_path(ATTEMPT_FILE, "$.environment.served")
    if served.configs is None:
        return [Problem(file, f"{where}.configs", "config digests without the config folder "
                                                  "they are of; expected a folder under models/")]
    try:
        folder = confine(project.root, served.configs, file=file, field=f"{where}.configs")
    except InputError as exc:
        return exc.problems
    problems = []
    for name, recorded in served.config_digests.items():
        field = f"{where}.config_digests.{name}"
        if not re.match(COMPONENT_NAME, name):
            problems.append(Problem(file, field, f"unknown component {name!r} (expected a "
                                                 f"component's name, {COMPONENT_NAME})"))
            continue
        committed = folder / f"{name}.json"
        if _digest(committed) == recorded:
            continue
        if _digest(kept_configs_dir(project, attempt) / f"{name}.json") == recorded:
            continue  # the attempt's own config is kept beside it
        found = _digest(committed)
        problems.append(Problem(file, field, (
            f"{served.configs}/{name}.json " + ("is missing" if found is None else
                                                f"has sha256 {found[:12]}…")
            + f"; attempt {attempt.id} was built from {recorded[:12]}…: the committed config "
            f"changed since. Restore it, or keep the attempt's own under "
            f"{kept_configs_dir(project, attempt)}/")))
    return problems
