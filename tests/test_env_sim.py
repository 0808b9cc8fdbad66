"""env-<host> for the simulated host: nothing is installed, the interpreter and the simulated
fixtures are checked, and the selection reaches the probe sessions of the same nox run."""

from __future__ import annotations

import json

import pytest

from omniprobe.cli import main
from omniprobe.config.hosts import load_hosts
from omniprobe.config.selection import read_state, state_path
from omniprobe.env.build import build_env
from omniprobe.env.simulated import check_sim_env
from omniprobe.env.state import EnvError, Runner

from .conftest import in_process, probe_argv


@pytest.fixture
def invocation(monkeypatch) -> str:
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-7")
    return "nox-run-7"


def test_env_build_of_the_sim_installs_nothing_and_files_nothing(project, capsys):
    assert main(["env", "build", "--host", "sim"]) == 0
    out = capsys.readouterr().out
    # The interpreter, the serve command, its entry point, a parse of each of the 5 flag sets,
    # the references.
    assert "env sim (simulated: nothing to build)" in out and "9 pass, 0 fail, 1 skip" in out
    assert "PASS serve.entry_point: module omniprobe.sim imports" in out
    assert "PASS serve.args:cpuoff-layerwise: the serve command's parser accepts" in out
    assert "SKIP env.install: simulated host: nothing is installed" in out
    assert "PASS sim.interpreter" in out and "omniprobe/sim/__init__.py" in out
    assert "PASS fixtures.references: 8 files match" in out  # simulated and stand-in
    assert "manifest: not filed" in out
    assert not (project.evidence_dir / "sim").exists()


def test_the_pinned_env_machinery_refuses_a_simulated_host(project):
    with pytest.raises(EnvError, match="host 'sim' is simulated: it has no pinned env"):
        build_env("sim", project=project)


def test_dry_run_of_the_sim_says_there_is_nothing_to_build(project, capsys):
    assert main(["env", "build", "--host", "sim", "--dry-run"]) == 0
    assert "a simulated host; nothing to build" in capsys.readouterr().out


def test_an_interpreter_without_the_sim_fails_its_check(project, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'omniprobe'\" >&2\n"
                      "exit 1\n")
    python.chmod(0o755)
    env = check_sim_env(load_hosts(project.hosts_file), project, "sim", python=str(python),
                        runner=Runner())
    assert not env.ok
    assert env.problems == [f"sim.interpreter failed: {python} cannot import omniprobe.sim: "
                            "ModuleNotFoundError: No module named 'omniprobe' "
                            "(expected imports omniprobe.sim, got nothing)"]


def test_select_hands_the_sim_to_the_probe_sessions(project, invocation, capsys):
    assert main(["env", "build", "--host", "sim", "--select"]) == 0
    assert "selected host sim for the probe sessions of this nox run" in capsys.readouterr().out
    state = read_state(state_path(project, invocation), invocation)
    assert (state["host"], state["env_failure"], state["venv"]) == ("sim", None, None)
    assert main(["select-host", "--host", "rtx3090"]) == 0
    assert capsys.readouterr().out.strip() == "host sim (selected by an earlier env session)"


def test_select_without_a_nox_run_says_so(project, capsys):
    assert main(["env", "build", "--host", "sim", "--select"]) == 0
    assert "not in a nox run (OMNIPROBE_INVOCATION unset)" in capsys.readouterr().out
    assert not (project.artifacts_dir / "selections").exists()


def test_a_failed_env_session_makes_the_probe_refuse_naming_the_check(project, invocation,
                                                                        port, capsys):
    suite = json.loads(project.fixtures_file.read_text())
    reference = next(f for f in suite["fixtures"] if f["id"] == "sim-single")["references"][0]
    (project.fixtures_file.parent / reference["file"]).write_bytes(b"tampered")
    assert main(["env", "build", "--host", "sim", "--select"]) == 1
    printed = capsys.readouterr().out
    assert f"FAIL fixtures.references: {reference['file']}: sha256 differs" in printed
    assert "env-sim failed: no host selected" in printed
    code, out = in_process(project, probe_argv("probe-init", port))
    assert code == 4  # an environment failure
    assert (f"error: env-sim failed, so it selected no host and the probe sessions of this nox "
            f"run do not run: fixtures.references failed: {reference['file']}: sha256 differs"
            ) in out
    assert not (project.evidence_dir / "sim").exists()


def test_a_dry_run_env_session_selects_nothing(project, invocation, capsys):
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.selection import SelectedEnvFailed, resolve_host

    assert main(["env", "build", "--host", "sim", "--select", "--dry-run"]) == 0
    assert "dry run: nothing was run" in capsys.readouterr().out
    assert read_state(state_path(project, invocation), invocation)["host"] is None
    with pytest.raises(SelectedEnvFailed, match="env-sim failed, .*: it was a dry run"):
        resolve_host(project, load_hosts(project.hosts_file), "sim")
