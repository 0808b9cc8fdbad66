"""An env build says what it downloads, and roughly how much, before it starts (issue 52): the
pins by name; a size only where omniprobe measured an env of those pins, with its basis; and the
line comes after the machine's checks and before the first command."""

from __future__ import annotations

import re
import subprocess

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env.build import build_env, dry_run
from omniprobe.env.download_size import ESTIMATES, download_notice
from omniprobe.env.state import EnvBuildError, Runner, install_steps

from .env_scaffold import REPO_ROOT, FakeNvml, make_world

REAL = Project(REPO_ROOT)


@pytest.mark.parametrize(("which", "size"), [
    ("diffusers", "some 5.0 GB on disk once installed; omniprobe's estimate: "),
    ("probe", "a size not measured; not measured as a whole: "),
])
def test_the_notice_names_every_pin_and_the_size_only_where_measured(which, size):
    steps = install_steps(load_hosts(REAL.hosts_file), REAL.hosts_file, which)
    notice = download_notice(which, steps)
    assert all(f"{step.name} {step.pin}" in notice for step in steps)
    assert size in notice
    assert ESTIMATES[which].basis in notice


def test_the_diffusers_estimate_names_the_torch_it_measured():
    # The basis is the tests-diffusers venv, pyproject's diffusers extra: its torch must be
    # [diffusers_env]'s, else the measure stands for another env.
    steps = install_steps(load_hosts(REAL.hosts_file), REAL.hosts_file, "diffusers")
    [torch] = [step for step in steps if step.name == "torch"]
    extra = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"torch=={torch.version.split("+")[0]}"' in extra


class Refusing(Runner):
    """Runs nothing: the first command fails, as a machine without uv's Python would."""

    def run(self, argv, **kwargs):
        self.ran.append(argv)
        return subprocess.CompletedProcess(list(argv), 2, "", "no Python")


def test_a_build_says_it_after_the_machine_checks_and_before_the_first_command(tmp_path):
    world = make_world(tmp_path)
    said: list[str] = []
    runner = Refusing()
    with pytest.raises(EnvBuildError):
        build_env("testhost", project=world.project, runner=runner, echo=said.append,
                  nvml=FakeNvml())
    assert runner.ran  # the build went on to its first command
    [notice] = [line for line in said if "build downloads" in line]
    assert said.index(notice) == 1  # after "building (...)"; every command comes after it
    assert "six 1.16.0" in notice and "a size not measured" in notice
    plan = dry_run(world.project, "testhost").splitlines()
    assert re.match(r"# the env build downloads ", plan[5]) and "before anything" in plan[4]
