"""probe-init and probe-serve end to end against the simulated server, in process."""

from __future__ import annotations

import hashlib
import json

import pytest

from omniprobe.analysis.summaries import cells_from_requests
from omniprobe.analysis.verdicts import host_verdict
from omniprobe.classify.imaging import load_pixels, pixels_sha256
from omniprobe.config.hosts import load_hosts
from omniprobe.env.state import Stamp, env_paths, pins_hash, write_stamp
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common import probe_env
from omniprobe.harness.common.sampler import NvmlUnavailable

from .conftest import in_process, make_project, probe_argv, processes_with
from .env_scaffold import RTX5080, FakeNvml


def probe(project, session, port, *extra, readers=None, nvml=None):
    return in_process(project, probe_argv(session, port, *extra), readers=readers, nvml=nvml)


def attempts(project, host="sim"):
    folders = sorted((project.evidence_dir / host).iterdir())
    return [load_attempt(f)[0] for f in folders]


def requests_of(project):
    [attempt] = attempts(project)
    return attempt.requests


SIM_FIXTURES = ("sim-t2i", "sim-single", "sim-pair", "sim-three", "sim-four")


@pytest.mark.e2e
def test_the_sim_matrix_follows_its_capacity_model_and_validates(project, port):
    code, out = probe(project, "probe-init", port)
    assert code == 0, out
    # The simulated fixtures run only when named (by default the stand-ins run: test_standins).
    code, out = probe(project, "probe-serve", port,
                      *(arg for f in SIM_FIXTURES for arg in ("--fixture", f)))
    assert code == 0, out
    [attempt] = attempts(project)
    assert attempt.meta.provenance.kind == "simulated" and attempt.simulated
    runs = {r.flag_set: r for r in attempt.runs}
    assert {f: r.init.outcome for f, r in runs.items()} == {
        "default": "oom", "cpuoff": "ready", "cpuoff-layerwise": "ready", "fp8": "ready",
        "sim-cpuoff-kvfp8v": "ready"}
    assert runs["default"].init.oom.requested == "96.00 MiB"
    assert [lt.session for lt in runs["cpuoff"].lifetimes] == ["probe-init", "probe-serve"]
    assert [lt.session for lt in runs["default"].lifetimes] == ["probe-init"]
    cells = {f: {c.fixture: c.outcome for c in cs}
             for f, cs in cells_from_requests(attempt.requests).items()}
    assert cells == {
        "cpuoff": {"sim-t2i": "ok", "sim-single": "ok", "sim-pair": "ok", "sim-three": "ok",
                   "sim-four": "oom"},
        "cpuoff-layerwise": {"sim-t2i": "ok", "sim-single": "oom", "sim-pair": "oom",
                             "sim-three": "oom", "sim-four": "oom"},
        "fp8": {"sim-t2i": "ok", "sim-single": "ok", "sim-pair": "ok", "sim-three": "ok",
                "sim-four": "ok"},
        # fp8_v takes a quarter of the KV part off each reference: too little for four.
        "sim-cpuoff-kvfp8v": {"sim-t2i": "ok", "sim-single": "ok", "sim-pair": "ok",
                              "sim-three": "ok", "sim-four": "oom"}}
    four = next(r for r in attempt.requests if r.flag_set == "cpuoff" and r.fixture == "sim-four")
    assert four.oom.location.function == "image_mlp" and four.oom.requested == "1.50 GiB"
    loaded, problems = load_project(project)
    assert problems == []
    assert "| elapsed" in out and "ETA" in out and "[fp8 3/4] sim-four seed 2301: ok" in out
    assert attempt.meta.environment.served.source == "simulated"
    # Every cell recorded in this environment: a re-run says so, runs nothing and says how to
    # measure again.
    code, out = probe(project, "probe-serve", port,
                      *(arg for f in SIM_FIXTURES for arg in ("--fixture", f)))
    assert code == 0 and f"complete: {attempt.id} holds every cell asked for" in out
    assert "0 to run; nothing to run; to measure again: nox -s env-sim probe-serve -- --fresh" in out
    assert len(attempts(project)) == 1

    # The gate: every image is measured; fp8's collapsed outputs are broken, bf16's sound.
    ok = [r for r in attempt.requests if r.outcome == "ok"]
    assert all(r.image is not None and r.structure == r.image.verdict for r in ok)
    assert {r.structure for r in ok if r.flag_set == "fp8"} == {"broken"}
    assert {r.structure for r in ok if r.flag_set != "fp8"} == {"sound"}
    assert all(r.structure == "unchecked" and r.image is None
               for r in attempt.requests if r.outcome != "ok")
    # sim.toml [capacity.sim]: cpuoff holds bf16 weights (14336 MiB) plus three
    # references but not four; layerwise staging leaves room for none; fp8 halves the weights
    # and fits four, but its outputs collapse. So three references are served, by cpuoff, and
    # fp8 is the capacity unlock that structure blocks.
    verdict = host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert (verdict.verdict, verdict.blocker) == ("not-built", "structure")
    assert verdict.highest_served_refs == 3
    assert verdict.served_by == ("cpuoff", "sim-cpuoff-kvfp8v")
    assert [(u.flag_set, u.attempt, u.structure) for u in verdict.capacity_unlocks] == [
        ("fp8", attempt.id, "broken")]
    assert verdict.initialised == ("cpuoff", "cpuoff-layerwise", "fp8", "sim-cpuoff-kvfp8v")
    assert verdict.failed_init == ("default",)


def test_a_probe_whose_cells_are_all_settled_exits_0_whatever_the_card_answered(project, port):
    """Issue 23: default OOMs at init (its cells are implied by it), cpuoff OOMs at four
    references, fp8's outputs are broken: all results, so probe-serve on its own exits 0."""
    code, out = probe(project, "probe-serve", port, "--flag-set", "default", "--flag-set", "fp8",
                      "--flag-set", "cpuoff", "--fixture", "sim-four")
    assert code == 0, out
    assert "[default 1/3] 1 request(s) not sent: the init oom on record settles them" in out
    assert "not done" not in out and "unsettled" not in out
    assert out.rstrip().splitlines()[-1].startswith("done: every init and cell this run asks "
                                                    "for is settled")
    [attempt] = attempts(project)
    assert {r.flag_set: r.init.outcome for r in attempt.runs} == {
        "default": "oom", "fp8": "ready", "cpuoff": "ready"}
    assert {(r.flag_set, r.outcome, r.structure) for r in attempt.requests} == {
        ("fp8", "ok", "broken"), ("cpuoff", "oom", "unchecked")}


def test_artifacts_are_referenced_by_path_and_sha256(project, port):
    assert probe(project, "probe-serve", port, "--flag-set", "cpuoff",
                 "--fixture", "sim-pair")[0] == 0
    [attempt] = attempts(project)
    [record] = attempt.requests
    image = (project.artifacts_dir / record.artifact).read_bytes()
    assert hashlib.sha256(image).hexdigest() == record.output_sha256
    # The quality command's definition, so its determinism groups agree with the probe's.
    assert pixels_sha256(load_pixels(project.artifacts_dir / record.artifact)) == (
        record.pixels_sha256)
    assert record.structure == "sound" and record.image.width == 64 and record.image.height == 48
    [lifetime] = attempt.runs[0].lifetimes
    for ref in (lifetime.log, lifetime.timeline.series):
        data = (project.artifacts_dir / ref.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == ref.sha256 and len(data) == ref.bytes
    assert lifetime.ended == "stopped" and lifetime.timeline.state == "sampled"
    assert record.lifetime == 0 and record.started_s >= lifetime.init.time_s - 0.01


def test_rerun_resumes_and_fresh_starts_anew(project, port):
    args = ("--flag-set", "fp8", "--fixture", "sim-single")
    assert probe(project, "probe-serve", port, *args)[0] == 0
    code, out = probe(project, "probe-serve", port, *args)
    [attempt] = attempts(project)
    assert code == 0 and f"complete: {attempt.id} holds every cell asked for" in out
    assert "1 flag set(s) x 1 fixture(s) x 1 seed(s): 1 already recorded, 0 to run" in out
    assert len(attempt.requests) == 1 and len(attempt.runs[0].lifetimes) == 1
    # Asked for more, the same attempt continues.
    code, out = probe(project, "probe-serve", port, *args, "--fixture", "sim-t2i")
    assert code == 0 and f"resumed: {attempt.id} is incomplete, made in this environment" in out
    assert "1 flag set(s) x 2 fixture(s) x 1 seed(s): 1 already recorded, 1 to run" in out
    assert [len(a.requests) for a in attempts(project)] == [2]
    # The attempt records the command that added to it, and what it added (issue 34); the
    # re-run that added nothing is not among them.
    [later] = attempts(project)[0].meta.later_runs
    assert later.added["requests.json"] == 1 and "sim-t2i" in later.command
    assert later.environment_digest == attempts(project)[0].meta.environment.digest
    assert later.started_at >= attempts(project)[0].meta.provenance.started_at
    code, out = probe(project, "probe-serve", port, *args, "--fresh")
    assert code == 0 and "(new: --fresh)" in out
    # The pace of the host's earlier attempt gives the estimate.
    assert "to run; about " in out and "at the pace of this host's 1 earlier attempt(s)" in out
    assert [len(a.requests) for a in attempts(project)] == [2, 1]


def test_an_attempt_of_another_environment_is_not_resumed(project, port):
    from omniprobe.evidence.files import write_section

    args = ("--flag-set", "fp8", "--fixture", "sim-single")
    assert probe(project, "probe-serve", port, *args)[0] == 0
    [attempt] = attempts(project)
    moved = attempt.meta.environment.model_copy(update={"digest": "0" * 64})
    write_section(attempt.path, "attempt.json", attempt.meta.model_copy(
        update={"environment": moved}))
    code, out = probe(project, "probe-serve", port, *args)
    assert code == 0 and (f"(new: {attempt.id} ran in another environment (env digest "
                          "000000000000, this one ") in out
    assert [len(a.requests) for a in attempts(project)] == [1, 1]


def test_fresh_is_shared_by_the_sessions_of_one_invocation(project, port, monkeypatch):
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-1")
    assert probe(project, "probe-init", port, "--fresh", "--flag-set", "fp8")[0] == 0
    assert probe(project, "probe-serve", port, "--fresh", "--flag-set", "fp8",
                 "--fixture", "sim-t2i")[0] == 0
    [attempt] = attempts(project)
    assert [lt.session for lt in attempt.runs[0].lifetimes] == ["probe-init", "probe-serve"]


@pytest.mark.e2e
def test_server_crash_mid_request_is_recorded_and_the_rest_runs(tmp_path, port, monkeypatch):
    project = make_project(tmp_path, faults=["crash@2"], seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = probe(project, "probe-serve", port, "--flag-set", "cpuoff",
                      "--fixture", "sim-single")
    assert code == 0, out
    records = requests_of(project)
    assert [(r.seed, r.outcome, r.lifetime) for r in records] == [
        (2301, "ok", 0), (2302, "error", 0), (2303, "ok", 1)]
    assert "the server is down (exited 1)" in records[1].error
    assert "illegal memory access" in records[1].error
    # The connection died with the server, whose log holds no traceback: not the environment's.
    assert records[1].cause is None and records[0].cause is None
    [run] = attempts(project)[0].runs
    assert [lt.ended for lt in run.lifetimes] == ["exited 1", "stopped"]
    assert not processes_with(str(tmp_path))


@pytest.mark.e2e
def test_request_timeout_restarts_the_server(tmp_path, port, monkeypatch):
    project = make_project(tmp_path, faults=["hang@2"], seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i",
                      "--request-timeout", "1")
    # A timeout is no answer of the card's (issue 34 item 4): not settled, so exit 1.
    assert code == 1 and "fp8: 1 of 3 cell(s) not measured" in out, out
    records = requests_of(project)
    assert [(r.outcome, r.lifetime) for r in records] == [("ok", 0), ("timeout", 0), ("ok", 1)]
    assert records[1].error == "no answer within 1 s" and 1 <= records[1].wall_s < 3
    assert not processes_with(str(tmp_path))
    # The resume sends it again (a new server: its first request does not hang); the later
    # record supersedes the timeout, and validate takes the pair.
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i")
    assert code == 0, out
    assert [(r.outcome, r.seed) for r in requests_of(project)] == [
        ("ok", 2301), ("timeout", 2302), ("ok", 2303), ("ok", 2302)]
    from omniprobe.analysis.summaries import current_requests
    from omniprobe.evidence.validate import load_project as validated

    assert [r.outcome for r in current_requests(requests_of(project))] == ["ok"] * 3
    assert validated(project)[1] == []


@pytest.mark.e2e
def test_an_init_that_timed_out_is_started_again_unless_timeouts_are_accepted(project, port):
    code, out = probe(project, "probe-init", port, "--flag-set", "fp8", "--ready-timeout",
                      "0.001")
    assert code == 1, out
    assert "fp8: init timeout timed out (not ready after 0.001 s): not the card's answer" in out
    code, out = probe(project, "probe-init", port, "--flag-set", "fp8", "--ready-timeout",
                      "0.001", "--accept-timeouts")
    assert code == 0 and "done: every init and cell" in out, out
    code, out = probe(project, "probe-init", port, "--flag-set", "fp8")
    assert code == 0, out
    [attempt] = attempts(project)
    assert attempt.runs[0].init.outcome == "ready"  # started again, and measured
    assert [lt.init.outcome for lt in attempt.runs[0].lifetimes][-1] == "ready"


def test_a_server_that_logged_an_oom_then_hung_is_the_cards_oom():
    from omniprobe.harness.common.process import classify_hang

    log = ("INFO loading\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 490.00 "
           "MiB. GPU 0 has a total capacity of 23.56 GiB of which 118.44 MiB is free.\n")
    hung = classify_hang(log, 1200.4, 1200)
    assert hung.outcome == "oom" and hung.oom.requested == "490.00 MiB"
    assert "then it hung until the 1200 s ready timeout" in hung.note
    plain = classify_hang("INFO loading\n", 1200.4, 1200)
    assert (plain.outcome, plain.note) == ("timeout", "not ready after 1200 s")


def test_malformed_response_is_an_error_and_serving_goes_on(tmp_path, port, monkeypatch):
    project = make_project(tmp_path, faults=["malformed@1"], seeds=[2301, 2302])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    assert probe(project, "probe-serve", port, "--flag-set", "cpuoff",
                 "--fixture", "sim-pair")[0] == 0
    records = requests_of(project)
    assert [(r.outcome, r.lifetime) for r in records] == [("error", 0), ("ok", 0)]
    assert records[0].error.startswith("malformed response: JSONDecodeError")
    assert records[0].output_sha256 is None


@pytest.mark.e2e
def test_repeated_crashes_stop_after_the_restart_limit(tmp_path, port, monkeypatch):
    project = make_project(tmp_path, faults=["crash@1"], seeds=[2301, 2302, 2303, 2304])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i")
    assert code == 1
    assert "not done: fp8: 1 request(s) not sent after 2 restart(s); re-run to resume" in out
    assert "unsettled: fp8: 1 of 4 cell(s) not measured" in out
    assert out.rstrip().endswith("re-run to measure them")
    assert [r.outcome for r in requests_of(project)] == ["error"] * 3


def test_a_server_that_exits_at_init_stops_its_run_with_its_own_error(project, port, monkeypatch):
    # As a server started without the caller's PYTHONPATH does: it dies at import.
    sim_serve = '["{python}", "-m", "omniprobe.sim", "serve", '
    hosts = project.hosts_file.read_text()
    assert sim_serve in hosts
    project.hosts_file.write_text(hosts.replace(
        sim_serve, '["{python}", "-c", "import omniprobe_absent", '))
    error = "ModuleNotFoundError: No module named 'omniprobe_absent'"
    # The serve preflight refuses it before any server starts (issue 14) ...
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i")
    assert code == 4
    assert ("serve.args:fp8 failed: the parser refuses the arguments: environment: import "
            "error: No module named 'omniprobe_absent'") in out
    assert not (project.evidence_dir / "sim").exists()
    # ... and forced past it, the run stops with the server's own error, an environment's.
    monkeypatch.setattr(probe_env, "sim_preflight", lambda *a, **k: [])
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i")
    assert code == 4
    assert f"not done: fp8: 1 request(s) not sent, init error: exited 1 before it was ready: {error}" in out
    assert "connection" not in out.lower()
    [attempt] = attempts(project)
    assert attempt.requests == [] and error in attempt.runs[0].init.note
    assert attempt.runs[0].init.cause.kind == "environment"


def test_seed_fixtures_named_are_refused_naming_what_is_missing(project, port):
    code, out = probe(project, "probe-serve", port, "--host", "rtx3090",
                      "--fixture", "single-reference", "--fixture", "t2i")
    assert code == 3  # a refusal
    assert ("fixture 'single-reference' cannot run: its source does not state prompt, width, "
            "height, references; record them in fixtures/fixtures.json first (or serve its "
            "stand-in: --fixture standin-single)") in out
    assert "fixture 't2i' cannot run: its source does not state prompt, width, height" in out
    assert not (project.evidence_dir / "rtx3090").exists()


def test_simulated_fixtures_are_refused_on_a_real_host(project, port):
    code, out = probe(project, "probe-serve", port, "--host", "rtx3090", "--fixture", "sim-pair")
    assert code == 3  # a refusal
    assert "fixture(s) sim-pair are simulated: they run on simulated hosts only" in out
    assert not (project.evidence_dir / "rtx3090").exists()


@pytest.fixture
def env_root(tmp_path_factory, monkeypatch):
    """Envs outside the project (and never the user's own), and an empty hub cache."""
    root = tmp_path_factory.mktemp("envroot")
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hf"))
    return root


def test_a_real_host_without_its_env_is_refused_naming_the_checks(project, port, env_root):
    # The GPU is right (faked through NVML): only the env is missing.
    code, out = probe(project, "probe-init", port, "--host", "rtx5080", nvml=FakeNvml(**RTX5080))
    assert code == 4  # an environment failure
    assert f"error: the probe environment of host 'rtx5080' at {env_root}/envs/rtx5080" in out
    assert "env.stamp failed: no build stamp" in out
    assert "package.vllm-omni failed: vllm-omni is not installed" in out
    assert "gpu.name failed" not in out
    assert "run `omniprobe env build --host rtx5080`" in out
    assert not (project.evidence_dir / "rtx5080").exists()


def test_an_incomplete_env_is_refused(project, port, env_root):
    cfg = load_hosts(project.hosts_file)
    paths = env_paths(cfg, project, "rtx3090")
    write_stamp(paths, Stamp(state="incomplete", host="rtx3090", pins_hash=pins_hash(cfg, project),
                             python="python3.13", started_at="2026-11-30T09:00:00Z"))
    code, out = probe(project, "probe-init", port, "--host", "rtx3090", nvml=FakeNvml())
    assert code == 4
    assert "env.stamp failed: incomplete: the build started 2026-11-30 09:00:00 did not finish" in out
    assert not (project.evidence_dir / "rtx3090").exists()


def test_unknown_flag_set_is_refused(project, port):
    code, out = probe(project, "probe-init", port, "--flag-set", "int8")
    assert code == 3 and "error: flag set(s) int8 are not run on host 'sim'" in out


def test_without_nvml_the_run_records_why(project, port):
    def no_nvml(folder):
        raise NvmlUnavailable("NVML: Driver Not Loaded")

    assert probe(project, "probe-init", port, "--flag-set", "fp8", readers=no_nvml)[0] == 0
    [run] = attempts(project)[0].runs
    timeline = run.lifetimes[0].timeline
    assert timeline.state == "unavailable" and timeline.reason == "NVML: Driver Not Loaded"
    assert run.gpu_peak_mib is None and run.init.outcome == "ready"


@pytest.mark.e2e
def test_the_sampler_sees_the_modelled_peak(project, port, monkeypatch):
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "1")
    assert probe(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture", "sim-three",
                 "--sample-hz", "20")[0] == 0
    [run] = attempts(project)[0].runs
    timeline = run.lifetimes[0].timeline
    # context 512 + weights 14336 + activation 1024 + 3 x 2048 + spike 1536 (hosts.toml)
    assert timeline.peak_mib == 23552 and timeline.peak_source == "process"
    assert run.gpu_peak_mib == 23552 and 15 <= timeline.rate_hz <= 21


def test_evidence_written_is_what_validation_accepts(project, port):
    assert probe(project, "probe-serve", port, "--flag-set", "cpuoff", "--fixture",
                 "sim-four")[0] == 0
    [attempt] = attempts(project)
    raw = json.loads((attempt.path / "requests.json").read_text())["requests"]
    assert raw[0]["oom"]["phase"] == "request" and "pixels_sha256" not in raw[0]
    _, problems = load_project(project)
    assert problems == []


@pytest.mark.parametrize("session", ["probe-init", "probe-serve"])
def test_port_in_use_is_refused_before_anything_runs(project, port, session):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        code, out = probe(project, session, port, "--flag-set", "fp8", "--fixture", "sim-t2i")
    assert code == 4 and f"error: port {port} on 127.0.0.1 is already in use" in out
    assert not (project.evidence_dir / "sim").exists()
    assert not processes_with(str(project.root))


def test_a_busy_gpu_stops_the_probe_naming_the_holder(project, port):
    from omniprobe.harness.common.sampler import MIB, NvmlReader
    from tests.fakenvml import FakeNvml, Frame

    fake = FakeNvml([Frame(0.0, 9000 * MIB, compute=((4242, 8000 * MIB),))],
                    names={4242: "python3"})
    code, out = probe(project, "probe-init", port, "--flag-set", "fp8", "--idle-timeout", "0.3",
                      readers=lambda folder: NvmlReader(nvml=fake))
    assert code == 4
    assert "the GPU is not idle after 0.3 s: pid 4242 (python3) holds 8,000 MiB" in out
    # Nothing was recorded: the attempt is removed, so a re-run does not resume an empty one.
    assert attempts(project) == [] and not processes_with(str(project.root))


def test_a_fresh_clone_does_not_resume_the_committed_sim_attempt(repo_copy, port, monkeypatch):
    """The committed sim attempt was made on another machine: a probe here starts its own."""
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    monkeypatch.setenv("OMNIPROBE_ARTIFACTS", str(repo_copy.root / "artifacts"))
    committed = sorted(p.name for p in (repo_copy.evidence_dir / "sim").glob("*-probe"))
    code, out = probe(repo_copy, "probe-init", port, "--flag-set", "fp8")
    assert code == 0, out
    assert f"(new: {committed[-1]} does not record its environment" in out
    assert "1 flag set(s): 0 already recorded, 1 to run" in out
    assert len(list((repo_copy.evidence_dir / "sim").glob("*-probe"))) == len(committed) + 1


@pytest.mark.parametrize(("outcome", "cause", "settled"), [
    (None, None, False),                   # never started: run it
    ("ready", None, True),
    ("oom", "card", True),                 # the card's answer stands
    ("error", "server", True),             # so does the server software's
    ("error", None, True),                 # unclassified: kept, as recorded
    ("error", "environment", False),       # a full disk, a busy port: start it again
    ("timeout", "environment", False),
])
def test_an_init_the_environment_failed_is_run_again_on_resume(outcome, cause, settled):
    """One rule for a server's init and an offline runner's failed one."""
    from omniprobe.evidence.models.common import FailureCause
    from omniprobe.evidence.models.offline import OfflineCell, OfflineRun
    from omniprobe.evidence.models.runs import InitResult
    from omniprobe.harness.common.plan import init_settled
    from omniprobe.harness.offline.state import init_failure

    why = None if cause is None else FailureCause(kind=cause, reason="why")
    init = None if outcome is None else InitResult(outcome=outcome, time_s=0.1, cause=why)
    assert init_settled(init) is settled
    cell = OfflineCell(fixture="f", outcome="ok", structure="sound")
    run = OfflineRun(kwarg_set="k", engine="omni", init=init, cells=[cell])
    if outcome not in (None, "ready"):  # the run's init failed: its failure is on record
        assert init_failure(run) is init
        assert init_settled(init_failure(run)) is settled
    else:  # ready, or no init recorded: no failure
        assert init_failure(run) is None
    assert init_failure(None) is None and init_settled(None) is False


class DesktopGpu:
    """A GPU whose first reading is 500 MiB and every later one 900: another program (a desktop's
    compositor, a browser) took 400 MiB more between the two servers."""

    label = "NVML"

    def __init__(self):
        self.reads = 0

    def memory(self):
        self.reads += 1
        return (500 if self.reads == 1 else 900) * 1024**2, 24 * 1024**3

    def processes(self):
        return [], []

    def process_name(self, pid):
        return "?"


@pytest.mark.parametrize(("tolerance", "code"), [(None, 4), (512, 0)])
def test_the_idle_tolerance_comes_from_hosts_toml(project, port, tolerance, code):
    """Issue 23 item 7: 400 MiB moved by another program is fatal at the default 256 MiB, and
    within a host's idle_tolerance_mib of 512 it is recorded on the timeline."""
    if tolerance is not None:
        hosts = project.hosts_file.read_text()
        project.hosts_file.write_text(hosts.replace(
            'python_provider = "the probe\'s own Python"\nsimulated = true\nserve_flag_sets = ["default"',
            f'python_provider = "the probe\'s own Python"\nidle_tolerance_mib = {tolerance}\n'
            'simulated = true\nserve_flag_sets = ["default"', 1))
        assert f"idle_tolerance_mib = {tolerance}" in project.hosts_file.read_text()
    gpu = DesktopGpu()
    got, out = probe(project, "probe-init", port, "--flag-set", "fp8", "--flag-set", "cpuoff",
                     "--idle-timeout", "0.3", readers=lambda folder: gpu)
    assert got == code, out
    if code:
        assert ("900 MiB in use against the first idle reading of 500 MiB, more than its "
                "tolerance of 256 MiB (hosts.toml idle_tolerance_mib)") in out
        return
    runs = {r.flag_set: r for r in attempts(project)[0].runs}
    second = runs["fp8"].lifetimes[0].timeline
    assert (second.first_idle_mib, second.idle_mib) == (500.0, 900.0)


def test_gpu_index_moves_the_server_and_the_sampler_and_both_are_recorded(project, port,
                                                                         monkeypatch):
    """Issue 23 item 8: --gpu-index 1 gives the server CUDA_VISIBLE_DEVICES=1 (its own words
    say so) and the lifetime records it; NVML's reader of that index names its device."""
    from omniprobe.harness.common.sampler import NvmlReader

    from .fakenvml import FakeNvml, Frame

    monkeypatch.setattr(probe_env, "sim_preflight", lambda *a, **k: [])
    hosts = project.hosts_file.read_text()
    sim_serve = '["{python}", "-m", "omniprobe.sim", "serve", '
    project.hosts_file.write_text(hosts.replace(sim_serve, (
        '["{python}", "-c", "import os; print(\'on\', os.environ[\'CUDA_VISIBLE_DEVICES\']); '
        'raise SystemExit(1)", '), 1))
    code, out = probe(project, "probe-init", port, "--flag-set", "fp8", "--gpu-index", "1")
    assert code == 0, out
    [lifetime] = attempts(project)[0].runs[0].lifetimes
    assert lifetime.cuda_visible_devices == "1"
    assert lifetime.init.note == "exited 1 before it was ready: on 1"
    reader = NvmlReader(1, nvml=FakeNvml([Frame(0.0, 0)]))
    assert reader.label == "NVML device 1"


def _drop_attempt_json(folder):
    (folder / "attempt.json").unlink()


def _drop_all_but_runs(folder):
    (folder / "attempt.json").unlink()
    (folder / "requests.json").unlink()


def _duplicate(name, key=None):
    def damage(folder):
        path = folder / name
        data = json.loads(path.read_text())
        rows = data[key] if key else data[next(k for k, v in data.items() if isinstance(v, list))]
        rows.append(rows[0])
        path.write_text(json.dumps(data))
    return damage


def _truncate_attempt_json(folder):
    path = folder / "attempt.json"
    path.write_bytes(path.read_bytes()[:40])


@pytest.mark.parametrize(("damage", "words"), [
    # Issue 35 class 12: a damaged attempt is refused before a resume adds to it.
    (_drop_attempt_json, "attempt.json: missing, while the folder holds records (requests.json, "
                         "runs.json)"),
    (_drop_all_but_runs, "missing, while the folder holds records (runs.json)"),
    (_duplicate("requests.json"), "a second record of (flag set, fixture, seed)"),
    (_duplicate("runs.json"), "a second record of flag set ('fp8',)"),
    (_truncate_attempt_json, "attempt.json"),
])
def test_a_damaged_attempt_is_refused_not_resumed_or_started_beside(project, port, damage,
                                                                    words):
    assert probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i")[0] == 0
    [folder] = sorted((project.evidence_dir / "sim").iterdir())
    damage(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, out = probe(project, "probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i",
                      "--fixture", "sim-single")
    assert code == 2 and words in out, out
    assert "Traceback" not in out
    assert [p.name for p in sorted((project.evidence_dir / "sim").iterdir())] == [folder.name]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
