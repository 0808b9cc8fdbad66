"""Host selection order, the invocation state between nox sessions, and the GPU check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omniprobe.config.hosts import UnknownHost, load_hosts
from omniprobe.config.selection import (
    INVOCATION_ENV,
    NoHost,
    SelectedEnvFailed,
    choose_host,
    read_state,
    record_selection,
    resolve_host,
    session_venv,
    state_path,
    update_state,
)

from .conftest import SRC


@pytest.fixture
def cfg(project):
    return load_hosts(project.hosts_file)


def test_env_session_beats_host_beats_hostname(cfg):
    assert choose_host(cfg, selected="sim", requested="rtx5080",
                       hostname="cachyos-alexander")[0] == "sim"
    assert choose_host(cfg, selected=None, requested="rtx5080",
                       hostname="cachyos-alexander")[0] == "rtx5080"
    assert choose_host(cfg, selected=None, requested=None,
                       hostname="cachyos-alexander.lan")[0] == "rtx3090"


def test_no_match_lists_the_hosts(cfg):
    with pytest.raises(NoHost) as info:
        choose_host(cfg, selected=None, requested=None, hostname="elsewhere")
    message = str(info.value)
    assert "--host NAME" in message and "elsewhere" in message
    assert "rtx3090 (cachyos-alexander)" in message and "sim (simulated)" in message


@pytest.mark.parametrize(("selected", "requested", "where"), [
    (None, "h100", "--host"), ("h100", None, "the env session")])
def test_an_unknown_name_is_one_error_naming_who_named_it(cfg, selected, requested, where):
    with pytest.raises(UnknownHost, match=f"^{where} names host 'h100'.*hosts: rtx3090"):
        choose_host(cfg, selected=selected, requested=requested, hostname="x")
    with pytest.raises(UnknownHost, match=f"^{where} names host 'h100'"):
        cfg.host("h100", where)


def test_simulated_host_never_matches_by_hostname(cfg):
    with pytest.raises(NoHost):
        choose_host(cfg, selected=None, requested=None, hostname="(simulated)")


def test_state_belongs_to_one_invocation(project, cfg):
    path = state_path(project, "run-1")
    update_state(path, "run-1", host="sim", problems=[])
    assert read_state(path, "run-1")["host"] == "sim"
    assert read_state(path, "run-2") == {} and read_state(path, None) == {}
    assert read_state(state_path(project, "run-2"), "run-2") == {}
    env = {INVOCATION_ENV: "run-1"}
    assert resolve_host(project, cfg, "rtx5080", env=env, hostname="x")[0] == "sim"
    assert resolve_host(project, cfg, "rtx5080", env={INVOCATION_ENV: "run-2"},
                        hostname="x")[0] == "rtx5080"
    assert record_selection(project, "rtx3090", ["GPU is 'X'"], env={INVOCATION_ENV: "run-3"})
    assert read_state(path, "run-1")["host"] == "sim"  # run-3's env session wrote its own file
    assert read_state(state_path(project, "run-3"), "run-3")["host"] is None  # it selected nothing
    for requested in (None, "rtx5080"):  # and no probe of its run falls back to another host
        with pytest.raises(SelectedEnvFailed, match="env-rtx3090 failed, .*: GPU is 'X'"):
            resolve_host(project, cfg, requested, env={INVOCATION_ENV: "run-3"}, hostname="x")
    assert record_selection(project, "sim", [], env={INVOCATION_ENV: "run-3"})
    assert resolve_host(project, cfg, None, env={INVOCATION_ENV: "run-3"}, hostname="x")[0] == "sim"


def test_a_failed_env_is_named_by_its_first_problem_and_how_many_more(project, cfg):
    env = {INVOCATION_ENV: "run-4"}
    problems = ["host.hostname failed: expected a, got b " + "x" * 300, "gpu.nvml failed: none",
                "gpu.name failed: expected c"]
    assert record_selection(project, "rtx3090", problems, env=env)
    with pytest.raises(SelectedEnvFailed) as failed:
        resolve_host(project, cfg, None, env=env, hostname="x")
    said = str(failed.value)
    assert problems[0] in said and "(and 2 more, each printed above)" in said
    assert problems[1] not in said and len(said) < len(problems[0]) + 200


def test_the_env_sessions_venv_reaches_the_probe_of_the_same_run_only(project):
    run_1, run_2 = {INVOCATION_ENV: "run-1"}, {INVOCATION_ENV: "run-2"}
    assert record_selection(project, "rtx5080", [], venv="/opt/envs/5080", env=run_1)
    assert session_venv(project, "rtx5080", env=run_1) == "/opt/envs/5080"
    assert session_venv(project, "rtx3090", env=run_1) is None
    assert session_venv(project, "rtx5080", env=run_2) is None
    assert not record_selection(project, "rtx5080", [], env={})


def test_select_host_command_hands_the_host_to_a_later_session(project):
    env = {**os.environ, "PYTHONPATH": str(SRC), INVOCATION_ENV: "nox-123"}
    done = subprocess.run([sys.executable, "-m", "omniprobe", "select-host", "sim"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "selected host sim" in done.stdout
    shown = subprocess.run([sys.executable, "-m", "omniprobe", "select-host", "--host", "rtx3090"],
                           env=env, capture_output=True, text=True, check=False)
    assert shown.stdout.strip() == "host sim (selected by an earlier env session)"


def test_select_host_errors_are_messages_not_tracebacks(project, capsys):
    from omniprobe.cli import main

    assert main(["select-host", "h100"]) == 3  # a refusal
    err = capsys.readouterr().err
    assert "error: select-host names host 'h100', which hosts.toml does not define" in err
    assert "Traceback" not in err
    assert main(["select-host"]) == 3
    assert "error: no host selected" in capsys.readouterr().err


def test_two_nox_runs_in_one_checkout_keep_their_own_selections(project, cfg):
    """Interleaved sessions of two runs: each run's probes see only its own env session."""
    first, second = {INVOCATION_ENV: "run-a"}, {INVOCATION_ENV: "run-b"}
    assert record_selection(project, "sim", [], env=first)
    assert record_selection(project, "rtx3090", ["GPU is 'X'"], env=second)
    update_state(state_path(project, "run-a"), "run-a", fresh_attempts={"sim": "attempt-a"})
    assert resolve_host(project, cfg, None, env=first, hostname="x")[0] == "sim"
    assert read_state(state_path(project, "run-a"), "run-a")["fresh_attempts"] == {
        "sim": "attempt-a"}
    with pytest.raises(SelectedEnvFailed, match="env-rtx3090 failed"):
        resolve_host(project, cfg, None, env=second, hostname="x")
    assert state_path(project, "run-a") != state_path(project, "run-b")
    assert state_path(project, "../../x").parent == project.artifacts_dir / "selections"
