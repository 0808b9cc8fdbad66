"""Which probe attempt a session writes, and the one line it says before it starts."""

from __future__ import annotations

import pytest

from omniprobe import __version__
from omniprobe.evidence.attempts import resume_decision
from omniprobe.evidence.models.attempt import Attempt, AttemptEnvironment, ServedModel
from omniprobe.harness.common.plan import Pace, estimate, plan_line

SIM = ServedModel(model="Qwen/Qwen-Image-2.1", source="simulated")
HERE = AttemptEnvironment(digest="a" * 64, served=SIM)
RUN = {"tool_version": __version__, "command": ["omniprobe"], "started_at": "2026-11-30T10:00:00Z"}


def attempt(environment=HERE, kind="simulated", version=__version__) -> Attempt:
    provenance = {
        "simulated": {"kind": "simulated", **RUN, "tool_version": version, "model": "sim"},
        "transcribed": {"kind": "transcribed", "source": {"name": "seed.txt"}, "section": "x"},
    }[kind]
    return Attempt(id="old", host="sim", date="2026-11-30", description="d",
                   provenance=provenance, environment=environment)


DECISIONS = [
    # the newest attempt, complete? -> resume?, why
    (None, False, False, "new: no earlier probe attempt of this host"),
    (attempt(), False, True, "resumed: old is incomplete, made in this environment"),
    (attempt(), True, True, "complete: old holds every cell asked for"),
    (attempt(HERE.model_copy(update={"digest": "b" * 64})), False, False,
     "new: old ran in another environment (env digest bbbbbbbbbbbb, this one aaaaaaaaaaaa)"),
    (attempt(version="0.0.1"), False, False,
     f"new: old was made by omniprobe 0.0.1, this is {__version__}"),
    (attempt(HERE.model_copy(update={"served": ServedModel(model="/m", source="by_hand")})),
     False, False, "new: old served another model (/m, this one Qwen/Qwen-Image-2.1)"),
    # An attempt under the emulated host's RAM cap is never resumed by one without it.
    (attempt(HERE.model_copy(update={"host_ram_cap_mib": 30720})), False, False,
     "new: old ran with host RAM capped at 30,720 MiB, this one not capped"),
    (attempt(None), False, False,
     "new: old does not record its environment (made before attempts did)"),
    (attempt(None, kind="transcribed"), False, False, "new: old is transcribed, never resumed"),
]


@pytest.mark.parametrize(("newest", "complete", "resume", "why"), DECISIONS)
def test_resume_decision(newest, complete, resume, why):
    assert resume_decision(newest, HERE, complete=complete) == (resume, why)


ESTIMATES = [
    (Pace(None, None, 0), 2, 8, "no estimate (no earlier attempt of this host measured it)"),
    (Pace(30.0, None, 1), 2, 0, "about 60 s at the pace of this host's 1 earlier attempt(s)"),
    (Pace(30.0, None, 1), 2, 8, "no estimate (no earlier attempt of this host measured it)"),
    (Pace(60.0, 40.0, 2), 2, 16, "about 13 min at the pace of this host's 2 earlier attempt(s)"),
    (Pace(60.0, 40.0, 2), 10, 400, "about 4.6 h at the pace of this host's 2 earlier attempt(s)"),
    (Pace(None, None, 0), 0, 0, "nothing to run"),
]


@pytest.mark.parametrize(("pace", "starts", "requests", "text"), ESTIMATES)
def test_estimate(pace, starts, requests, text):
    assert estimate(pace, starts, requests) == text


def test_plan_line_names_host_attempt_shape_cells_and_time():
    line = plan_line("probe-serve", "sim", "A", "new: --fresh", flag_sets=2, fixtures=3, seeds=4,
                     recorded=0, to_run=24, time="about 2 min", rerun_command="nox -s x -- --fresh")
    assert line == ("probe-serve on sim: attempt A (new: --fresh); 2 flag set(s) x 3 fixture(s) "
                    "x 4 seed(s): 0 already recorded, 24 to run; about 2 min")
    done = plan_line("probe-init", "sim", "A", "complete: A holds every cell asked for",
                     flag_sets=5, fixtures=0, seeds=0, recorded=5, to_run=0,
                     time="nothing to run", rerun_command="nox -s env-sim probe-init -- --fresh")
    assert done.endswith("5 flag set(s): 5 already recorded, 0 to run; nothing to run; to "
                         "measure again: nox -s env-sim probe-init -- --fresh")


def test_a_flag_set_the_run_refuses_asks_nothing_of_the_attempt(project, port):
    """A flag set whose deploy config's content the source does not give is refused on every run,
    so an attempt that settled every other flag set is complete (a real 3090 attempt never read
    complete while cpuoff-fp8v stood in its plan)."""
    from .conftest import in_process, probe_argv

    with open(project.hosts_file, "a") as handle:
        handle.write('\n[flag_sets.sim-unknown-deploy]\ndescription = "a deploy config whose '
                     'content is not given"\nargs = ["--enable-cpu-offload"]\n'
                     'deploy_config = "deploy-fp8v"\n')
    text = project.hosts_file.read_text().replace(
        'serve_flag_sets = ["default", "cpuoff", "cpuoff-layerwise", "fp8", "sim-cpuoff-kvfp8v"]',
        'serve_flag_sets = ["default", "cpuoff", "cpuoff-layerwise", "fp8", "sim-cpuoff-kvfp8v", '
        '"sim-unknown-deploy"]', 1)
    project.hosts_file.write_text(text)
    args = ("--flag-set", "cpuoff", "--flag-set", "sim-unknown-deploy", "--fixture", "sim-t2i")
    code, out = in_process(project, probe_argv("probe-serve", port, *args))
    assert code == 0 and "refused: flag set 'sim-unknown-deploy'" in out, out
    code, out = in_process(project, probe_argv("probe-serve", port, *args))
    assert "complete: " in out, out
