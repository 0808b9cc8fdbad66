"""A serve command that cannot start: the env preflight fails naming the cause; forced past it,
the probe records the cause, exits 4, and the host reads "not-measured", never "blocked at init"."""

from __future__ import annotations

import shutil

import pytest

from omniprobe.analysis.verdicts import host_verdict
from omniprobe.config.hosts import load_hosts
from omniprobe.env.simulated import check_sim_env
from omniprobe.env.state import Runner
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.validate import load_valid_project
from omniprobe.harness.common import probe_env

from .conftest import in_process, probe_argv
from .rendered import render_harness

SIM_COMMAND = ('serve_command = ["{python}", "-m", "omniprobe.sim", "serve", "{model}", "--omni", '
               '"--hosts-file", "{hosts_file}", "--sim-host", "{host}"]')

BROKEN = {
    "missing module": (SIM_COMMAND.replace("omniprobe.sim", "omniprobe.no_such_server"),
                       "serve.entry_point failed",
                       "import error: No module named 'omniprobe.no_such_server'"),
    "missing executable": (SIM_COMMAND.replace('"{python}", "-m", "omniprobe.sim", ',
                                               '"/nonexistent/bin/vllm", '),
                           "serve.command failed",
                           "command not found: /nonexistent/bin/vllm is missing"),
}


def break_hosts(project, key: str) -> None:
    text = project.hosts_file.read_text()
    if key == "unknown flag":
        old = 'args = ["--enable-cpu-offload", "--enable-layerwise-offload"]'
        assert old in text
        project.hosts_file.write_text(text.replace(old, old[:-1] + ', "--enable-layerwize"]'))
        return
    assert SIM_COMMAND in text
    project.hosts_file.write_text(text.replace(SIM_COMMAND, BROKEN[key][0]))


class CountingRunner(Runner):
    def __init__(self):
        super().__init__()
        self.commands: list[list[str]] = []

    def run(self, argv, **kwargs):
        self.commands.append(list(argv))
        return super().run(argv, **kwargs)


def test_the_sims_preflight_passes_as_committed(project):
    runner = CountingRunner()
    env = check_sim_env(load_hosts(project.hosts_file), project, "sim", runner=runner)
    assert env.ok, env.problems
    names = {c.name: c.status for c in env.checks}
    assert names["serve.command"] == names["serve.entry_point"] == "pass"
    flag_sets = load_hosts(project.hosts_file).host("sim").serve_flag_sets
    assert {n for n, s in names.items() if n.startswith("serve.args:") and s == "pass"} == {
        f"serve.args:{f}" for f in flag_sets}
    # Every parse ran the entry point, so no separate import was started for it.
    parses = [c for c in runner.commands if c[-1] == "--check-args"]
    assert len(parses) == len(flag_sets)
    assert not [c for c in runner.commands if c[1:2] == ["-c"] and "module" in c]


@pytest.mark.parametrize(("key", "check", "cause"), [
    ("missing module", *BROKEN["missing module"][1:]),
    ("missing executable", *BROKEN["missing executable"][1:]),
    ("unknown flag", "serve.args:cpuoff-layerwise failed",
     "argument error: unrecognized arguments: --enable-layerwize"),
])
def test_the_preflight_fails_naming_the_cause_and_the_probe_refuses(project, port, key, check,
                                                                     cause):
    break_hosts(project, key)
    env = check_sim_env(load_hosts(project.hosts_file), project, "sim", runner=Runner())
    assert [p for p in env.problems if p.startswith(check)], env.problems
    assert any(cause in p for p in env.problems), env.problems
    code, out = in_process(project, probe_argv("probe-init", port))
    assert code == 4, out
    assert check in out and cause in out
    assert not (project.evidence_dir / "sim").exists()  # refused before any attempt


@pytest.fixture
def sim_only(repo_copy, monkeypatch):
    """The committed project without its simulated hosts' evidence (the emulated sims' too, whose
    verdicts share the appendix), so the sim's verdict is the run's."""
    for name, host in load_hosts(repo_copy.hosts_file).hosts.items():
        if host.simulated:
            shutil.rmtree(repo_copy.evidence_dir / name, ignore_errors=True)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    monkeypatch.delenv("OMNIPROBE_ARTIFACTS", raising=False)
    return repo_copy


@pytest.mark.e2e
@pytest.mark.parametrize(("key", "cause"), [
    ("missing module", "import error: No module named"),
    ("missing executable", "command not found: /nonexistent/bin/vllm"),
    ("unknown flag", "argument error: unrecognized arguments: --enable-layerwize"),
])
def test_forced_past_the_preflight_the_probe_records_the_cause_and_the_card_is_not_measured(
        sim_only, port, monkeypatch, key, cause):
    break_hosts(sim_only, key)
    monkeypatch.setattr(probe_env, "sim_preflight", lambda *a, **k: [])
    flag_sets = ["--flag-set", "cpuoff-layerwise"] if key == "unknown flag" else []
    code, out = in_process(sim_only, probe_argv("probe-init", port, *flag_sets))
    assert code == 4, out
    assert "the card was not measured" in out and cause in out
    assert key != "missing module" or "omniprobe.no_such_server" in out
    [folder] = (sim_only.evidence_dir / "sim").iterdir()
    attempt, problems = load_attempt(folder)
    assert problems == []
    assert attempt.runs and all(r.init.outcome == "error" for r in attempt.runs)
    assert {(r.init.cause.kind, r.init.cause.reason[:len(cause)]) for r in attempt.runs} == {
        ("environment", cause)}

    loaded = load_valid_project(sim_only)
    verdict = host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert (verdict.verdict, verdict.blocker, verdict.blockers) == ("not-measured", None, ())
    assert {n.cause[:len(cause) + 13] for n in verdict.not_measured} == {f"environment: {cause}"}
    appendix = render_harness(sim_only)
    assert "**Simulated GPU (24 GB): not-measured.**" in appendix
    assert "blocked at init" not in appendix and "cannot initialize" not in appendix
    assert "### What failed outside the card — Simulated GPU" in appendix
    assert cause.split(":")[0] in appendix


def test_an_oom_at_init_is_still_blocked_at_init(sim_only, port):
    code, out = in_process(sim_only, probe_argv("probe-init", port, "--flag-set", "default"))
    assert code == 0, out
    [folder] = (sim_only.evidence_dir / "sim").iterdir()
    attempt, _ = load_attempt(folder)
    [run] = attempt.runs
    assert (run.init.outcome, run.init.cause.kind) == ("oom", "card")
    loaded = load_valid_project(sim_only)
    verdict = host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert (verdict.verdict, verdict.blocker, verdict.not_measured) == ("not-built", "init", ())
    appendix = render_harness(sim_only)
    assert ("**Simulated GPU (24 GB): not-built** — blocked at init: no flag set starts the server."
            in appendix)
    assert "What failed outside the card" not in appendix
