"""The Diffusers env's pins resolve as the build resolves them (issue 52): the real hosts.toml
[diffusers_env] plan, torch and torchvision from the cu130 index and the rest from PyPI, through
the build's own `uv pip compile` (env/resolve.py). It installs nothing and downloads no wheel, but
needs both indexes: the e2e tier (`-- -m e2e`). Where an index cannot be reached it skips, naming
the host (the build's own Unreachable): that is the machine's network, not the pins'."""

from __future__ import annotations

import sys

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env.build import _constraints, _requirement
from omniprobe.env.resolve import Unreachable, resolve_plan
from omniprobe.env.state import Runner, env_paths, install_steps, uv_command

from .env_scaffold import REPO_ROOT

pytestmark = [pytest.mark.network, pytest.mark.e2e]


def test_the_diffusers_env_plan_resolves_with_its_pins(tmp_path):
    project = Project(REPO_ROOT)
    cfg = load_hosts(project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, "diffusers")
    # The pins the committed evidence records: checked whether or not the indexes answer.
    assert {step.name: step.pin for step in steps} == {
        "torch": "2.11.0+cu130", "torchvision": "0.26.0+cu130", "transformers": "5.17.0",
        "diffusers": "0.42.1", "accelerate": "1.15.0", "torchao": "0.18.0"}
    paths = env_paths(cfg, project, "any-gpu-diffusers", tmp_path / "venv", "diffusers")
    said: list[str] = []
    # The interpreter running the tests stands for the env's: the pins name no Python version.
    try:
        resolve_plan(uv_command(), sys.executable, steps, _constraints(steps, paths, {}),
                     lambda step: _requirement(step, paths, ""), Runner(), said.append)
    except Unreachable as offline:
        pytest.skip(str(offline).splitlines()[0])
    assert said[-1].startswith("# the install plan resolves:"), said
    assert not (tmp_path / "venv").exists()  # resolved, nothing installed
