"""Issue 52, the first run: a runner's Python that lacks a package says which and what to do."""

from __future__ import annotations

import sys

import pytest

from omniprobe.harness.offline.matrix import RunnerEnvBroken, runner_facts


def test_a_runner_python_without_torch_names_the_package_and_both_ways_forward():
    command = [sys.executable, "-c", "import torch_missing_here.cuda"]
    with pytest.raises(RunnerEnvBroken) as refused:
        runner_facts(command, {}, timeout_s=60)
    words = str(refused.value)
    assert f"the runner's Python {sys.executable} has no module 'torch_missing_here'" in words
    assert 'runner_env = "diffusers"' in words and "nox -s probe-capacity" in words
    assert "omniprobe wheels --dest .whl" in words and "Traceback" not in words


def test_another_failure_of_the_runner_python_still_shows_its_last_lines():
    with pytest.raises(RunnerEnvBroken, match=r"failed --versions \(exit 3\): .*gone"):
        runner_facts([sys.executable, "-c", "import sys; print('gone', file=sys.stderr); "
                                            "sys.exit(3)"], {}, timeout_s=60)


def test_the_command_line_answers_its_version_and_each_probes_help_gives_every_default(capsys):
    from omniprobe import __version__
    from omniprobe.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"omniprobe {__version__}"
    with pytest.raises(SystemExit):
        main(["probe-capacity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "bisect the smallest memory pool" in text.split("options:")[0]  # its description
    for flag, default in (("--floor-mib", 1024), ("--resolution-mib", 256), ("--repeats", 2)):
        assert f"(default: {default})" in text.split(flag, 2)[2].split("--", 1)[0], flag
    assert "--build-env" in text


def test_probe_capacity_takes_build_env_as_probe_baseline_does():
    from omniprobe.cli import build_parser
    from omniprobe.cli.options import options_from

    args = build_parser().parse_args(["probe-capacity", "--build-env", "--profile", "p"])
    options = options_from(args)
    assert options.build_env and options.configurations == ("p",)


def test_an_env_build_on_another_machine_stops_before_any_download(tmp_path):
    """The wrong GPU: the build stops at the checks a second answers, before uv finds a Python,
    clones or installs anything, and names the command that fixes it."""
    from omniprobe.env.build import build_env, dry_run
    from omniprobe.env.state import EnvNotReady, Runner

    from .env_scaffold import FakeNvml, make_world

    world = make_world(tmp_path)
    runner = Runner()
    with pytest.raises(EnvNotReady) as refused:
        build_env("testhost", project=world.project, runner=runner, echo=lambda line: None,
                  nvml=FakeNvml(name="NVIDIA GeForce RTX 5080", memory_mib=16303))
    words = str(refused.value)
    assert "checked before anything is downloaded or built" in words
    assert "gpu.name" in words and "NVIDIA GeForce RTX 5080" in words
    assert "omniprobe host add NAME --like testhost" in words
    assert runner.ran == []  # not one command: no Python found, nothing cloned or installed
    plan = dry_run(world.project, "testhost").splitlines()
    first = next(i for i, line in enumerate(plan) if not line.startswith("#"))
    assert any("before anything is downloaded" in line for line in plan[:first])


@pytest.mark.parametrize("gpu, memory_mib, capability, refused", [
    ("NVIDIA H100 80GB HBM3", 81559, (9, 0), None),
    ("NVIDIA A100-SXM4-40GB", 40960, (8, 0), None),
    ("NVIDIA H200", 143771, (9, 0), None),
    ("NVIDIA GeForce RTX 4090", 24564, (8, 9), "gpu.memory failed"),
    ("Tesla V100-SXM2-32GB", 40960, (7, 0), "gpu.compute_capability failed"),
])
def test_any_big_gpu_runs_the_capacity_search_host_by_its_minimums_not_its_name(
        repo, gpu, memory_mib, capability, refused):
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.checks import machine_refusal

    from .env_scaffold import FakeNvml

    cfg = load_hosts(repo.hosts_file)
    found = machine_refusal(cfg, repo, "any-gpu-diffusers",
                            FakeNvml(name=gpu, memory_mib=memory_mib, capability=capability))
    if refused is None:
        assert found is None
    else:
        assert refused in found and "run it where NVML reads any NVIDIA GPU of at least 40 GiB" \
            in found and "host add" not in found


def test_the_env_of_a_host_whose_runner_runs_in_the_diffusers_env_is_that_env(repo, capsys,
                                                                               monkeypatch):
    from omniprobe.cli import main

    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo.root))
    assert main(["env", "build", "--host", "any-gpu-diffusers", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "the diffusers env runs" in out and "any-gpu-diffusers-diffusers" in out
    assert main(["env", "build", "--host", "rtx3090", "--dry-run"]) == 0
    assert "the probe env runs" in capsys.readouterr().out
