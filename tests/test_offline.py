"""probe-offline end to end against the simulated engine, and the runner script on its own."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import omniprobe_engine
from omniprobe.analysis.verdicts import all_verdicts
from omniprobe.classify.imaging import load_pixels, pixels_sha256
from omniprobe.classify.oom import parse_oom
from omniprobe.config.hosts import load_hosts
from omniprobe.env.state import EnvError
from omniprobe.evidence.attempts import probe_attempts
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.propagation_rules import offline_pairs, unchecked_extras
from omniprobe.harness.offline.env import runner_command
from omniprobe.sim.http import Faults
from omniprobe.sim.knobs import EXTRAS_BRIDGE_ENV
from omniprobe.sim.memory import MIB, Accounted
from omniprobe.sim.offline import EngineClosed, SimEngine
from omniprobe_engine import runner as offline_runner
from omniprobe_engine.launch import runner_folder
from omniprobe_engine.protocol import RequestSpec

from .conftest import REPO, in_process, make_project, processes_with, wait_for
from .rendered import render_harness

REPO_HOSTS = REPO / "hosts.toml"


def offline(project, *extra, host="sim"):
    return in_process(project, ["probe-offline", "--host", host, "--grace", "2", *extra])


def the_attempt(project, host="sim"):
    [folder] = sorted((project.evidence_dir / host).iterdir())
    attempt, problems = load_attempt(folder)
    assert problems == []
    return attempt


def add_to_hosts(project, text: str, kwarg_sets: list[str] = (), command_extra: str = "") -> None:
    """Append tables to the project's hosts.toml, list kwarg sets on the sim host, and extend its
    offline command (e.g. with sim faults)."""
    hosts = project.hosts_file.read_text()
    listed = '"sim-offline-bf16", "sim-offline-fp8v", "sim-offline-fp8"'
    hosts = hosts.replace(listed, ", ".join([listed, *(f'"{k}"' for k in kwarg_sets)]))
    if command_extra:
        hosts = hosts.replace('"offline", "--hosts-file", "{hosts_file}", "--sim-host", "{host}"]',
                              f'"offline", "--hosts-file", "{{hosts_file}}", "--sim-host", '
                              f'"{{host}}", {command_extra}]')
    project.hosts_file.write_text(hosts + "\n" + text)


def test_the_sim_matrix_follows_the_capacity_model_and_validates(project, tmp_path):
    code, out = offline(project, "--fixture", "sim-three", "--fixture", "sim-four")
    assert code == 0, out
    attempt = the_attempt(project)
    assert attempt.id.endswith("-sim-offline") and attempt.simulated
    assert attempt.meta.description.startswith("probe-offline by omniprobe")
    # Not an attempt probe-init / probe-serve would resume.
    assert probe_attempts(project.evidence_dir / "sim") == []
    got = {(r.kwarg_set, r.fixture): (r.outcome, r.structure) for r in attempt.offline_requests}
    assert got == {
        ("sim-offline-bf16", "sim-three"): ("ok", "sound"),
        ("sim-offline-bf16", "sim-four"): ("oom", "unchecked"),
        ("sim-offline-fp8v", "sim-three"): ("ok", "sound"),
        ("sim-offline-fp8v", "sim-four"): ("oom", "unchecked"),
        ("sim-offline-fp8", "sim-three"): ("ok", "broken"),
        ("sim-offline-fp8", "sim-four"): ("ok", "broken")}
    oom = next(r for r in attempt.offline_requests if r.outcome == "oom")
    assert oom.oom.phase == "request" and oom.oom.requested == "1.50 GiB"
    assert oom.oom.location.function == "image_mlp" and "CUDA out of memory" in oom.error
    broken = next(r for r in attempt.offline_requests if r.structure == "broken")
    assert any("opaque fraction" in reason for reason in broken.image.reasons)
    rows = {(r.kwarg_set, c.fixture): c for r in attempt.offline for c in r.cells}
    assert rows[("sim-offline-fp8", "sim-four")].structure == "broken"
    assert rows[("sim-offline-bf16", "sim-four")].oom.requested == "1.50 GiB"
    assert rows[("sim-offline-bf16", "sim-three")].wall_s is not None
    assert [r.kwarg_set for r in attempt.offline] == ["sim-offline-bf16", "sim-offline-fp8v",
                                                      "sim-offline-fp8"]
    for row in attempt.offline:  # one run per kwarg set, its one runner's log held once
        assert (row.engine, row.init.outcome, row.settings) == ("omni", "ready", None)
        [lifetime] = row.lifetimes
        log = lifetime.log
        data = (project.artifacts_dir / log.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == log.sha256
    _, problems = load_project(project)
    assert problems == []
    assert "[sim-offline-fp8 3/3] sim-four seed 2301: ok" in out and "output broken" in out
    assert not processes_with(str(tmp_path))


def test_records_hash_the_saved_image_and_the_kv_knob_changes_its_pixels(project):
    assert offline(project, "--fixture", "sim-pair", "--kwarg-set", "sim-offline-bf16",
                   "--kwarg-set", "sim-offline-fp8v")[0] == 0
    bf16, fp8v = the_attempt(project).offline_requests
    for record in (bf16, fp8v):
        path = project.artifacts_dir / record.artifact
        assert hashlib.sha256(path.read_bytes()).hexdigest() == record.output_sha256
        assert pixels_sha256(load_pixels(path)) == record.pixels_sha256
        assert record.structure == "sound" and record.peak_mib > 0
        assert record.peak_source == "sim-model"
    # fp8_v takes a quarter of the KV part (320 MiB) off each of the two references.
    assert bf16.peak_mib - fp8v.peak_mib == 2 * 80
    assert bf16.pixels_sha256 != fp8v.pixels_sha256
    code, out = offline(project, "--fixture", "sim-single", "--kwarg-set", "sim-offline-fp8v")
    assert code == 0 and ("not checked: whether sim-offline-fp8v's extras reach the model; no "
                          "kwarg set run beside it has its kwargs without them") in out


@pytest.mark.parametrize("bridge", ["honour", "drop"])
def test_an_offline_knob_gets_a_propagation_check_and_one_never_reached_is_reported(
        project, monkeypatch, bridge):
    monkeypatch.setenv(EXTRAS_BRIDGE_ENV, bridge)
    code, out = offline(project, "--fixture", "sim-pair", "--kwarg-set", "sim-offline-bf16",
                        "--kwarg-set", "sim-offline-fp8v")
    assert code == 0, out
    attempt = the_attempt(project)
    [check] = attempt.propagation
    assert (check.via, check.knob, check.flag_set_with, check.flag_set_without) == (
        "offline", "extras.prefix_kv_cache_dtype", "sim-offline-fp8v", "sim-offline-bf16")
    assert (check.fixture, check.seed) == ("sim-pair", 2301)
    assert "not checked" not in out
    bf16, fp8v = attempt.offline_requests
    assert check.reached_model is (bridge == "honour")
    assert (bf16.peak_mib == fp8v.peak_mib) is (bridge == "drop")
    assert load_project(project)[1] == []
    shutil.copytree(REPO / "templates", project.root / "templates")
    loaded, _ = load_project(project)
    verdict = all_verdicts(loaded.hosts, loaded.fixtures, loaded.evidence)["sim"]
    report = render_harness(project)
    if bridge == "drop":
        assert check.bytes_identical and "did NOT reach the model: the outputs are byte-identical" in out
        [unreached] = verdict.unreached_offline
        assert (unreached.flag_set, unreached.base) == ("sim-offline-fp8v", "sim-offline-bf16")
        assert verdict.unreached == ()  # no serve flag set is concerned
        assert ("sim-offline-fp8v ran as sim-offline-bf16: its `extras.prefix_kv_cache_dtype` "
                "never reached the model offline") in report
        assert ("The `Omni(...)` kwarg `extras.prefix_kv_cache_dtype` **does not reach the model "
                "offline**") in report
        log = (project.artifacts_dir / attempt.offline[1].lifetimes[0].log.path).read_text()
        assert "the simulated default diffusion stage config builds its own extras" in log
    else:
        assert "extras.prefix_kv_cache_dtype reached the model" in out
        assert verdict.unreached_offline == () and "ran as sim-offline-bf16" not in report


@pytest.mark.parametrize(("kwarg_sets", "pairs"), [
    (["sim-offline-bf16", "sim-offline-fp8v", "sim-offline-fp8"],
     [("sim-offline-fp8v", "sim-offline-bf16", "extras.prefix_kv_cache_dtype"),
      ("sim-offline-fp8", "sim-offline-bf16", "quantization")]),
    (["sim-offline-fp8v", "sim-offline-fp8"], []),  # neither is the other plus one setting
    # Same kwargs, another environment: not a twin.
    (["offline-fp8v", "offline-fp8v-expandable"], []),
])
def test_offline_twins_differ_by_one_setting_under_one_environment(kwarg_sets, pairs):
    assert offline_pairs(load_hosts(REPO_HOSTS), kwarg_sets) == pairs


@pytest.mark.parametrize(("kwarg_sets", "unchecked"), [
    (["sim-offline-bf16", "sim-offline-fp8v"], []),
    (["sim-offline-fp8v", "sim-offline-fp8"], ["sim-offline-fp8v"]),
    (["offline-fp8v", "offline-fp8v-expandable", "offline-fp8-no-img-mlp"],
     ["offline-fp8v", "offline-fp8v-expandable"]),
])
def test_extras_without_a_twin_are_named_as_unchecked(kwarg_sets, unchecked):
    assert unchecked_extras(load_hosts(REPO_HOSTS), kwarg_sets) == unchecked


def test_init_failures_are_runs_without_requests(project):
    add_to_hosts(project, """
[offline_kwarg_sets.sim-offline-resident]
description = "test: no offload, the weights do not fit"
kwargs = { enforce_eager = true }

[offline_kwarg_sets.sim-offline-tiling]
description = "test: a kwarg the capacity model does not describe"
kwargs = { enable_cpu_offload = true, vae_use_tiling = true }
""", ["sim-offline-resident", "sim-offline-tiling"])
    code, out = offline(project, "--kwarg-set", "sim-offline-resident",
                        "--kwarg-set", "sim-offline-tiling", "--fixture", "sim-single")
    assert code == 0, out
    attempt = the_attempt(project)
    assert attempt.offline_requests == []
    resident_run, tiling_run = attempt.offline
    assert resident_run.cells == tiling_run.cells == []  # an init failure is the run's init
    resident, tiling = resident_run.init, tiling_run.init
    assert (resident_run.init_failed, resident.oom.phase) == ("init-oom", "init")
    assert resident.oom.requested == "96.00 MiB"
    assert resident.oom.location.function == "init_parameters"
    # The runner saw only the orchestrator's failure; the OOM came from the worker's log.
    assert resident.note.startswith("RuntimeError: Orchestrator initialization failed")
    assert tiling.outcome == "error" and "vae_use_tiling" in tiling.note
    assert "[sim-offline-resident 1/2] the engine was not built: init-oom" in out
    assert out.rstrip().splitlines()[-1].startswith("done: every init and cell")  # issue 23


def test_a_kwarg_set_without_kwargs_is_refused_by_name_and_skipped_otherwise(project):
    add_to_hosts(project, """
[offline_kwarg_sets.sim-offline-unstated]
description = "test: the source does not give its kwargs"
""", ["sim-offline-unstated"])
    code, out = offline(project, "--kwarg-set", "sim-offline-unstated")
    assert code == 3  # a refusal
    assert ("offline kwarg set 'sim-offline-unstated' cannot run: hosts.toml "
            "[offline_kwarg_sets.sim-offline-unstated] has no 'kwargs'") in out
    assert not (project.evidence_dir / "sim").exists()
    code, out = offline(project, "--fixture", "sim-t2i")
    assert code == 0, out
    assert "refused: offline kwarg set 'sim-offline-unstated' cannot run" in out
    assert "not done: offline kwarg set 'sim-offline-unstated'" in out
    assert {r.kwarg_set for r in the_attempt(project).offline_requests} == {
        "sim-offline-bf16", "sim-offline-fp8v", "sim-offline-fp8"}


@pytest.mark.parametrize(("host", "extra", "message"), [
    ("rtx3090", ["--kwarg-set", "offline-fp8-encoder-only"],
     "hosts.toml [offline_kwarg_sets.offline-fp8-encoder-only] has no 'kwargs'"),
    ("rtx3090", ["--kwarg-set", "offline-fp8v", "--fixture", "single-reference"],
     "fixture 'single-reference' cannot run: its source does not state prompt, width, height, "
     "references"),
    ("sim", ["--kwarg-set", "offline-fp8v"],
     "offline kwarg set(s) offline-fp8v are not run on host 'sim'"),
    ("sim", ["--fixture", "nope"], "unknown fixture(s) nope"),
    ("rtx5080", [], "host 'rtx5080' has no offline kwarg sets"),
])
def test_refusals_leave_no_evidence(project, host, extra, message):
    code, out = offline(project, *extra, host=host)
    assert code == 3 and message in out
    assert not project.evidence_dir.exists() or not any(project.evidence_dir.iterdir())


def test_a_real_host_needs_its_built_env(project, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(tmp_path_factory.mktemp("envroot")))
    cfg = load_hosts(project.hosts_file)
    with pytest.raises(EnvError, match=r"env\.stamp"):
        runner_command(cfg, project, "rtx3090")
    assert runner_command(cfg, project, "sim").argv[:4] == [sys.executable, "-m", "omniprobe.sim",
                                                        "offline"]


def test_the_runners_recorded_command_names_no_folder_of_one_process(project):
    """The machine's own Python runs the runner from a folder each process makes anew: the
    command an environment's digest reads holds `{runner}`, so a later process on the same
    machine resumes the attempt rather than starting one (seen on the H200: three runs, three
    attempts)."""
    from omniprobe_engine.launch import runner_folder

    cfg = load_hosts(project.hosts_file)
    host = next(name for name, h in cfg.hosts.items()
                if h.diffusers is not None and h.diffusers.runner_env == "own")
    first = runner_command(cfg, project, host)
    runner_folder.cache_clear()
    second = runner_command(cfg, project, host)
    assert first.argv != second.argv
    assert first.recorded_argv == second.recorded_argv == [sys.executable, "{runner}"]


@pytest.mark.parametrize(("fault", "outcomes", "detail"), [
    ("crash@2", [("ok", 0), ("error", 0), ("ok", 1)], "illegal memory access"),
    ("malformed@2", [("ok", 0), ("error", 0), ("ok", 0)], "the runner's image is unreadable"),
])
def test_a_lost_request_is_recorded_and_the_rest_runs(tmp_path, monkeypatch, fault, outcomes,
                                                      detail):
    project = make_project(tmp_path, seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    add_to_hosts(project, "", command_extra=f'"--fault", "{fault}"')
    code, out = offline(project, "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-single")
    assert code == 0, out
    records = the_attempt(project).offline_requests
    assert [(r.outcome, r.lifetime) for r in records] == outcomes
    assert detail in records[1].error and records[1].artifact is None
    assert not processes_with(str(tmp_path))


@pytest.mark.e2e
def test_a_hung_request_times_out_and_the_runner_restarts(tmp_path, monkeypatch):
    project = make_project(tmp_path, seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    add_to_hosts(project, "", command_extra='"--fault", "hang@2"')
    code, out = offline(project, "--kwarg-set", "sim-offline-fp8", "--fixture", "sim-t2i",
                        "--request-timeout", "1")
    # A timeout is not the card's answer (issue 34 item 4): not settled, exit 1.
    assert code == 1 and "sim-t2i seed 2302 timed out, not the card's answer" in out, out
    records = the_attempt(project).offline_requests
    assert [(r.outcome, r.lifetime) for r in records] == [("ok", 0), ("timeout", 0), ("ok", 1)]
    assert records[1].error == "no result within 1 s" and 1 <= records[1].wall_s < 3
    assert len(the_attempt(project).offline[0].lifetimes) == 2
    assert not processes_with(str(tmp_path))
    # The resume runs it again in a fresh runner (whose first request does not hang); the later
    # record supersedes the timeout, in the summary row and for validate.
    code, out = offline(project, "--kwarg-set", "sim-offline-fp8", "--fixture", "sim-t2i")
    assert code == 0, out
    attempt = the_attempt(project)
    assert [(r.outcome, r.seed) for r in attempt.offline_requests] == [
        ("ok", 2301), ("timeout", 2302), ("ok", 2303), ("ok", 2302)]
    [row] = [c for r in attempt.offline for c in r.cells if c.fixture == "sim-t2i"]
    assert row.outcome == "ok" and row.seeds == [2301, 2302, 2303]
    from omniprobe.evidence.validate import load_project

    assert load_project(project)[1] == []


@pytest.mark.e2e
def test_repeated_crashes_stop_after_the_restart_limit(tmp_path, monkeypatch):
    project = make_project(tmp_path, seeds=[2301, 2302, 2303, 2304])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    add_to_hosts(project, "", command_extra='"--fault", "crash@1"')
    code, out = offline(project, "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-t2i")
    assert code == 1
    assert "not done: sim-offline-bf16: 1 request(s) not run after 2 restart(s)" in out
    assert out.rstrip().endswith("re-run to measure them")
    assert [r.outcome for r in the_attempt(project).offline_requests] == ["error"] * 3


@pytest.mark.parametrize(("fault", "outcomes"), [
    ("fail@2", [("ok", 0), ("error", 0), ("ok", 1), ("error", 1)]),
    # More failed requests than max_restarts (2): a planned end is no restart.
    ("fail@1", [("error", 0), ("error", 1), ("error", 2), ("error", 3)]),
])
def test_a_failed_request_ends_its_runner_and_the_rest_get_a_fresh_one(tmp_path, monkeypatch,
                                                                       fault, outcomes):
    project = make_project(tmp_path, seeds=[2301, 2302, 2303, 2304])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    add_to_hosts(project, "", command_extra=f'"--fault", "{fault}"')
    code, out = offline(project, "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-single")
    assert code == 0, out
    attempt = the_attempt(project)
    records = attempt.offline_requests
    assert [(r.outcome, r.lifetime) for r in records] == outcomes
    # Each failure is the request's own, never the closed engine's refusal of a later one.
    assert all(r.error.startswith("RuntimeError: simulated failure during generation")
               for r in records if r.outcome == "error")
    assert len(attempt.offline[0].lifetimes) == outcomes[-1][1] + 1
    assert "the engine closed on the failed request: a fresh runner" in out
    assert "not done" not in out
    assert not processes_with(str(tmp_path))


def test_the_sim_engine_closes_on_a_failed_request_as_upstreams_does(project, tmp_path):
    cfg = load_hosts(project.hosts_file)
    cap = cfg.host("sim").capacity
    engine = SimEngine(cap, cfg.offline_kwarg_sets["sim-offline-bf16"].kwargs,
                       Accounted(cap.vram_mib * MIB, cap.context_mib * MIB, None), 0,
                       Faults(fail={1}))
    request = {"prompt": "p", "reference_paths": [], "width": 64, "height": 48, "seed": 1,
               "num_inference_steps": 2, "true_cfg_scale": 1.0, "output": str(tmp_path / "out.png")}
    with pytest.raises(RuntimeError, match="simulated failure"):
        engine.generate(request)
    with pytest.raises(EngineClosed):
        engine.generate(request)
    # The runner stops at the failure: the closed engine is never asked again.
    out = tmp_path / "r.jsonl"
    engine.closed, engine.count = False, 0
    requests = [RequestSpec.of({**request, "id": f"r{i}", "fixture": "f"}) for i in range(3)]
    assert offline_runner.run(lambda: engine, requests, offline_runner.Results(str(out))) == 0
    assert [(e["event"], e.get("outcome")) for e in results(out)] == [
        ("init", "ready"), ("request", "error"), ("closed", None)]
    assert results(out)[-1]["after"] == "r0" and engine.count == 1


# --- the runner script itself, with a stand-in for vLLM-Omni ------------------------------

FAKE_OMNI = '''
import json, os
from types import SimpleNamespace
from PIL import Image


class OutOfMemoryError(RuntimeError):
    pass


class Omni:
    def __init__(self, model, **kwargs):
        if "explode" in kwargs:
            raise TypeError("Omni.__init__() got an unexpected keyword argument 'explode'")
        self.model, self.kwargs = model, kwargs

    def generate(self, prompt, sampling_params_list):
        params = sampling_params_list[0]
        images = prompt.get("multi_modal_data", {}).get("image", [])
        with open(os.environ["FAKE_OMNI_CALLS"], "a") as log:
            log.write(json.dumps({"model": self.model, "kwargs": self.kwargs,
                                  "prompt": prompt["prompt"], "images": len(images),
                                  "params": vars(params)}) + "\\n")
        if len(images) > 1:
            self.image_mlp()
        image = Image.linear_gradient("L").resize((params.width, params.height)).convert("RGBA")
        return [SimpleNamespace(images=[image], peak_memory_mb=20480.25)]

    def image_mlp(self):
        raise OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 490.00 MiB. GPU 0 has a total capacity of "
            "23.56 GiB of which 203.00 MiB is free. Including non-PyTorch memory, this process "
            "has 23.35 GiB memory in use. Of the allocated memory 20.86 GiB is allocated by "
            "PyTorch, and 2.14 GiB is reserved by PyTorch but unallocated.")
'''
FAKE_PARAMS = '''
class OmniDiffusionSamplingParams:
    def __init__(self, **fields):
        self.__dict__.update(fields)
'''


@pytest.fixture
def fake_omni(tmp_path):
    """A vllm_omni package with the contract's offline API, on a PYTHONPATH without omniprobe."""
    root = tmp_path / "fake"
    (root / "vllm_omni" / "inputs").mkdir(parents=True)
    (root / "vllm_omni" / "__init__.py").write_text(FAKE_OMNI)
    (root / "vllm_omni" / "inputs" / "__init__.py").write_text("")
    (root / "vllm_omni" / "inputs" / "data.py").write_text(FAKE_PARAMS)
    return root


def requests_file(tmp_path, repo_fixtures: Path) -> Path:
    refs = [str(repo_fixtures / "sim" / f"ref-{c}.png") for c in "ab"]
    requests = [{"id": f"r{i}", "fixture": f"f{i}", "seed": 2301 + i, "prompt": "p",
                 "width": 40, "height": 30, "reference_paths": refs[:i + 1],
                 "num_inference_steps": 20, "true_cfg_scale": 1.0,
                 "output": str(tmp_path / f"out-{i}.png")} for i in range(2)]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps({"requests": requests}))
    return path


def run_runner(tmp_path, fake_omni, *args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(fake_omni), FAKE_OMNI_CALLS=str(tmp_path / "calls.jsonl"))
    return subprocess.run([sys.executable, str(runner_folder()), *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_runner_generates_saves_and_reports_oom_from_the_exception(tmp_path, fake_omni, repo):
    reqs = requests_file(tmp_path, repo.fixtures_file.parent)
    done = run_runner(tmp_path, fake_omni, "--model", "/snap", "--kwargs",
                      '{"enforce_eager": true, "extras": {"prefix_kv_cache_dtype": "fp8_v"}}',
                      "--requests", str(reqs), "--results", str(tmp_path / "r.jsonl"))
    assert done.returncode == 0, done.stderr
    init, ok, oom, end = results(tmp_path / "r.jsonl")
    assert (init["event"], init["outcome"], end["event"]) == ("init", "ready", "closed")
    assert end["after"] == "r1"
    assert (ok["id"], ok["outcome"], ok["image"]) == ("r0", "ok", str(tmp_path / "out-0.png"))
    assert (ok["peak_mib"], ok["peak_source"]) == (20480.2, "worker-reserved")
    assert load_pixels(ok["image"]).width == 40
    assert oom["outcome"] == "oom" and oom["image"] is None
    assert oom["error"].startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 490")
    signature = parse_oom(oom["traceback"], "request", ("vllm_omni/",))
    assert signature.requested == "490.00 MiB" and signature.reserved_unallocated == "2.14 GiB"
    assert signature.location.function == "image_mlp"
    assert signature.location.file.startswith("vllm_omni/")
    first, _ = results(tmp_path / "calls.jsonl")
    assert first["kwargs"] == {"enforce_eager": True, "extras": {"prefix_kv_cache_dtype": "fp8_v"}}
    assert first["model"] == "/snap" and first["images"] == 1
    assert first["params"] == {"height": 30, "width": 40, "seed": 2301, "num_inference_steps": 20,
                               "true_cfg_scale": 1.0}
    assert done.stdout.count('"event": "request"') == 2  # echoed for the log


def test_the_runner_reports_a_failed_init_and_stops(tmp_path, fake_omni, repo):
    reqs = requests_file(tmp_path, repo.fixtures_file.parent)
    (tmp_path / "kw.json").write_text('{"explode": 1}')
    done = run_runner(tmp_path, fake_omni, "--model", "m", "--kwargs-file", str(tmp_path / "kw.json"),
                      "--requests", str(reqs), "--results", str(tmp_path / "r.jsonl"))
    assert done.returncode == 1
    [init] = results(tmp_path / "r.jsonl")
    assert init["outcome"] == "error" and "unexpected keyword argument 'explode'" in init["error"]
    assert not (tmp_path / "out-0.png").exists()


@pytest.mark.parametrize(("kwargs", "message"), [
    ("[1, 2]", "--kwargs: expected a JSON object"),
    ("{nope", "--kwargs: not valid JSON"),
    ('{"model": "x"}', "'model' is given with --model"),
])
def test_the_runner_refuses_bad_input_naming_it(tmp_path, fake_omni, repo, kwargs, message):
    reqs = requests_file(tmp_path, repo.fixtures_file.parent)
    done = run_runner(tmp_path, fake_omni, "--model", "m", "--kwargs", kwargs, "--requests",
                      str(reqs), "--results", str(tmp_path / "r.jsonl"))
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_the_runner_refuses_a_request_missing_fields(tmp_path):
    (tmp_path / "q.json").write_text('{"requests": [{"id": "x", "seed": 1}]}')
    args = offline_runner.build_parser().parse_args(
        ["--model", "m", "--kwargs", "{}", "--requests", str(tmp_path / "q.json"),
         "--results", str(tmp_path / "r.jsonl")])
    with pytest.raises(offline_runner.UsageError, match=r"requests\[0\] lacks fixture, prompt"):
        offline_runner.load_inputs(args)


def test_the_harness_runs_the_real_runner_script(project, fake_omni, monkeypatch, tmp_path):
    """The sim host pointed at the runner script itself, with the stand-in vllm_omni."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake_omni), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("FAKE_OMNI_CALLS", str(tmp_path / "calls.jsonl"))
    hosts = project.hosts_file.read_text().replace(
        'offline_command = ["{python}", "-m", "omniprobe.sim", "offline", "--hosts-file", '
        '"{hosts_file}", "--sim-host", "{host}"]', 'offline_command = ["{python}", "{runner}"]')
    project.hosts_file.write_text(hosts)
    code, out = offline(project, "--kwarg-set", "sim-offline-fp8v", "--fixture", "sim-single",
                        "--fixture", "sim-pair")
    assert code == 0, out
    single, pair = the_attempt(project).offline_requests
    assert (single.outcome, single.structure, single.image.width) == ("ok", "sound", 64)
    assert pair.outcome == "oom" and pair.oom.location.function == "image_mlp"
    # The worker's reserved-pool peak off upstream's request output, and the record says so.
    assert (single.peak_mib, single.peak_source) == (20480.2, "worker-reserved")
    assert (pair.peak_mib, pair.peak_source) == (None, None)
    call = results(tmp_path / "calls.jsonl")[0]
    assert call["kwargs"]["extras"] == {"prefix_kv_cache_dtype": "fp8_v"}


def _top_level_imports(path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:  # relative: its own package's
            imported.add((node.module or "").split(".")[0])
    return imported


ENGINE = Path(omniprobe_engine.__file__).parent
# What the engines import when they are built: the probe env's and the Diffusers env's packages.
ENGINE_ENV = {"vllm_omni", "PIL", "torch", "transformers", "diffusers", "accelerate", "tokenizers",
              "torchao", "pynvml"}


@pytest.mark.parametrize("module", sorted(p.relative_to(ENGINE).as_posix()
                                          for p in ENGINE.rglob("*.py")))
def test_the_engine_package_imports_only_the_standard_library_itself_and_the_engines_packages(
        module):
    imported = _top_level_imports(ENGINE / module)
    assert imported - set(sys.stdlib_module_names) - {"omniprobe_engine"} <= ENGINE_ENV, imported


def test_the_engine_package_loads_with_the_standard_library_alone_and_finds_no_omniprobe():
    """Every module imported by a Python with no site-packages and only the runner's folder on
    its path (as the runner's own Python has it): nothing else loads, and omniprobe is not there."""
    modules = sorted(".".join(("omniprobe_engine", *p.relative_to(ENGINE).with_suffix("").parts))
                     .removesuffix(".__init__") for p in ENGINE.rglob("*.py")
                     if p.name not in ("__main__.py", "sitecustomize.py"))
    code = ("import importlib, json, sys; sys.path.insert(0, sys.argv[1]); "
            "[importlib.import_module(m) for m in sys.argv[2:]]; "
            "print(json.dumps([sorted(sys.modules), importlib.util.find_spec('omniprobe') is None]))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(runner_folder()), *modules],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded, no_omniprobe = json.loads(done.stdout)
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
               and m.split(".")[0] not in ("omniprobe_engine", "__main__")]
    assert foreign == [] and no_omniprobe
    assert "omniprobe_engine.diffusers_engine" in loaded and "omniprobe_engine.omni" in loaded


def test_the_runner_folder_runs_the_runner_with_the_engine_package_alone(tmp_path):
    """`python FOLDER`, as a host's {runner} is filled in: the runner answers --versions with
    no site-packages at all (every package unknown to it), so it needed none."""
    done = subprocess.run([sys.executable, "-I", "-S", str(runner_folder()), "--versions"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert set(facts) == {"packages", "python", "cuda_visible_devices", "refusals", "parameters"}
    assert facts["packages"]["torch"] is None


# --- the harness interrupted or killed mid-request ---------------------------------------

def _hanging_run(tmp_path, children):
    """probe-offline as its own process, its runner hung in the first request."""
    project = make_project(tmp_path)
    add_to_hosts(project, "", command_extra='"--fault", "hang@1"')
    run = children.start(
        [sys.executable, "-m", "omniprobe", "probe-offline", "--host", "sim", "--grace", "2",
         "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-single"],
        cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMNIPROBE_ROOT": str(project.root)})
    runner = f"{project.hosts_file} --sim-host sim --fault hang@1"
    assert wait_for(lambda: processes_with(runner), 20)
    assert wait_for(lambda: list(project.artifacts_dir.glob("sim/*/*/runner-1/results.jsonl")), 20)
    return run, runner


@pytest.mark.e2e
def test_ctrl_c_stops_the_runner_before_the_harness_exits(tmp_path, children):
    run, runner = _hanging_run(tmp_path, children)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=20)
    assert run.returncode == 130, out
    assert "interrupted: the runner was stopped" in out
    assert processes_with(runner) == []


@pytest.mark.e2e
def test_sigkill_of_the_harness_leaves_no_orphan_runner(tmp_path, children):
    run, runner = _hanging_run(tmp_path, children)
    run.kill()
    run.wait()
    assert wait_for(lambda: processes_with(runner) == [], 10), processes_with(runner)


def test_a_runner_breaking_the_protocol_stops_the_run_naming_the_file(project, tmp_path):
    script = tmp_path / "liar.py"
    script.write_text(
        "import json, sys\n"
        "results = sys.argv[sys.argv.index('--results') + 1]\n"
        "with open(results, 'a') as out:\n"
        "    out.write(json.dumps({'event': 'init', 'outcome': 'ready', 'wall_s': 0}) + '\\n')\n"
        "    out.write(json.dumps({'event': 'request', 'id': 'someone-else', 'outcome': 'ok',"
        " 'wall_s': 0, 'fixture': 'sim-t2i', 'seed': 2301}) + '\\n')\n")
    hosts = project.hosts_file.read_text().replace(
        'offline_command = ["{python}", "-m", "omniprobe.sim", "offline", "--hosts-file", '
        '"{hosts_file}", "--sim-host", "{host}"]', f'offline_command = ["{{python}}", "{script}"]')
    project.hosts_file.write_text(hosts)
    code, out = offline(project, "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-t2i")
    assert code == 5  # a harness error
    assert "results.jsonl: expected the result of 'sim-t2i-2301'" in out
    # It recorded nothing, so its attempt is gone: a re-run never resumes an empty one.
    assert not list((project.evidence_dir / "sim").glob("*/offline-requests.json"))


@pytest.mark.e2e
def test_a_runner_the_kernel_killed_for_host_ram_is_the_hosts_failure(tmp_path, monkeypatch):
    """Issue 23 item 5: the runner is SIGKILLed in request 2 with the host's available memory
    low in the sampler's last readings: the record's cause is the host's RAM."""
    import threading
    import time

    from omniprobe.harness.common import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "available_mib", lambda: 250.0)
    project = make_project(tmp_path, seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    add_to_hosts(project, "", command_extra='"--fault", "hang@2"')
    marker = f"{project.hosts_file} --sim-host sim --fault hang@2"

    def kill_the_runner_in_request_2():
        assert wait_for(lambda: any('"event": "request"' in p.read_text() for p in
                                    project.artifacts_dir.glob("sim/*/*/runner-1/results.jsonl")),
                        30)
        time.sleep(0.5)  # request 2 hangs in the runner
        for pid, _ in processes_with(marker):
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_runner_in_request_2)
    killer.start()
    code, out = offline(project, "--kwarg-set", "sim-offline-fp8", "--fixture", "sim-t2i",
                        "--request-timeout", "60")
    killer.join()
    lost = the_attempt(project).offline_requests[1]
    assert (lost.seed, lost.outcome, lost.cause.kind) == (2302, "error", "host"), out
    assert lost.cause.reason.endswith("with the host's available memory at 250 MiB in the "
                                      "sampler's last readings")
    assert not processes_with(str(tmp_path))


def test_a_runner_killed_at_init_with_the_host_short_of_ram_is_the_hosts_init_failure(
        tmp_path, monkeypatch):
    from omniprobe.harness.common import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "available_mib", lambda: 180.0)
    project = make_project(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    hosts = project.hosts_file.read_text()
    sim_offline = '["{python}", "-m", "omniprobe.sim", "offline", '
    assert sim_offline in hosts
    project.hosts_file.write_text(hosts.replace(sim_offline, (
        '["{python}", "-c", "import os, signal, time; time.sleep(1); '
        'os.kill(os.getpid(), signal.SIGKILL)", '), 1))
    code, out = offline(project, "--kwarg-set", "sim-offline-bf16", "--fixture", "sim-t2i")
    [run] = the_attempt(project).offline
    assert (run.init_failed, run.init.cause.kind) == ("init-error", "host"), out
    assert "with the host's available memory at 180 MiB" in run.init.cause.reason
    assert code == 0, out  # the host's answer settles the kwarg set


def test_a_runner_that_does_not_answer_versions_in_time_is_named_with_the_limit(tmp_path):
    """--versions imports torch and diffusers: slow on a loaded machine, so the limit is generous
    (VERSIONS_TIMEOUT_S) and a runner past it is a broken environment naming the limit."""
    from omniprobe.harness.offline.matrix import VERSIONS_TIMEOUT_S, RunnerEnvBroken, runner_facts

    assert VERSIONS_TIMEOUT_S >= 600  # 120 s timed out under a loaded test run
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    with pytest.raises(RunnerEnvBroken, match=r"did not answer --versions within 0.2 s"):
        runner_facts(slow, {}, timeout_s=0.2)
