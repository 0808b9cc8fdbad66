"""The Diffusers env (issue 22 item 4): hosts.toml [diffusers_env], a plan of its own beside the
probe env's, every pin chosen by omniprobe, and probe-baseline refusing a real host whose
Diffusers env is not built. No GPU, no network."""

from __future__ import annotations

import io
import shlex
import subprocess
from datetime import UTC, datetime

import pytest

from omniprobe import cli
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env.manifest import latest_manifest, record_manifest
from omniprobe.env.state import EnvNotReady, env_paths, install_steps, pins_hash, uv_command
from omniprobe.errors import InputError
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.options import BaselineOptions
from omniprobe.harness.offline.baseline import run_baseline
from omniprobe.harness.offline.env import runner_env_name

from .conftest import hosts_written, make_project
from .env_scaffold import REPO_ROOT, sample_manifest

REAL = Project(REPO_ROOT)
DIFFUSERS_PINS = [("torch", "2.11.0+cu130"), ("torchvision", "0.26.0+cu130"),
                 ("transformers", "5.17.0"), ("diffusers", "0.42.1"), ("accelerate", "1.15.0"),
                 ("torchao", "0.18.0")]
# A real host with the snapshot whose Diffusers runner runs in the Diffusers env.
SNAPSHOT_HOST = """
[hosts.rtx5080-diffusers]
kind = "diffusers"
name = "RTX 5080: Qwen-Image-2.1 in Diffusers"
hostname = "cachyos-9900x-o11d"
gpu = "NVIDIA GeForce RTX 5080"
compute_capability = "12.0"
vram_gb = 16
python_provider = "the Diffusers env"
diffusers_profiles = ["seed-baseline"]
offline_command = ["{python}", "{runner}"]
model_code = ["diffusers/models/"]

[hosts.rtx5080-diffusers.diffusers]
weights = "snapshot"
"""


def test_the_diffusers_env_pins_what_the_diffusers_engine_needs_each_chosen_by_omniprobe():
    cfg = load_hosts(REAL.hosts_file)
    steps = cfg.diffusers_env.install
    assert [(s.name, s.pin) for s in steps] == DIFFUSERS_PINS
    assert all(s.chosen is not None and s.chosen.reason for s in steps)
    # The torch every committed Diffusers attempt ran, from [stack]'s index (the same CUDA).
    torch = steps[0]
    assert torch.index == cfg.stack.torch_index
    recorded = {r.packages["torch"] for a in load_project(REAL)[0].evidence.attempts
                for r in [a.meta.environment] if r is not None and r.packages.get("torch")
                and a.host.endswith("diffusers")}
    assert recorded == {torch.version.split("+")[0]}


@pytest.mark.parametrize("edit, replacement, where, words", [
    # A step without its chosen-by record: the seed states none of these pins.
    ('\nchosen = { chosen_by = "omniprobe", reason = "QwenImage21Pipeline arrived', '\n#',
     "[[diffusers_env.install]] item 3 (diffusers) key 'chosen'",
     'the seed states no pin of the Diffusers env: record who chose it and why'),
    ('name = "accelerate"\nversion = "1.15.0"\nchosen = { chosen_by = "omniprobe"',
     'name = "accelerate"\nversion = "1.15.0"\nchosen = { chosen_by = "the seed"',
     "[[diffusers_env.install]] item 4 key 'chosen.chosen_by'", "'omniprobe'"),
    ('name = "torchao"\nversion = "0.18.0"\nchosen = { chosen_by = "omniprobe", reason = "',
     'name = "torchao"\nversion = "0.18.0"\nchosen = { chosen_by = "omniprobe", reason = "", x = "',
     "[[diffusers_env.install]] item 5 key 'chosen.reason'", "at least 1 character"),
])
def test_load_hosts_refuses_a_diffusers_env_pin_without_its_choice(tmp_path, edit, replacement,
                                                                   where, words):
    text = REAL.hosts_file.read_text()
    assert text.count(edit) == 1
    bad = hosts_written(tmp_path, text.replace(edit, replacement))
    with pytest.raises(InputError) as info:
        load_hosts(bad)
    message = str(info.value)
    assert str(bad) in message and where in message and words in message, message


@pytest.mark.parametrize("which, folder, names", [
    ("probe", "rtx3090", ["torch", "transformers", "diffusers", "vllm", "vllm-omni"]),
    ("diffusers", "rtx3090-diffusers", [name for name, _ in DIFFUSERS_PINS]),
])
def test_each_env_has_its_own_steps_and_venv(tmp_path, monkeypatch, which, folder, names):
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(tmp_path))
    cfg = load_hosts(REAL.hosts_file)
    assert [s.name for s in install_steps(cfg, REAL.hosts_file, which)] == names
    assert env_paths(cfg, REAL, "rtx3090", which=which).venv == tmp_path / "envs" / folder
    other = "probe" if which == "diffusers" else "diffusers"
    assert pins_hash(cfg, REAL, which) != pins_hash(cfg, REAL, other)


def test_the_diffusers_env_dry_run_is_its_own_plan_and_shows_every_chosen_pin(tmp_path, monkeypatch,
                                                                         capsys):
    def refuse(*args, **kwargs):
        raise AssertionError(f"dry run ran {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(REPO_ROOT))
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli.main(["env", "build", "--host", "rtx3090", "--env", "diffusers", "--dry-run"]) == 0
    out = capsys.readouterr().out
    venv = tmp_path / "envs" / "rtx3090-diffusers"
    assert out.startswith("# omniprobe env build --host rtx3090 --env diffusers:")
    assert f"# venv: {venv}\n" in out
    assert f"{tmp_path / 'envs' / 'rtx3090'}/" not in out  # never the probe env's folder
    commands = [shlex.split(line, comments=True) for line in out.splitlines()
                if line and not line.startswith("#")]
    uv = uv_command()
    installs = [c for c in commands if c[:3] == [uv, "pip", "install"]]
    assert [c[-1] for c in installs] == [
        str(venv / "omniprobe-step-torch" / "pyproject.toml"),
        str(venv / "omniprobe-step-torchvision" / "pyproject.toml"),
        "transformers==5.17.0", "diffusers==0.42.1", "accelerate==1.15.0", "torchao==0.18.0"]
    assert all(c[4] == str(venv / "bin" / "python") for c in installs)
    assert len([c for c in commands if c[:3] == [uv, "pip", "compile"]]) == 1  # plan first
    cfg = load_hosts(REAL.hosts_file)
    for step in cfg.diffusers_env.install:
        assert (f"# pin: {step.name} {step.pin}, chosen by omniprobe: {step.chosen.reason}\n"
                in out), step.name
    # It runs no server: the pipeline is checked, not the serve preflight or the clone.
    assert ("#   diffusers.pipeline: the venv's diffusers holds Flux2KleinKVPipeline, "
            "Flux2KleinPipeline, QwenImage21Pipeline\n") in out
    assert "serve." not in out and "upstream contract" not in out and "vllm" not in out


@pytest.mark.parametrize("host, expected", [
    ("rtx3090", "probe"),                       # no offline_command: the probe env's venv
    ("sim", None),                              # omniprobe's own sim
    ("diffusers-tiny-cpu", None),               # the machine's own Python, as today
    ("rtx5080-on-h200-diffusers", None),
    ("rtx5080-diffusers", "diffusers"),          # a real host with the snapshot
])
def test_the_runner_python_comes_from_its_env(tmp_path, host, expected):
    project = make_project(tmp_path)
    (project.hosts_file).write_text(project.hosts_file.read_text() + SNAPSHOT_HOST)
    assert runner_env_name(load_hosts(project.hosts_file).host(host)) == expected


def test_probe_baseline_refuses_a_real_host_without_its_diffusers_env(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project")
    project.hosts_file.write_text(project.hosts_file.read_text() + SNAPSHOT_HOST)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(tmp_path / "envroot"))
    options = BaselineOptions(host="rtx5080-diffusers")
    with pytest.raises(EnvNotReady) as info:
        run_baseline(project, options, command=["omniprobe"], out=io.StringIO())
    message = str(info.value)
    assert f"the Diffusers environment of host 'rtx5080-diffusers' at {tmp_path}/envroot/envs/" \
           "rtx5080-diffusers-diffusers is not usable" in message
    assert "env.stamp failed" in message
    assert "run `omniprobe env build --host rtx5080-diffusers --env diffusers`" in message
    assert not project.evidence_dir.exists() or not any(project.evidence_dir.rglob("*.json"))
    # The command says so as an error, exit 4 (the machine cannot run it), no traceback.
    code = cli.main(["probe-baseline", "--host", "rtx5080-diffusers"])
    assert code == 4


def test_a_diffusers_env_manifest_never_stands_for_the_probe_envs(tmp_path):
    project = Project(tmp_path)
    hosts_written(tmp_path, REAL.hosts_file.read_text().replace(
        "[hosts.rtx3090]", "[hosts.testhost]\nkind = \"omni\"\nname = \"t\"\nhostname = \"box\"\n"
        "gpu = \"g\"\n"
        "compute_capability = \"8.6\"\nvram_gb = 24\npython_provider = \"p\"\n"
        "serve_flag_sets = []\n\n[hosts.rtx3090]"))
    cfg = load_hosts(project.hosts_file)
    at = datetime(2026, 12, 1, 10, tzinfo=UTC)
    folder, written = record_manifest(project, cfg, sample_manifest(env="diffusers"),
                                      command=["x"], started_at=at)
    assert written
    assert latest_manifest(project.evidence_dir, "testhost") is None
    assert latest_manifest(project.evidence_dir, "testhost", "diffusers")[0] == folder
    # The probe env's manifest of the same state is filed beside it, not taken for it.
    probe, written = record_manifest(project, cfg, sample_manifest(), command=["x"],
                                     started_at=at)
    assert written and probe != folder
