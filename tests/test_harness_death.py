"""The harness interrupted or killed mid-run: no orphaned server, and a re-run resumes."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from omniprobe.evidence.load import load_attempt

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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_sigkill_of_the_harness_leaves_no_orphan_within_10_s(tmp_path, port, harness):
    project = make_project(tmp_path, faults=["hang@1"])
    run = harness(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-single")
    assert wait_for(lambda: _serving(project), 20)
    assert processes_with(f"--port {port}")
    run.kill()
    run.wait()
    assert wait_for(lambda: processes_with(f"--port {port}") == [], 10), processes_with(
        f"--port {port}")


@pytest.mark.e2e
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
    assert (f"1 flag set(s) x 2 fixture(s) x 4 seed(s): {len(before)} already recorded, "
            f"{8 - len(before)} to run") in out
    [run] = load_attempt(_attempt_folder(project))[0].runs
    assert [lt.ended for lt in run.lifetimes] == [None, "stopped"]  # the killed one never ended
    log = (project.artifacts_dir / run.lifetimes[1].log.path).read_text()
    assert log.count("POST /v1/images/edits") == 8 - len(before)


def kill_together(*pids: int) -> None:
    """SIGKILL at once: every process stopped first, so none sees another's death before its
    own (the keeper would see its lifeline end and stop the group itself)."""
    import os

    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e
def test_killing_the_probe_and_its_supervisor_together_leaves_no_orphan(tmp_path, port, harness):
    """A double SIGKILL takes the lifeline and its keeper at once: the server dies with its
    supervisor (PR_SET_PDEATHSIG), and a resume then starts its own server on the same port."""

    project = make_project(tmp_path, faults=["hang@1"])
    run = harness(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-single")
    assert wait_for(lambda: _serving(project), 20)
    keepers = [pid for pid, cmd in processes_with(f"--port {port}") if "harness.common.supervise" in cmd]
    assert len(keepers) == 1
    kill_together(keepers[0], run.pid)
    run.wait()
    assert wait_for(lambda: processes_with(f"--port {port}") == [], 10), processes_with(
        f"--port {port}")
    [run_record] = load_attempt(_attempt_folder(project))[0].runs
    lifetime = run_record.lifetimes[0]
    assert lifetime.ended is None and lifetime.server_group == keepers[0]
    assert lifetime.server_started is not None


def _group_of_one(children):
    import sys

    return children.start([sys.executable, "-c", "import time; time.sleep(60)"])


def _lifetime_of(group: int | None, started: str | None, ended: str | None = None):
    from datetime import UTC, datetime

    from omniprobe.evidence.models.runs import InitResult, ServerLifetime, ServeRun

    lifetime = ServerLifetime(session="probe-serve", started_at=datetime.now(UTC),
                              command=["vllm"], init=InitResult(outcome="ready"), ended=ended,
                              server_group=group, server_started=started)
    return ServeRun(flag_set="cpuoff", init=lifetime.init, lifetimes=[lifetime])


def test_a_resume_stops_a_server_its_killed_probe_left(children):
    """Known by its recorded process group and start time: stopped, and the user is told."""
    from omniprobe.harness.common.leftover import started, stop_leftovers
    from omniprobe.harness.common.processes import alive

    proc = _group_of_one(children)
    group = proc.pid
    said = stop_leftovers([_lifetime_of(group, started(group))], grace_s=5)
    assert said == [f"[cpuoff] stopped the server of lifetime 0 (process group {group}), left "
                    "running by a probe that was killed"]
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not alive(group, group=True)


@pytest.mark.parametrize("mismatch", ["later-start", "other-boot", "it-ended", "none-recorded"])
def test_a_resume_leaves_alone_what_is_not_its_own(children, mismatch):
    """A reused pid (a later start time), another boot, a lifetime that ended, or one that
    recorded no group: nothing is stopped."""
    from omniprobe.harness.common.leftover import started, stop_leftovers
    from omniprobe.harness.common.processes import alive

    group = _group_of_one(children).pid
    boot, _, ticks = started(group).partition("/")
    run = {"later-start": _lifetime_of(group, f"{boot}/{int(ticks) + 10**6}"),
           "other-boot": _lifetime_of(group, f"00000000-0000-0000-0000-000000000000/{ticks}"),
           "it-ended": _lifetime_of(group, started(group), ended="stopped"),
           "none-recorded": _lifetime_of(None, None)}[mismatch]
    assert stop_leftovers([run], grace_s=1) == []
    assert alive(group, group=True)


# --- an interrupt at a chosen moment is never lost (issue 24) --------------------------------


def _signal_self(sig=signal.SIGINT) -> None:
    import os

    os.kill(os.getpid(), sig)


def _during_server_start(monkeypatch):
    from omniprobe.harness.common.process import SupervisedProcess

    real = SupervisedProcess.start

    def start(self):
        real(self)
        _signal_self(signal.SIGTERM)
    monkeypatch.setattr(SupervisedProcess, "start", start)


def _while_a_request_is_in_flight(monkeypatch):
    """The hang fault holds the request; the signal comes while the client waits for it."""
    import threading

    from omniprobe.harness.serve import client

    real = client.send

    def send(*args, **kwargs):
        threading.Timer(0.3, _signal_self).start()
        return real(*args, **kwargs)
    monkeypatch.setattr(client, "send", send)


def _while_a_record_is_written(monkeypatch):
    from omniprobe.evidence.attempts import AttemptStore

    real = AttemptStore.add_request

    def add_request(self, record):
        _signal_self()
        return real(self, record)
    monkeypatch.setattr(AttemptStore, "add_request", add_request)


def _while_a_pool_is_torn_down(monkeypatch):
    from urllib3.poolmanager import PoolManager

    real = PoolManager.clear

    def clear(self):
        _signal_self(signal.SIGHUP)
        return real(self)
    monkeypatch.setattr(PoolManager, "clear", clear)


@pytest.mark.parametrize("moment, faults", [
    (_during_server_start, []),
    (_while_a_request_is_in_flight, ["hang@1"]),
    (_while_a_record_is_written, []),
    (_while_a_pool_is_torn_down, []),
], ids=["server-start", "request-in-flight", "record-written", "pool-torn-down"])
def test_an_interrupt_at_a_chosen_moment_ends_the_run_with_130(tmp_path, port, monkeypatch,
                                                               moment, faults):
    import time

    from .conftest import in_process, probe_argv

    project = make_project(tmp_path, faults=faults)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    moment(monkeypatch)
    started = time.monotonic()
    code, out = in_process(project, probe_argv("probe-serve", port, "--flag-set", "cpuoff",
                                               "--fixture", "sim-t2i", "--request-timeout", "60"))
    assert code == 130, out
    assert "interrupted: the server was stopped" in out
    assert time.monotonic() - started < 30  # never the request timeout
    assert wait_for(lambda: processes_with(f"--port {port}") == [], 10)
    folder = _attempt_folder(project)  # an attempt that recorded nothing is removed
    for run in load_attempt(folder)[0].runs if folder else []:
        assert run.lifetimes[-1].ended == "stopped"
    if moment is _while_a_record_is_written:
        assert len(_recorded(project)) == 1  # the record being written when it came is kept


WORKER_KEEPING_SERVER = '''import http.server, subprocess, sys
args = sys.argv[1:]
if "--check-args" in args:
    sys.exit(0)
port = int(args[args.index("--port") + 1])
# A worker in the server's process group that outlives it, as a model server's workers may.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[0]])

class Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):  # never answers: the probe is killed while it waits
        import time
        time.sleep(120)

    def log_message(self, *_):
        pass

http.server.HTTPServer(("127.0.0.1", port), Server).serve_forever()
'''


@pytest.mark.e2e
def test_a_resume_stops_the_worker_a_double_kill_left_and_says_so(tmp_path, port, harness):
    """Probe and supervisor SIGKILLed together: the server dies with its keeper, but a worker of
    its group lives on. The resume knows it by the group and start time its lifetime recorded,
    stops it, says so, and then runs."""

    project = make_project(tmp_path)
    server = tmp_path / "worker_keeping_server.py"
    server.write_text(WORKER_KEEPING_SERVER)
    text = project.hosts_file.read_text()
    old = ('serve_command = ["{python}", "-m", "omniprobe.sim", "serve", "{model}", "--omni", '
           '"--hosts-file", "{hosts_file}", "--sim-host", "{host}"]\noffline_command')
    project.hosts_file.write_text(text.replace(
        old, f'serve_command = ["{{python}}", "{server}"]\noffline_command', 1))
    run = harness(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-t2i")
    assert wait_for(lambda: _serving(project), 60)
    assert wait_for(lambda: len(processes_with(str(server))) >= 3, 60)  # keeper, server, worker
    keeper = next(pid for pid, cmd in processes_with(str(server)) if "harness.common.supervise" in cmd)
    kill_together(keeper, run.pid)
    run.wait()
    assert wait_for(lambda: [cmd for _, cmd in processes_with(str(server))] == [
        f"{sys.executable} -c import time; time.sleep(600) {server}"], 30), processes_with(
        str(server))  # only the worker is left

    again = harness(project, "probe-init", port, "--flag-set", "cpuoff")
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out
    assert (f"[cpuoff] stopped the server of lifetime 0 (process group {keeper}), left running "
            "by a probe that was killed") in out
    assert wait_for(lambda: processes_with(str(server)) == [], 30), processes_with(str(server))
