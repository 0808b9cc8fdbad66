"""The propagation check against the simulated server: a knob that arrives, one the simulated
config bridge drops, one that cannot be measured, and the refusals."""

from __future__ import annotations

import json
import shutil

import pytest

from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common import logs
from omniprobe.sim import knobs as sim_knobs
from omniprobe.sim.knobs import BRIDGE_ENV

from .conftest import REPO, in_process, processes_with
from .rendered import render_harness


def check(project, port, *extra, host="sim"):
    return in_process(project, ["propagation", "--host", host, "--port", str(port),
                                "--grace", "2", *extra])


def the_attempt(project, host="sim"):
    [folder] = sorted((project.evidence_dir / host).iterdir())
    attempt, problems = load_attempt(folder)
    assert problems == []
    return attempt


def test_a_knob_the_bridge_honours_reaches_the_model(project, port, tmp_path):
    code, out = check(project, port)
    assert code == 0, out
    attempt = the_attempt(project)
    assert attempt.id.endswith("-sim-propagation") and attempt.simulated
    [result] = attempt.propagation
    assert (result.flag_set_with, result.flag_set_without) == ("sim-cpuoff-kvfp8v", "cpuoff")
    # By default the host's own default fixtures: on the sim as on a real host, the stand-ins.
    assert (result.knob, result.fixture, result.seed) == (
        "extras.prefix_kv_cache_dtype", "standin-single", 2301)
    assert result.bytes_identical is False and result.pixels_identical is False
    assert result.reached_model is True
    served = {r.flag_set: r for r in attempt.requests}
    assert set(served) == {"cpuoff", "sim-cpuoff-kvfp8v"}
    assert all(r.outcome == "ok" and r.seed == 2301 and r.inputs == "stand-in"
               for r in served.values())
    assert "extras.prefix_kv_cache_dtype reached the model" in out
    assert result.deploy_config_ignored is False
    _, problems = load_project(project)
    assert problems == []
    assert not processes_with(str(tmp_path))


@pytest.mark.e2e
def test_a_knob_the_bridge_drops_leaves_identical_outputs(project, port, monkeypatch):
    monkeypatch.setenv(BRIDGE_ENV, "drop")
    code, out = check(project, port, "--seed", "7")
    assert code == 0, out
    attempt = the_attempt(project)
    [result] = attempt.propagation
    assert result.bytes_identical is True and result.pixels_identical is True
    assert result.reached_model is False and result.seed == 7
    assert "did NOT reach the model: the outputs are byte-identical" in out
    with_run = next(r for r in attempt.runs if r.flag_set == "sim-cpuoff-kvfp8v")
    log = (project.artifacts_dir / with_run.lifetimes[0].log.path).read_text()
    assert "the simulated config bridge drops them" in log


@pytest.mark.e2e
def test_a_deploy_config_upstream_ignores_is_recorded_from_its_warning_line(project, port,
                                                                          monkeypatch):
    monkeypatch.setenv(BRIDGE_ENV, "ignore")
    code, out = check(project, port)
    assert code == 0, out
    attempt = the_attempt(project)
    [result] = attempt.propagation
    assert result.deploy_config_ignored is True and result.reached_model is False
    assert result.bytes_identical is True
    assert "the server logged that upstream ignored the deploy config" in out
    assert ("warning: [sim-cpuoff-kvfp8v] the server logged 'No registered PipelineConfig "
            "resolved for model': its --deploy-config was ignored") in out
    ignored = {r.flag_set: r.lifetimes[0].deploy_config_ignored for r in attempt.runs}
    assert ignored == {"sim-cpuoff-kvfp8v": True, "cpuoff": None}  # cpuoff passes no config
    assert load_project(project)[1] == []
    shutil.copytree(REPO / "templates", project.root / "templates")
    report = render_harness(project)
    assert "carries upstream's warning that it ignored the deploy config" in report
    assert "sim-cpuoff-kvfp8v ran as cpuoff" in report
    assert (f"sim-cpuoff-kvfp8v ({attempt.id}): the server's log carries upstream's warning "
            "that it ignored the deploy config") in report
    assert f"cpuoff ({attempt.id}): the server's log" not in report


def test_the_sim_warns_in_upstreams_words():
    assert sim_knobs.DEPLOY_IGNORED_WARNING == logs.DEPLOY_IGNORED_WARNING
    assert logs.deploy_config_ignored(
        f"WARNING 11-30 10:00:00 [resolver.py:88] {logs.DEPLOY_IGNORED_WARNING} Qwen/Qwen-Image")
    assert not logs.deploy_config_ignored("INFO: stage extras parsed")


@pytest.mark.e2e
def test_outputs_that_never_came_are_not_measured(project, port):
    code, out = check(project, port, "--fixture", "sim-four")
    assert code == 0, out  # both cells are measured: an OOM is a result (issue 23)
    assert out.rstrip().endswith("implied by its flag set's init failure on record)")
    [result] = the_attempt(project).propagation
    assert result.bytes_identical is None and result.reached_model is None
    assert "not measured" in result.note and "cpuoff: request oom" in result.note
    assert "sim-cpuoff-kvfp8v: request oom" in result.note


@pytest.mark.parametrize(("host", "extra", "message"), [
    ("rtx3090", [], "flag set 'cpuoff-fp8v' needs deploy/deploy-fp8v.yaml, whose content the "
                    "source does not give ([deploy_configs.deploy-fp8v] content_known = false)"),
    ("sim", ["--with", "cpuoff"], "flag set 'cpuoff' passes no deploy config"),
    ("sim", ["--with", "int8"], "flag set 'int8' is not run on host 'sim'"),
    ("sim", ["--without", "sim-cpuoff-kvfp8v"], "pass the same deploy config 'sim-kvfp8v'"),
    ("sim", ["--fixture", "single-reference"],
     "fixture 'single-reference' cannot run: its source does not state prompt, width, height, "
     "references"),
    ("sim", ["--fixture", "nope"], "unknown fixture(s) nope"),
    ("rtx5080", [], "host 'rtx5080' has 0 flag sets with a deploy config (none)"),
])
def test_refusals_leave_no_evidence(project, port, host, extra, message):
    code, out = check(project, port, *extra, host=host)
    assert code == 3 and message in out, out
    assert not project.evidence_dir.exists() or not any(project.evidence_dir.iterdir())


def test_a_missing_deploy_file_is_refused(project, port):
    (project.root / "deploy" / "sim-kvfp8v.yaml").unlink()
    code, out = check(project, port)
    assert code == 3 and "deploy/sim-kvfp8v.yaml, which does not exist" in out


def test_the_knob_comes_from_hosts_toml_or_the_command_line(project, port):
    hosts = project.hosts_file.read_text()
    project.hosts_file.write_text(hosts.replace(
        'content_known = true\nknob = "extras.prefix_kv_cache_dtype"\n', "content_known = true\n"))
    code, out = check(project, port)
    assert code == 3
    assert "set 'knob' under [deploy_configs.sim-kvfp8v] in hosts.toml, or pass --knob" in out
    code, out = check(project, port, "--knob", "the kv dtype")
    assert code == 0, out
    assert the_attempt(project).propagation[0].knob == "the kv dtype"


@pytest.mark.e2e
def test_a_fixture_that_cannot_run_is_refused_and_passed_over_by_default(project, port):
    suite = json.loads(project.fixtures_file.read_text())
    next(f for f in suite["fixtures"] if f["id"] == "standin-single")["prompt"] = None
    project.fixtures_file.write_text(json.dumps(suite))
    code, out = check(project, port, "--fixture", "standin-single")
    assert code == 3
    assert "fixture 'standin-single' cannot run: its source does not state prompt" in out
    assert check(project, port)[0] == 0
    assert the_attempt(project).propagation[0].fixture == "standin-pair"
