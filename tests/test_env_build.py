"""A real environment built with uv: tiny pins from PyPI plus two local git repositories.

One build is shared by the module; tests that disturb it put it back. Tests that need a build of
their own use their own venv. Needs the PyPI index (marked `network`); no GPU, no other network.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omniprobe import cli
from omniprobe.env import checks as envcheck
from omniprobe.env import nvml_facts
from omniprobe.env.build import build_env, check_env, dry_run
from omniprobe.env.state import EnvBuildError, EnvNotReady, Runner, uv_command
from omniprobe.evidence.load import load_attempt, load_evidence
from omniprobe.evidence.models.attempt import ServedModel
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.process import free_port

from .conftest import in_process
from .env_scaffold import RTX5080, FakeNvml, World, git, make_world

# One worker runs the module in order: its tests share one build. Real uv builds from PyPI, end to
# end, are the e2e tier; the default run checks the plan, the stamp, the checks and the manifest
# without the network (test_env_unit.py, test_env_resolve.py).
pytestmark = [pytest.mark.network, pytest.mark.e2e, pytest.mark.xdist_group("env-build")]
HOST = "testhost"


def _quiet(line: str) -> None:
    pass


def _env_vars(world: World) -> dict[str, str]:
    # uv finds the interpreter running the tests even from inside a virtual environment.
    base = str(Path(sys._base_executable).parent)
    return {**world.env_vars, "PATH": f"{base}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("envworld"))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in _env_vars(world).items():
            mp.setenv(key, value)
        yield world


@pytest.fixture(scope="module")
def first(world):
    """The shared env, built once."""
    return build_env(HOST, project=world.project, nvml=FakeNvml(), echo=_quiet)


@pytest.fixture(autouse=True)
def _world_env(world, first, monkeypatch):
    for key, value in _env_vars(world).items():
        monkeypatch.setenv(key, value)


def _verify(world: World, nvml=None, **kwargs):
    return check_env(HOST, project=world.project, nvml=nvml or FakeNvml(), record=False,
                     **kwargs).verification


def _failed(verification) -> set[str]:
    return {c.name for c in verification.failed}


def _uv_pip(first, *args: str) -> None:
    python = first.paths.python
    subprocess.run([uv_command(), "pip", "install", "--quiet", "--python", str(python), *args],
                   check=True)


def test_first_build_installs_the_pins_and_passes_every_check(world, first):
    result = first
    assert result.action == "built"
    assert result.verification.ok, result.verification.failed
    checks = {c.name: c for c in result.verification.checks}
    assert checks["package.six"].actual == "1.16.0"
    assert checks["package.gitpkg-a"].actual == world.commits_a[0]
    assert checks["package.gitpkg-b"].actual == world.commits_b[0]
    major, minor = sys.version_info[:2]
    assert checks["python.version"].actual.startswith(f"{major}.{minor}.")
    assert checks["model.snapshot"].status == checks["model.snapshot_files"].status == "pass"
    assert checks["fixtures.references"].status == "pass"
    assert "six==1.16.0" in result.manifest.freeze and "idna==3.7" in result.manifest.freeze
    assert result.paths.venv.is_relative_to(world.env_root)
    clone_a = result.paths.git_cache / f"gitpkg-a-{world.commits_a[0][:10]}"
    clone_b = result.paths.git_cache / f"gitpkg-b-{world.commits_b[0][:9]}"
    installs = [r.argv for r in result.ran if r.argv[1:3] == ("pip", "install")]
    assert [argv[-1] for argv in installs] == [
        "six==1.16.0", "idna==3.7", f"gitpkg-a @ git+{clone_a.as_uri()}@{world.commits_a[0]}",
        str(clone_b)]
    assert installs[-1][-2] == "--editable"
    assert (result.paths.venv / "omniprobe-env.json").is_file()


def test_the_manifest_is_valid_measured_evidence(world, first):
    result = first
    assert result.attempt_written
    loaded, problems = load_project(world.project)
    assert problems == []
    (attempt,) = [a for a in loaded.evidence.attempts if a.environment is not None]
    assert attempt.path == result.attempt
    assert attempt.meta.provenance.kind == "measured"
    assert attempt.environment.action == "built"
    assert attempt.environment.timings.build_s > 0
    assert any(c.command[1:3] == ["pip", "install"] for c in attempt.environment.timings.commands)


def test_no_op_rerun_only_verifies(world, first):
    before = len(load_evidence(world.project.evidence_dir)[0].attempts)
    start = time.perf_counter()
    result = build_env(HOST, project=world.project, nvml=FakeNvml(), echo=_quiet)
    elapsed = time.perf_counter() - start
    assert result.action == "verified" and result.verification.ok
    assert elapsed < 5
    ran = [r.argv for r in result.ran]
    assert not [a for a in ran if "install" in a or "venv" in a or "clone" in a
                or "checkout" in a or "fetch" in a], ran
    assert not result.attempt_written and result.attempt == first.attempt
    assert len(load_evidence(world.project.evidence_dir)[0].attempts) == before


def test_dry_run_shows_the_commands_the_build_ran(world, first):
    text = dry_run(world.project, HOST).replace(
        f"<full commit of {world.commits_a[0][:10]}>", world.commits_a[0])
    for ran in first.ran:
        line = shlex.join(ran.argv)
        if " pip install " in line or " clone " in line or " checkout " in line:
            assert line in text, line


def test_wrong_version_is_detected(world, first):
    _uv_pip(first, "six==1.15.0")
    try:
        verification = _verify(world)
        assert _failed(verification) == {"package.six"}
        check = {c.name: c for c in verification.checks}["package.six"]
        assert (check.expected, check.actual) == ("1.16.0", "1.15.0")
    finally:
        _uv_pip(first, "six==1.16.0")
    assert _verify(world).ok


def test_wrong_commit_of_a_git_pin_is_detected(world, first):
    _uv_pip(first, f"gitpkg-a @ git+{world.repo_a.as_uri()}@{world.commits_a[1]}")
    try:
        verification = _verify(world)
        assert _failed(verification) == {"package.gitpkg-a"}
        assert {c.name: c for c in verification.checks}["package.gitpkg-a"].actual == (
            world.commits_a[1])
    finally:
        clone = first.paths.git_cache / f"gitpkg-a-{world.commits_a[0][:10]}"
        _uv_pip(first, f"gitpkg-a @ git+{clone.as_uri()}@{world.commits_a[0]}")
    assert _verify(world).ok


def test_wrong_commit_or_local_edits_of_the_editable_pin_are_detected(world, first):
    clone = first.paths.git_cache / f"gitpkg-b-{world.commits_b[0][:9]}"
    git("checkout", "-q", "--detach", world.commits_b[1], cwd=clone)
    try:
        assert _failed(_verify(world)) == {"package.gitpkg-b"}
    finally:
        git("checkout", "-q", "--detach", world.commits_b[0], cwd=clone)
    init = clone / "gitpkg_b" / "__init__.py"
    init.write_text("GENERATION = 99\n")
    try:
        verification = _verify(world)
        assert _failed(verification) == {"package.gitpkg-b"}
        assert "tracked files changed" in {c.name: c for c in verification.checks}[
            "package.gitpkg-b"].detail
    finally:
        git("checkout", "-q", "--", ".", cwd=clone)
    assert _verify(world).ok


def test_missing_snapshot_and_other_revision_in_the_built_env(world, tmp_path, monkeypatch):
    from .env_scaffold import MODEL_REPO, SNAPSHOT_FILES, make_hf_cache, revision_of

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    assert _failed(_verify(world)) == {"model.snapshot", "model.snapshot_files"}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "other"))
    make_hf_cache(tmp_path / "other", MODEL_REPO, revision_of("other"), SNAPSHOT_FILES)
    with pytest.raises(EnvNotReady, match="model.snapshot failed: testorg/tiny-model is cached at"):
        envcheck.require_env_ok(HOST, project=world.project, nvml=FakeNvml())


def test_tampered_snapshot_file_in_the_built_env(world, tmp_path, monkeypatch):
    from .env_scaffold import MODEL_REPO, SNAPSHOT_FILES, make_hf_cache

    snapshot = make_hf_cache(tmp_path / "hf", MODEL_REPO, world.revision, SNAPSHOT_FILES)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    assert _verify(world).ok
    (snapshot / "config.json").resolve().write_bytes(b'{"layers": 3}\n')
    assert _failed(_verify(world)) == {"model.snapshot_files"}


def test_wrong_gpu_through_nvml_is_refused(world):
    verification = _verify(world, nvml=FakeNvml(**RTX5080))
    assert _failed(verification) == {"gpu.name", "gpu.compute_capability", "gpu.memory"}
    with pytest.raises(EnvNotReady) as info:
        envcheck.require_env_ok(HOST, project=world.project, nvml=FakeNvml(**RTX5080))
    message = str(info.value)
    assert "gpu.name failed" in message
    assert "expected NVIDIA GeForce RTX 3090, got NVIDIA GeForce RTX 5080" in message
    with pytest.raises(EnvNotReady, match="gpu.nvml failed: NVML cannot read a GPU"):
        envcheck.require_env_ok(HOST, project=world.project,
                                nvml=FakeNvml(error=RuntimeError("NVML Shared Library Not Found")))


def test_require_env_ok_passes_a_good_env(world):
    verification = envcheck.require_env_ok(HOST, project=world.project, nvml=FakeNvml())
    assert verification.paths.python.exists()


class InterruptingRunner(Runner):
    """Stands in for Ctrl-C while the git pin installs."""

    def run(self, argv, **kwargs):
        if "install" in argv and any("gitpkg-a" in a for a in argv):
            raise KeyboardInterrupt
        return super().run(argv, **kwargs)


def test_interrupted_build_is_marked_incomplete_and_repaired(world, tmp_path):
    venv = tmp_path / "venv"
    with pytest.raises(KeyboardInterrupt):
        build_env(HOST, project=world.project, venv=venv, runner=InterruptingRunner(),
                  nvml=FakeNvml(), echo=_quiet)
    with pytest.raises(EnvNotReady, match="env.stamp failed: incomplete: the build started"):
        envcheck.require_env_ok(HOST, project=world.project, venv=venv, nvml=FakeNvml())
    checked = check_env(HOST, project=world.project, venv=venv, nvml=FakeNvml())
    assert not checked.verification.complete
    assert checked.attempt is None  # no manifest is filed for an incomplete env
    repaired = build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(), echo=_quiet,
                         record=False)
    assert repaired.action == "built" and repaired.verification.ok
    envcheck.require_env_ok(HOST, project=world.project, venv=venv, nvml=FakeNvml())


def test_a_plan_that_does_not_resolve_installs_nothing(world, tmp_path):
    venv = tmp_path / "venv"
    world.write_hosts(idna="0.0.0")  # no such release: uv fails to resolve it
    try:
        with pytest.raises(EnvBuildError, match="the install plan does not resolve, so nothing "
                                                "was installed") as info:
            build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(), echo=_quiet)
        assert "idna==0.0.0" in str(info.value)  # uv's own words
        assert not venv.exists()
    finally:
        world.write_hosts()


class FailingInstall(Runner):
    """A Runner whose `uv pip install` of one requirement fails, as a broken download would."""

    def __init__(self, requirement: str):
        super().__init__()
        self.requirement = requirement

    def run(self, argv, **kwargs):
        if list(argv[1:3]) == ["pip", "install"] and self.requirement in argv:
            return subprocess.CompletedProcess(list(argv), 1, "", "simulated failure")
        return super().run(argv, **kwargs)


def test_failed_install_marks_incomplete_and_the_next_run_repairs(world, tmp_path):
    venv = tmp_path / "venv"
    with pytest.raises(EnvBuildError) as info:
        build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(), echo=_quiet,
                  runner=FailingInstall("idna==3.7"))
    message = str(info.value)
    assert "installing idna 3.7 failed" in message
    assert "marked incomplete" in message and f"--host {HOST}" in message
    with pytest.raises(EnvNotReady, match="env.stamp failed: incomplete"):
        envcheck.require_env_ok(HOST, project=world.project, venv=venv, nvml=FakeNvml())
    with pytest.raises(EnvNotReady, match="env.stamp failed: incomplete"):
        envcheck.require_env_ok(HOST, project=world.project, venv=venv, nvml=FakeNvml())
    repaired = build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(), echo=_quiet,
                         record=False)
    assert repaired.action == "built" and repaired.verification.ok


def test_a_pin_change_makes_the_stamp_stale_and_rebuilds(world, tmp_path):
    venv = tmp_path / "venv"
    build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(), echo=_quiet, record=False)
    world.write_hosts(idna="3.6")
    try:
        with pytest.raises(EnvNotReady) as info:
            envcheck.require_env_ok(HOST, project=world.project, venv=venv, nvml=FakeNvml())
        assert "env.stamp failed: stale" in str(info.value)
        assert "package.idna failed" in str(info.value)
        rebuilt = build_env(HOST, project=world.project, venv=venv, nvml=FakeNvml(),
                            echo=_quiet, record=False)
        assert rebuilt.action == "built" and rebuilt.verification.ok
        assert "idna==3.6" in rebuilt.manifest.freeze
    finally:
        world.write_hosts()


def test_python_uv_cannot_provide_fails_before_touching_the_venv(world, tmp_path):
    world.write_hosts(python="3.99")
    try:
        with pytest.raises(EnvBuildError, match="Python 3.99 is not on this machine and uv could "
                                                "not install it"):
            build_env(HOST, project=world.project, nvml=FakeNvml(), echo=_quiet)
    finally:
        world.write_hosts()
    assert _verify(world).ok  # the shared env is untouched


def test_cli_check_and_simulated_host(world, first, monkeypatch, capsys):
    monkeypatch.setattr(nvml_facts, "load_nvml", FakeNvml)
    assert cli.main(["env", "check", "--host", HOST]) == 0
    out = capsys.readouterr().out
    assert "PASS gpu.name" in out and "0 fail" in out and "(unchanged since that attempt)" in out
    # A simulated host's env is omniprobe itself: checked, never built from [env], not filed.
    assert cli.main(["env", "check", "--host", "simhost"]) == 0
    out = capsys.readouterr().out
    assert "SKIP env.install: simulated host" in out and "manifest: not filed" in out
    assert not (world.project.evidence_dir / "simhost").exists()
    monkeypatch.setattr(nvml_facts, "load_nvml", lambda: FakeNvml(**RTX5080))
    assert cli.main(["env", "check", "--host", HOST]) == 1
    assert "FAIL gpu.name" in capsys.readouterr().out


# --- the probe runs from the env an env session built ----------------------------------------


@pytest.fixture
def stub_vllm(world, first):
    """A `vllm` in the built env's bin that is the sim (with CPU offload, so that it fits), and
    a file it notes how it was started in; removed afterwards, leaving the env as built."""
    script, marker = first.paths.bin_dir / "vllm", world.root / "vllm-started-as"
    built = script.read_bytes()  # the env's own `vllm`, put back afterwards
    script.write_text(
        "#!/bin/sh\n"
        # The env's serve preflight reads its help; only a start is noted.
        f'case " $* " in *" --help=all "*) ;; *) echo "$0 offline=$HF_HUB_OFFLINE" > "{marker}";; esac\n'
        f'exec "{sys.executable}" -m omniprobe.sim "$@" --hosts-file '
        f'"{world.project.hosts_file}" --sim-host simhost --enable-cpu-offload\n')
    script.chmod(0o755)
    yield script, marker
    script.write_bytes(built)
    marker.unlink(missing_ok=True)


def _probe_init(world: World, nvml) -> tuple[int, str]:
    return in_process(world.project, ["probe-init", "--port", str(free_port()), "--grace", "2"],
                      nvml=nvml)


def test_env_session_then_probe_runs_the_server_from_the_env(world, first, stub_vllm,
                                                              monkeypatch, capsys, tmp_path):
    from .env_scaffold import MODEL_REPO, SNAPSHOT_FILES, make_hf_cache, revision_of

    script, marker = stub_vllm
    # Two revisions cached, `main` at the other one: the repo id would serve that one.
    cache = tmp_path / "hub"
    shutil.copytree(world.hf_cache, cache, symlinks=True)
    make_hf_cache(cache, MODEL_REPO, revision_of("other"), SNAPSHOT_FILES)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    pinned = cache / f"models--{MODEL_REPO.replace('/', '--')}" / "snapshots" / world.revision
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-env")
    monkeypatch.setattr(nvml_facts, "load_nvml", FakeNvml)
    assert cli.main(["env", "build", "--host", HOST, "--select"]) == 0
    env_out = capsys.readouterr().out
    assert f"selected host {HOST}" in env_out
    # The env holds its clone of upstream (the synthetic tree) against the contract: the tiny
    # model has neither a registered pipeline nor model code there.
    failed = ["pipeline:testorg/tiny-model", "model-code:testorg/tiny-model"]
    assert "upstream contract of its clone: " in env_out
    assert all(f"upstream contract check {name} FAILS" in env_out for name in failed)
    code, out = _probe_init(world, FakeNvml())
    assert code == 0, out
    assert f"host {HOST} (selected by an earlier env session)" in out
    warnings = [line for line in out.splitlines() if line.startswith("warning: upstream contract")]
    assert [w.split()[4] for w in warnings] == failed  # each named, before the server starts
    assert out.index(warnings[-1]) < out.index("probe-init")
    manifest = next(a.environment for a in load_evidence(world.project.evidence_dir)[0].attempts
                    if a.environment is not None and a.environment.upstream is not None)
    assert sorted(c.name for c in manifest.upstream.checks if c.status == "fail") == sorted(failed)
    assert manifest.upstream.source.kind == "git"
    assert f"env {first.paths.venv}: every check passed" in out
    folder = next((world.project.evidence_dir / HOST).glob("*-probe"))
    attempt, problems = load_attempt(folder)
    assert problems == []
    [run] = attempt.runs
    assert run.init.outcome == "ready"
    assert run.lifetimes[0].command[0] == str(script)
    assert marker.read_text().split() == [str(script), "offline=1"]
    # The server was given the pinned snapshot's folder, and the attempt says so, with the
    # manifest the env session filed.
    assert str(pinned) in run.lifetimes[0].command
    assert not any(revision_of("other") in part for part in run.lifetimes[0].command)
    env = attempt.meta.environment
    assert env.served == ServedModel(model=str(pinned), source="pinned", revision=world.revision)
    manifests = sorted((world.project.evidence_dir / HOST).glob("*-env"))
    assert env.manifest == manifests[-1].name
    # A model given by hand is recorded as such, in a new attempt (it serves another model).
    code, out = in_process(world.project, ["probe-init", "--port", str(free_port()), "--grace",
                                           "2", "--model", MODEL_REPO], nvml=FakeNvml())
    assert code == 0 and f"(new: {folder.name} served another model" in out
    newest = sorted((world.project.evidence_dir / HOST).glob("*-probe"))[-1]
    by_hand = load_attempt(newest)[0]
    assert by_hand.meta.environment.served == ServedModel(model=MODEL_REPO, source="by_hand")
    assert by_hand.runs[0].lifetimes[0].command[2] == MODEL_REPO


def test_env_session_with_a_failed_check_makes_the_probe_refuse(world, first, stub_vllm,
                                                                monkeypatch, capsys):
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-wrong-gpu")
    monkeypatch.setattr(nvml_facts, "load_nvml", lambda: FakeNvml(**RTX5080))
    before = sorted((world.project.evidence_dir / HOST).glob("*-probe"))
    assert cli.main(["env", "build", "--host", HOST, "--select"]) == 1
    capsys.readouterr()
    code, out = _probe_init(world, FakeNvml(**RTX5080))
    assert code == 4  # an environment failure
    assert (f"error: env-{HOST} failed, so it selected no host and the probe sessions of this nox "
            "run do not run: gpu.name failed: NVML's device name against "
            "hosts.toml gpu (expected NVIDIA GeForce RTX 3090, got NVIDIA GeForce RTX 5080)") in out
    assert sorted((world.project.evidence_dir / HOST).glob("*-probe")) == before
    assert not stub_vllm[1].exists()


@pytest.fixture
def no_vllm(first):
    """The built env without its `vllm`, put back afterwards."""
    script = first.paths.bin_dir / "vllm"
    away = script.with_name("vllm.away")
    script.rename(away)
    yield
    away.rename(script)


def test_an_env_without_the_serve_program_is_refused_before_any_evidence(world, first, no_vllm,
                                                                         monkeypatch):
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-no-vllm")
    before = sorted((world.project.evidence_dir / HOST).glob("*-probe"))
    code, out = _probe_init(world, FakeNvml())
    assert code == 4
    assert (f"serve.command failed: command not found: the serve command's program 'vllm' is "
            f"not in the probe env: {first.paths.bin_dir}/vllm is missing") in out
    assert sorted((world.project.evidence_dir / HOST).glob("*-probe")) == before
