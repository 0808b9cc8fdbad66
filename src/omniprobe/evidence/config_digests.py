"""An attempt built from committed model configs (random weights) records each file's sha256
(`environment.served.config_digests`). A committed config that differs from the one the attempt
recorded makes the attempt's figures another model's, so validate names it. Only the committed
file counts: the report reads it, and a copy elsewhere (a git-ignored one under artifacts/) is
no other clone's, so it neither confirms nor excuses anything. A changed model is a new folder
under models/.

The folders themselves are checked as validate loads the project: each random-weight host's folder
loads (its manifest matches its configs and its pipeline) and the host's profiles name its
pipeline, so a configuration that could only fail in a build is named before any attempt."""

from __future__ import annotations

import re

from omniprobe.config.diffusers import ModelConfigs, load_model_configs, pipeline_problems
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.model_manifest import COMPONENT_NAME
from omniprobe.config.project import Project
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.files import ATTEMPT_FILE
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.migrations import content_path
from omniprobe.safe_io import confine, read_bytes


def _digest(path) -> str | None:
    try:
        return sha256_bytes(read_bytes(path))
    except InputError:
        return None


def config_problems(attempt: LoadedAttempt, project: Project) -> list[Problem]:
    """Each recorded config digest the committed file does not match."""
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
        found = _digest(committed)
        if found == recorded:
            continue
        problems.append(Problem(file, field, (
            f"{served.configs}/{name}.json " + ("is missing" if found is None else
                                                f"has sha256 {found[:12]}…")
            + f"; attempt {attempt.id} was built from {recorded[:12]}…: the committed config "
            "changed since. Restore it; a changed model is a new folder under models/, which "
            "new attempts name")))
    return problems


def model_folder_problems(hosts: HostsConfig, project: Project) -> list[Problem]:
    """Each random-weight host's model folder that does not load, each of its profiles that
    names another pipeline than the folder's (each folder read once), and each published figure
    of a model no host builds."""
    problems: list[Problem] = []
    loaded: dict[str, ModelConfigs | None] = {}
    for name, host in hosts.hosts.items():
        spec = host.diffusers
        if spec is None or spec.configs is None:
            continue
        if spec.configs not in loaded:
            try:
                loaded[spec.configs] = load_model_configs(project.root, spec.configs)
            except InputError as exc:
                loaded[spec.configs] = None
                problems.extend(exc.problems)
        configs = loaded[spec.configs]
        if configs is not None:
            profiles = {p: hosts.diffusers_profiles[p] for p in host.diffusers_profiles
                        if p in hosts.diffusers_profiles}
            problems.extend(pipeline_problems(profiles, configs, str(project.hosts_file), name))
    models = {c.manifest.model for c in loaded.values() if c is not None}
    problems.extend(
        Problem(str(project.hosts_file), f"[published_figures.{key}] key 'model'",
                f"{figure.model!r} is no model a host builds; expected one of "
                f"{', '.join(sorted(map(repr, models))) or '(none)'}, as a model folder's "
                "model.json names it")
        for key, figure in hosts.published_figures.items() if figure.model not in models)
    return problems
