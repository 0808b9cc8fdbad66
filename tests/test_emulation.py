"""Capacity emulation without a GPU: the hook's arithmetic and installation, the breach guard on a
scripted series, emulated hosts in hosts.toml, and a capacity sweep on the simulated host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from omniprobe.analysis.capacity_curve import capacity_curve
from omniprobe.analysis.verdicts import host_verdict
from omniprobe.classify.series import Sample
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.env.simulated import check_sim_env
from omniprobe.errors import InputError, Refusal
from omniprobe.evidence.load import load_evidence
from omniprobe.evidence.migrations import content_key
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.emulation import (
    HOOK_DIR,
    EmulationGuard,
    capped_processes,
    emulation_env,
    parse_caps_gib,
)
from omniprobe.harness.common.sampler import MIB, NvmlReader, Sampler
from omniprobe_engine.emulation_site.sitecustomize import (
    CAP_ENV,
    EmulationError,
    allocator_fraction,
    cap_from_env,
    capped_mem_info,
    process_bytes,
)

from .conftest import hosts_written, in_process, probe_argv
from .env_scaffold import FakeNvml as GpuOnly
from .fakenvml import FakeNvml, Frame

GIB = 1024**3


def _run(project, argv: list[str]) -> int:
    """`omniprobe ARGV` in process, as the CLI runs it; its output printed, its exit code."""
    code, out = in_process(project, argv)
    print(out)
    return code


@pytest.mark.parametrize(("cap", "context", "total", "allowed"), [
    (24 * GIB, 512 * MIB, 140 * GIB, 24 * GIB - 512 * MIB),
    (16 * GIB, 0, 80 * GIB, 16 * GIB),
    (24 * GIB, 24 * GIB - 1, 24 * GIB, 1),  # a cap as large as the card still leaves a byte
])
def test_the_fraction_leaves_the_allocator_the_cap_less_the_context(cap, context, total, allowed):
    fraction = allocator_fraction(cap, context, total)
    assert 0 < fraction <= 1
    assert fraction * total == pytest.approx(allowed, abs=1)


@pytest.mark.parametrize(("cap", "context", "total", "message"), [
    (200 * GIB, 0, 140 * GIB, "exceeds the device"),
    (1 * GIB, 1 * GIB, 140 * GIB, "already fills the cap"),
    (0, 0, 140 * GIB, "expected a positive cap"),
    (1 * GIB, -1, 140 * GIB, "expected a positive cap"),
])
def test_a_cap_that_cannot_be_honoured_is_refused(cap, context, total, message):
    with pytest.raises(EmulationError, match=message):
        allocator_fraction(cap, context, total)


@pytest.mark.parametrize(("free", "reserved", "expected_free"), [
    (130 * GIB, 2 * GIB, 24 * GIB - 512 * MIB - 2 * GIB),  # the cap's room, not the H200's
    (10 * GIB, 2 * GIB, 10 * GIB),                           # never more than is really free
    (130 * GIB, 24 * GIB, 0),
])
def test_free_memory_is_reported_as_on_the_emulated_card(free, reserved, expected_free):
    assert capped_mem_info(free, 140 * GIB, 24 * GIB, 512 * MIB, reserved) == (expected_free,
                                                                              24 * GIB)


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("24576", 24576 * MIB)])
def test_the_cap_comes_from_the_environment(value, expected):
    assert cap_from_env({} if value is None else {CAP_ENV: value}) == expected


@pytest.mark.parametrize("value", ["24g", "0", "-5", ""])
def test_a_bad_cap_in_the_environment_is_refused(value):
    with pytest.raises(EmulationError, match=CAP_ENV):
        cap_from_env({CAP_ENV: value})


def test_the_context_is_this_process_memory_counted_once():
    pid = 4242
    nvml = FakeNvml([Frame(0, 30 * GIB, compute=((pid, 500 * MIB), (7, GIB)),
                           graphics=((pid, 500 * MIB),))])
    assert process_bytes(pid, nvml) == 500 * MIB
    with pytest.raises(EmulationError, match="does not list process 99"):
        process_bytes(99, nvml)


def _run_with_hook(tmp_path, code: str, cap: str | None = "24576") -> subprocess.CompletedProcess:
    """A fresh interpreter with the hook first on PYTHONPATH and a stand-in `torch` package."""
    fake = tmp_path / "fake"
    (fake / "torch" / "cuda").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("__version__ = 'fake'\nfrom torch import cuda\n")
    (fake / "torch" / "cuda" / "__init__.py").write_text(textwrap.dedent("""
        queued = []
        def _lazy_call(fn):
            queued.append(fn.__module__ + "." + fn.__name__)
    """))
    env = {k: v for k, v in os.environ.items() if k != CAP_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), str(fake), str(tmp_path)])
    if cap is not None:
        env[CAP_ENV] = cap
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_hook_queues_the_cap_when_the_server_imports_torch(tmp_path):
    proc = _run_with_hook(tmp_path, "import sys; print('torch' in sys.modules); import torch; "
                                    "print(torch.cuda.queued)")
    assert proc.returncode == 0, proc.stderr
    # torch is not imported by the hook itself; importing it queues the cap for the first CUDA use
    assert proc.stdout.split() == ["False", "['sitecustomize.cap_this_process']"]


def test_the_hook_is_inert_without_a_cap_and_runs_the_sitecustomize_it_shadows(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.SHADOWED = True\n")
    proc = _run_with_hook(tmp_path, "import torch, builtins; "
                                    "print(torch.cuda.queued, builtins.SHADOWED)", cap=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]


def test_the_hook_stops_a_server_with_a_bad_cap_rather_than_run_it_uncapped(tmp_path):
    proc = _run_with_hook(tmp_path, "pass", cap="lots")
    assert proc.returncode != 0 and f"{CAP_ENV} must be a positive whole number" in proc.stderr


def test_the_server_env_carries_the_cap_and_the_hook(project):
    cfg = load_hosts(project.hosts_file)
    env = emulation_env(cfg.host("sim-on-h200"), 24576, {"PYTHONPATH": "/elsewhere"})
    assert env == {CAP_ENV: "24576", "PYTHONPATH": f"{HOOK_DIR}{os.pathsep}/elsewhere"}
    # the sim-account mechanism needs no hook: the simulated server takes the cap itself
    assert emulation_env(cfg.host("sim-emulated"), 16384, {}) == {CAP_ENV: "16384"}


def test_capped_processes_are_read_from_the_hook_lines():
    log = ("INFO start\nomniprobe-emulation: pid 311 device 0 cap_mib 24576.0 context_mib 518.0 "
           "allowed_mib 24058.0 fraction 0.171000 total_mib 143771.0\n")
    [capped] = capped_processes(log)
    assert (capped.pid, capped.context_mib, capped.allowed_mib) == (311, 518.0, 24058.0)


def test_the_guard_records_the_first_sample_over_the_cap(tmp_path):
    me = os.getpid()
    nvml = FakeNvml([Frame(0.0, 21 * GIB, compute=((me, 20 * GIB),)),
                     Frame(0.3, 25 * GIB, compute=((me, 23 * GIB), (7, GIB)),
                           graphics=((me, 23 * GIB),)),
                     Frame(0.5, 26 * GIB, compute=((me, 24 * GIB + 300 * MIB),)),
                     Frame(0.8, 21 * GIB, compute=((me, 20 * GIB),))], total=140 * GIB)
    guard = EmulationGuard(24 * 1024)
    sampler = Sampler(NvmlReader(nvml=nvml), tmp_path / "t.jsonl", hz=50, root_pid=os.getpid,
                      guard=guard)
    with sampler:
        import time
        time.sleep(1.1)
    check = guard.check()
    assert check.breach is not None
    assert check.breach.held_mib == 24 * 1024 + 300 and check.breach.cap_mib == 24 * 1024
    assert 0.45 <= check.breach.t_s <= 0.8
    assert check.peak_mib == 24 * 1024 + 300
    assert check.checked_samples == len(sampler.samples) and check.unchecked_samples == 0
    assert guard.breach_by(check.breach.t_s - 0.01) is None
    assert guard.breach_by(check.breach.t_s) == check.breach


@pytest.mark.parametrize(("idle", "device", "breached", "unchecked"), [
    (1024.0, 25 * 1024.0 + 1, True, 0),   # the device over its first idle reading stands in
    (1024.0, 25 * 1024.0, False, 0),
    (None, 99 * 1024.0, False, 1),        # no figure at all: counted, never guessed
])
def test_without_per_process_figures_the_device_over_its_idle_reading_stands_in(idle, device,
                                                                                breached, unchecked):
    guard = EmulationGuard(24 * 1024, idle)
    guard.observe(Sample(t_s=1.0, device_mib=device, process_mib=None))
    assert (guard.breach is not None) == breached
    assert guard.check().unchecked_samples == unchecked


def test_caps_are_parsed_in_gib():
    assert parse_caps_gib("24,12,16,16,20.5") == [12288, 16384, 20992, 24576]
    with pytest.raises(ValueError, match="'x'"):
        parse_caps_gib("12,x")
    for tiny_or_huge in ("0", "0.0001", "1025", "nan", "inf"):
        with pytest.raises(ValueError, match=r"from 1 MiB \(0\.001\) up to 1024 GiB"):
            parse_caps_gib(tiny_or_huge)
    assert parse_caps_gib("0.001,1024") == [1, 1024 * 1024]


def test_an_emulated_host_takes_the_matrix_of_the_host_it_emulates(repo):
    cfg = load_hosts(repo.hosts_file)
    emulated, real = cfg.host("rtx3090-on-h200"), cfg.host("rtx3090")
    assert emulated.serve_flag_sets == real.serve_flag_sets
    assert emulated.offline_kwarg_sets == real.offline_kwarg_sets
    assert cfg.emulated_cap_mib("rtx3090-on-h200") == 24 * 1024
    assert (emulated.gpu, emulated.compute_capability) == ("NVIDIA H200", "9.0")
    sim = cfg.host("sim-on-h200")
    assert sim.simulated and sim.capacity == cfg.host("sim").capacity
    assert cfg.emulated_cap_mib("sim-on-h200") == cfg.host("sim").capacity.vram_mib
    assert cfg.emulated_cap_mib("rtx3090") is None


@pytest.mark.parametrize(("table", "message"), [
    ('emulates = "rtx4090"\nmechanism = "memory-fraction"', "'rtx4090' is not defined"),
    ('emulates = "sim-on-h200"\nmechanism = "memory-fraction"', "is itself emulated"),
    ('mechanism = "memory-fraction"', "names the host it emulates"),
    ('emulates = "rtx3090"\nmechanism = "sim-account"', "needs a simulated server"),
    ('emulates = "rtx3090"\nmechanism = "mps"', "mechanism"),
])
def test_a_bad_emulation_table_is_refused_naming_it(tmp_path, repo, table, message):
    text = repo.hosts_file.read_text()
    text += ('\n[hosts.bad]\nkind = "omni"\nname = "b"\nhostname = "h"\ngpu = "NVIDIA H200"\n'
             'compute_capability = "9.0"\nvram_gb = 141\npython_provider = "p"\n'
             f'\n[hosts.bad.emulation]\n{table}\n')
    with pytest.raises(InputError) as caught:
        load_hosts(hosts_written(tmp_path, text))
    assert any("bad" in p.path + p.message and message in str(p) for p in caught.value.problems), \
        caught.value.problems


def test_caps_on_a_host_that_is_not_emulated_are_refused(project, port, capsys):
    code, out = in_process(project, probe_argv("probe-serve", port, "--caps", "16,24"))
    assert code == Refusal.exit_code and "host 'sim' is not emulated" in out
    assert not (project.evidence_dir / "sim").exists()


@pytest.mark.e2e
def test_a_sweep_gives_the_capacity_models_curve_and_validates(project, port):
    # The simulated fixtures: one to four small references (the stand-ins' are 1248x832).
    fixtures = [a for f in ("sim-single", "sim-pair", "sim-three", "sim-four") for a in ("--fixture", f)]
    args = probe_argv("probe-serve", port, "--host", "sim-emulated", "--caps", "12,16,20,24,32",
                      "--flag-set", "cpuoff", "--flag-set", "fp8", *fixtures)
    # The 12 GiB cap cannot even init cpuoff: the card's answer, so the sweep exits 0 (issue 23).
    assert _run(project, args) == 0
    loaded, problems = load_project(project)
    assert problems == []
    attempts = loaded.evidence.for_host("sim-emulated", include_simulated=True,
                                        include_emulated=True)
    assert sorted(a.meta.provenance.cap_mib for a in attempts) == [12288, 16384, 20480, 24576,
                                                                   32768]
    assert all(a.id.endswith(f"-{a.meta.provenance.cap_mib}mib-probe") for a in attempts)
    curve = capacity_curve("sim-emulated", loaded.hosts, loaded.fixtures, loaded.evidence)
    # the capacity model: cpuoff peaks at 16,896 + 2,048 MiB per reference, plus a 512 MiB context
    assert [curve.min_cap("cpuoff", r) for r in (1, 2, 3, 4)] == [20480, 24576, 24576, 32768]
    assert [curve.max_served("cpuoff", c) for c in curve.caps_mib] == [0, 0, 1, 3, 4]
    # fp8 fits four references from 16 GiB, but its outputs collapse: no cap serves it soundly
    assert [curve.min_cap("fp8", r) for r in (1, 2, 3, 4)] == [None] * 4
    twelve = next(a for a in attempts if a.meta.provenance.cap_mib == 12288)
    assert {r.flag_set: r.init.outcome for r in twelve.runs} == {"cpuoff": "oom", "fp8": "ready"}
    # a re-run resumes each cap's attempt: nothing is left to do, nothing new is created
    assert _run(project, args) == 0
    assert len(load_evidence(project.evidence_dir)[0].attempts) == len(attempts)


def test_emulated_evidence_never_counts_for_the_host_it_emulates(project, port):
    args = probe_argv("probe-serve", port, "--host", "sim-emulated", "--flag-set", "cpuoff",
                      "--fixture", "sim-three")
    assert _run(project, args) == 0
    loaded, problems = load_project(project)
    assert problems == []
    emulated = host_verdict("sim-emulated", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert emulated.highest_served_refs == 3 and len(emulated.attempts) == 1
    assert host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence).attempts == ()
    # filed under the emulated host's own name: moved under the real one, validation objects and
    # the real host's verdict still does not take it
    [folder] = (project.evidence_dir / "sim-emulated").iterdir()
    target = project.evidence_dir / "sim" / folder.name
    target.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(target)
    meta = target / "attempt.json"
    meta.write_text(meta.read_text().replace('"host": "sim-emulated"', '"host": "sim"', 1))
    loaded, problems = load_project(project)
    assert any("not emulated" in p.message for p in problems), problems
    evidence = load_evidence(project.evidence_dir)[0]
    assert host_verdict("sim", loaded.hosts, load_fixtures(project.fixtures_file),
                        evidence).attempts == ()


@pytest.mark.parametrize(("gpu", "total_mib", "cc", "failed"), [
    ("NVIDIA H200", 143771, (9, 0), set()),
    ("NVIDIA GeForce RTX 3090", 24576, (8, 6),
     {"gpu.name", "gpu.compute_capability", "gpu.memory", "emulation.cap"}),
])
def test_the_emulated_sims_env_checks_its_physical_gpu_and_the_cap(project, gpu, total_mib, cc,
                                                                   failed):
    nvml = GpuOnly(name=gpu, memory_mib=total_mib, capability=cc)
    env = check_sim_env(load_hosts(project.hosts_file), project, "sim-on-h200", nvml=nvml)
    status = {c.name: c.status for c in env.checks}
    assert {name for name, s in status.items() if s == "fail"} == failed
    assert status["emulation.cap"] in ("pass", "fail") and status["gpu.name"] in ("pass", "fail")


def _emulated_and_real(project, port, *fixtures: str) -> None:
    """cpuoff on sim-emulated (at its own cap) and on the sim it emulates, the given fixtures."""
    picked = [arg for fixture in fixtures for arg in ("--fixture", fixture)]
    for host in ("sim-emulated", "sim"):
        args = probe_argv("probe-serve", port, "--host", host, "--flag-set", "cpuoff", *picked)
        assert _run(project, args) == 0


@pytest.mark.e2e
def test_cells_agree_until_the_emulated_capacity_differs(project, port):
    from omniprobe.analysis.emulation_compare import compare_cells

    _emulated_and_real(project, port, "sim-three", "sim-four")
    loaded, _ = load_project(project)
    pairs = compare_cells(loaded.hosts, "sim-emulated", loaded.fixtures, loaded.evidence)
    assert [(p.fixture, p.capacity_agrees, p.structure_agrees) for p in pairs] == [
        ("sim-three", True, True), ("sim-four", True, None)]
    # a 26 GiB emulation of the same card fits four references: that cell disagrees
    hosts = project.hosts_file.read_text().replace(
        'emulates = "sim"\nmechanism = "sim-account"',
        'emulates = "sim"\ncapacity_mib = 26624\nmechanism = "sim-account"')
    project.hosts_file.write_text(hosts)
    args = probe_argv("probe-serve", port, "--host", "sim-emulated", "--flag-set", "cpuoff",
                      "--fixture", "sim-three", "--fixture", "sim-four")
    assert _run(project, args) == 0
    loaded, _ = load_project(project)
    pairs = compare_cells(loaded.hosts, "sim-emulated", loaded.fixtures, loaded.evidence)
    assert [(p.fixture, p.capacity_agrees) for p in pairs] == [("sim-three", True),
                                                               ("sim-four", False)]


@pytest.mark.e2e
def test_the_report_shows_the_emulated_verdict_beside_the_real_one(project, port):
    import shutil

    from .conftest import REPO
    from .rendered import render_outputs

    _emulated_and_real(project, port, "sim-three", "sim-four")
    shutil.copytree(REPO / "templates", project.root / "templates")
    shutil.copytree(REPO / "schemas", project.root / "schemas")
    outputs = render_outputs(project)
    heading = f"## {load_hosts(project.hosts_file).host('sim-emulated').name}\n"
    report = outputs[next(p for p in outputs if p.name == "HARNESS.md")]
    section = report.split(heading, 1)[1]  # a simulated host's emulation: in HARNESS.md
    assert "| cpuoff | sim-three | 3 | OK" in section
    assert "| agree | agree |" in section and "**disagree**" not in section
    assert "The emulated card is simulated" in section
    # a breach recorded on the three-reference request: it no longer fits, and the cell says so
    [folder] = (project.evidence_dir / "sim-emulated").iterdir()
    data = json.loads((folder / "requests.json").read_text())
    three = next(r for r in data[content_key("requests.json")] if r["fixture"] == "sim-three")
    three["emulation_breach"] = {"t_s": 1.5, "held_mib": 24700.0, "cap_mib": 24576}
    (folder / "requests.json").write_text(json.dumps(data))
    loaded, problems = load_project(project)
    assert problems == []
    verdict = host_verdict("sim-emulated", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert verdict.highest_served_refs == 0
    outputs = render_outputs(project)
    section = outputs[next(p for p in outputs if p.name == "HARNESS.md")].split(heading, 1)[1]
    assert "**EMULATION BREACHED** (24,700 MiB held, cap 24,576 MiB)" in section
    assert "| cpuoff | sim-three | 3 |" in section and "**disagree**" in section


@pytest.mark.parametrize(("card_cc", "physical_cc", "kernels_match", "fp8_differs"), [
    ("8.6", "9.0", False, True),    # the 3090 on an H200: Marlin W8A16 against native FP8
    ("12.0", "9.0", False, False),  # both take native FP8, other kernels still differ
    ("9.0", "9.0", True, False),
])
def test_the_caveat_follows_the_compute_capabilities(repo, tmp_path, card_cc, physical_cc,
                                                     kernels_match, fp8_differs):
    from omniprobe.analysis.emulation_compare import quantizes_fp8, transfer_caveat

    text = repo.hosts_file.read_text().replace(
        'compute_capability = "8.6"', f'compute_capability = "{card_cc}"', 1)
    text = text.replace('gpu = "NVIDIA H200"\ncompute_capability = "9.0"',
                        f'gpu = "NVIDIA H200"\ncompute_capability = "{physical_cc}"', 1)
    cfg = load_hosts(hosts_written(tmp_path, text))
    caveat = transfer_caveat(cfg, "rtx3090-on-h200")
    assert (caveat.kernels_match, caveat.fp8_path_differs) == (kernels_match, fp8_differs)
    assert ("Marlin" in caveat.text) == fp8_differs
    assert ("capacity transfers" in caveat.text) == (not kernels_match)
    assert quantizes_fp8(cfg, "fp8") and not quantizes_fp8(cfg, "cpuoff")


def test_the_curve_svg_is_deterministic_and_follows_the_curve():
    from omniprobe.analysis.capacity_curve import CapacityCurve, CapRun, CurveStep
    from omniprobe.report.capacity_svg import render_curve_svg

    def curve(min_cap: int | None) -> CapacityCurve:
        runs = (CapRun(20480, "cpuoff", "a", True, (1, 2), (1,)),
                CapRun(24576, "cpuoff", "b", True, (1, 2), (1, 2) if min_cap else (1,)))
        steps = (CurveStep("cpuoff", 1, 20480, 24576), CurveStep("cpuoff", 2, min_cap, 24576))
        return CapacityCurve("h", (20480, 24576), ("cpuoff",), (1, 2), runs, steps)

    served, unserved = render_curve_svg(curve(24576), title="t"), render_curve_svg(curve(None),
                                                                                   title="t")
    assert served == render_curve_svg(curve(24576), title="t")
    assert served.count("<circle") == 3 and unserved.count("<circle") == 2  # and the key's dot
    assert ">20–24</text>" in served and ">&gt; 24</text>" in unserved


@pytest.mark.e2e
def test_server_starts_are_compared_flag_set_by_flag_set(project, port):
    from omniprobe.analysis.emulation_compare import compare_inits

    for host in ("sim-emulated", "sim"):
        args = probe_argv("probe-init", port, "--host", host, "--flag-set", "default")
        _run(project, args)
    loaded, _ = load_project(project)
    [pair] = compare_inits(loaded.hosts, "sim-emulated", loaded.evidence)
    assert (pair.flag_set, pair.emulated.outcome, pair.real.outcome, pair.agrees) == (
        "default", "oom", "oom", True)
    # emulating a 32 GiB card, the default flags start where the 24 GiB card's do not
    project.hosts_file.write_text(project.hosts_file.read_text().replace(
        'emulates = "sim"\nmechanism = "sim-account"',
        'emulates = "sim"\ncapacity_mib = 32768\nmechanism = "sim-account"'))
    args = probe_argv("probe-init", port, "--host", "sim-emulated", "--flag-set", "default")
    assert _run(project, args) == 0
    loaded, _ = load_project(project)
    [pair] = compare_inits(loaded.hosts, "sim-emulated", loaded.evidence)
    assert (pair.emulated.outcome, pair.real.outcome, pair.agrees) == ("ready", "oom", False)


@pytest.mark.e2e
def test_fresh_starts_one_attempt_per_cap_shared_by_the_sessions_of_a_run(project, port,
                                                                          monkeypatch):
    args = ("--host", "sim-emulated", "--caps", "24,32", "--flag-set", "cpuoff", "--fixture",
            "sim-single", "--fresh")
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-1")
    for session in ("probe-init", "probe-serve"):
        assert _run(project, probe_argv(session, port, *args)) == 0
    folders = sorted(p.name for p in (project.evidence_dir / "sim-emulated").iterdir())
    assert [name.split("-sim-emulated-")[1] for name in folders] == ["24576mib-probe",
                                                                     "32768mib-probe"]
    monkeypatch.setenv("OMNIPROBE_INVOCATION", "nox-run-2")
    assert _run(project, probe_argv("probe-serve", port, *args)) == 0
    assert len(list((project.evidence_dir / "sim-emulated").iterdir())) == 4


# probe-offline caps its runner like the server (tests/test_diffusers.py holds it).
@pytest.mark.parametrize("session", ["propagation"])
def test_sessions_that_cannot_cap_refuse_an_emulated_host(project, port, session):
    extra = ["--port", str(port)] if session == "propagation" else []
    code, out = in_process(project, [session, "--host", "sim-emulated", *extra])
    assert code == Refusal.exit_code and "is emulated" in out, out
    assert not (project.evidence_dir / "sim-emulated").exists()


def test_the_guard_sees_the_requests_memory_as_the_server_reports_it(project, port):
    """The sampler reads the sim's accounted memory while requests run, as NVML shows a real
    server's: the guard's tree peak is at least the server's own request peak."""
    import shutil

    from .conftest import REPO
    from .rendered import render_harness

    args = probe_argv("probe-serve", port, "--host", "sim-emulated", "--flag-set", "cpuoff",
                      "--fixture", "sim-three")
    assert _run(project, args) == 0
    loaded, problems = load_project(project)
    assert problems == []
    [attempt] = [a for a in loaded.evidence.attempts if a.host == "sim-emulated"]
    [run] = attempt.runs
    guard = run.lifetimes[0].timeline.emulation
    request_peak = max(r.server_peak_mb for r in attempt.requests)
    assert guard.peak_mib >= request_peak > 20000
    shutil.copytree(REPO / "templates", project.templates_dir)
    shutil.copytree(REPO / "schemas", project.root / "schemas")
    harness = render_harness(project)
    assert "The guard did not watch the requests" not in harness
    # a guard that never rose to the requests' peak is called out
    folder = project.evidence_dir / "sim-emulated" / attempt.id
    data = json.loads((folder / "runs.json").read_text())
    data[content_key("runs.json")][0]["lifetimes"][0]["timeline"]["emulation"]["peak_mib"] = 14848
    (folder / "runs.json").write_text(json.dumps(data))
    assert "**The guard did not watch the requests** of cpuoff" in render_harness(project)
