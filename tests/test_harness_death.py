"""The harness interrupted or killed mid-run: no orphaned server, and a re-run resumes."""

from __future__ import annotations

import json
import signal

from omniprobe.evidence.models import load_attempt

from .conftest import make_project, processes_with, wait_for


def _attempt_folder(project):
    folders = list((project.evidence_dir / "sim").glob("*-probe"))
    return folders[0] if folders else None


def _recorded(project) -> list[dict]:
    folder = _attempt_folder(project)
    try:
        return json.loads((folder / "requests.json").read_text())["requests"]
    except (TypeError, FileNotFoundError, ValueError):
        return []


def _serving(project) -> bool:
    """The server is up and a request is in flight (the hang fault holds the first one)."""
    folder = _attempt_folder(project)
    return folder is not None and (folder / "runs.json").is_file()


def test_ctrl_c_stops_the_server_before_the_harness_exits(tmp_path, port, harness):
    project = make_project(tmp_path, faults=["hang@1"])
    run = harness(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-single")
    assert wait_for(lambda: _serving(project), 20)
    assert processes_with(f"--port {port}")
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=20)
    assert run.returncode == 130, out
    assert "interrupted: the server was stopped; re-run to resume" in out
    assert processes_with(f"--port {port}") == []
    [run_record] = load_attempt(_attempt_folder(project))[0].runs
    assert run_record.lifetimes[0].ended == "stopped"


def test_sigkill_of_the_harness_leaves_no_orphan_within_10_s(tmp_path, port, harness):
    project = make_project(tmp_path, faults=["hang@1"])
    run = harness(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-single")
    assert wait_for(lambda: _serving(project), 20)
    assert processes_with(f"--port {port}")
    run.kill()
    run.wait()
    assert wait_for(lambda: processes_with(f"--port {port}") == [], 10), processes_with(
        f"--port {port}")


def test_resume_after_a_crash_mid_matrix_runs_only_the_rest(tmp_path, port, harness):
    project = make_project(tmp_path, seeds=[2301, 2302, 2303, 2304])
    args = ("--flag-set", "cpuoff", "--fixture", "sim-single", "--fixture", "sim-pair")
    slow = {"OMNIPROBE_SIM_TIME_SCALE": "0.5"}  # about 0.3 s a request
    first = harness(project, "probe-serve", port, *args, env=slow)
    assert wait_for(lambda: len(_recorded(project)) >= 2, 30)
    first.kill()
    first.wait()
    before = _recorded(project)
    assert 2 <= len(before) < 8
    assert wait_for(lambda: processes_with(f"--port {port}") == [], 10)

    second = harness(project, "probe-serve", port, *args)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    after = _recorded(project)
    assert after[:len(before)] == before  # completed cells untouched
    assert sorted((r["fixture"], r["seed"]) for r in after) == sorted(
        (f, s) for f in ("sim-single", "sim-pair") for s in (2301, 2302, 2303, 2304))
    assert {r["lifetime"] for r in after[len(before):]} == {1}
    assert f"{8 - len(before)} request(s) in 1 run(s)" in out
    [run] = load_attempt(_attempt_folder(project))[0].runs
    assert [lt.ended for lt in run.lifetimes] == [None, "stopped"]  # the killed one never ended
    log = (project.artifacts_dir / run.lifetimes[1].log.path).read_text()
    assert log.count("POST /v1/images/edits") == 8 - len(before)
