"""On a real NVIDIA GPU: the torch-backed sim, PyTorch's own OOM text, and the NVML sampler.

Run from the repository root with only python3, torch (CUDA build), pydantic, requests, numpy,
pillow, nvidia-ml-py and pytest installed:

    PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu.py -s -rA

Each test prints what it measured, for the closing note of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from omniprobe.analysis.capacity_curve import capacity_curve
from omniprobe.analysis.verdicts import host_verdict
from omniprobe.classify.oom import parse_oom
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.env.serve_command import server_command, server_env
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.emulation import EmulationGuard, capped_processes, emulation_env
from omniprobe.harness.common.process import Endpoints, SupervisedProcess
from omniprobe.harness.common.sampler import MIB, NvmlReader, Sampler
from omniprobe.harness.serve import client
from omniprobe.sim.model import Flags, request_peak_mib, resident_mib

from .conftest import in_process, probe_argv

try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    CUDA = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="CUDA is absent: needs an NVIDIA GPU and torch built with CUDA")]

CAP_GIB = 24


def _run(project, argv: list[str]) -> int:
    """`omniprobe ARGV` in process, as the CLI runs it; its output printed, its exit code."""
    code, out = in_process(project, argv)
    print(out)
    return code


def _nvml_index() -> int:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def test_torch_sim_four_reference_oom_and_the_sampler_matches_its_account(project, port,
                                                                          monkeypatch):
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "1")  # keep each modelled state >= 250 ms
    cfg = load_hosts(project.hosts_file)
    suite = load_fixtures(project.fixtures_file)
    command = server_command(cfg, "sim", "cpuoff", port=port, model="Qwen/Qwen-Image-2.1",
                             hosts_file=project.hosts_file)
    command += ["--torch", "--torch-cap-gib", str(CAP_GIB)]
    url = f"http://127.0.0.1:{port}"
    server = SupervisedProcess(command, server_env(cfg, "cpuoff", dict(os.environ)),
                           project.root / "server.log", Endpoints(url), grace_s=10)
    replies = {}
    with server:
        sampler = Sampler(NvmlReader(_nvml_index()), project.root / "timeline.jsonl", hz=10,
                          root_pid=lambda: server.pid, t0=server.started)
        with sampler:
            init = server.wait_ready(600, 0.25)
            assert init.outcome == "ready", server.log_path.read_text()[-3000:]
            for fixture in ("sim-three", "sim-four", "sim-single"):
                replies[fixture] = client.send(url, suite.get(fixture), 2301, suite.sampling,
                                               project.fixtures_file.parent, 300)
                time.sleep(0.5)
        summary = sampler.summary()
    log = server.log_path.read_text()
    accounts = [json.loads(line.split("sim account: ", 1)[1])
                for line in log.splitlines() if line.startswith("sim account: {")]
    four = replies["sim-four"]
    print(f"\nfour-reference reply: {four.outcome}, HTTP {four.status}\n{four.error}")
    print(f"sampler: {summary.samples} samples at {summary.rate_hz} Hz, server peak "
          f"{summary.peak_mib} MiB ({summary.peak_source}) at {summary.peak_t_s} s; "
          f"sim account: {accounts[-1]}")

    assert replies["sim-three"].outcome == "ok"
    assert four.outcome == "oom" and four.status == 500
    assert "CUDA out of memory. Tried to allocate 1.50 GiB." in four.error
    assert four.oom.allowed == f"{CAP_GIB}.00 GiB" and four.oom.requested == "1.50 GiB"
    assert four.oom.allocated is not None and four.oom.total_capacity is not None
    logged = parse_oom(log, "request", tuple(cfg.host("sim").model_code))
    assert "torch.OutOfMemoryError" in log or "torch.cuda.OutOfMemoryError" in log
    assert logged.location.file == "omniprobe/sim/model.py"
    assert logged.location.function == "image_mlp"
    assert replies["sim-single"].outcome == "ok"  # the server stays up after the OOM

    held = accounts[-1]["held_mib"]
    assert accounts[-1]["backend"] == "torch" and accounts[-1]["context_mib"] > 0
    assert summary.peak_source == "process"
    assert abs(summary.peak_mib - held) <= 0.02 * held, (summary.peak_mib, held)


def test_sampler_catches_a_200_ms_spike_at_10_hz(tmp_path):
    torch.zeros(1, device="cuda")  # this process's CUDA context first, outside the spike
    sampler = Sampler(NvmlReader(_nvml_index()), tmp_path / "spike.jsonl", hz=10,
                      root_pid=os.getpid)
    with sampler:
        time.sleep(0.6)
        spike = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.synchronize()
        time.sleep(0.2)
        del spike
        torch.cuda.empty_cache()
        time.sleep(0.6)
    baseline = min(s.process_mib for s in sampler.samples if s.process_mib is not None)
    peak = sampler.summary().peak_mib
    print(f"\nspike: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB, "
          f"{len(sampler.samples)} samples at {sampler.summary().rate_hz} Hz")
    assert peak - baseline >= 0.98 * 4096
    assert sum(s.process_mib is not None and s.process_mib - baseline > 4000
               for s in sampler.samples) <= 3  # it was a spike, not a plateau


def test_process_memory_counts_each_pid_once_on_a_real_device():
    torch.zeros(1, device="cuda")
    reader = NvmlReader(_nvml_index())
    compute, graphics = reader.processes()
    mine = [p for p in compute + graphics if p.pid == os.getpid()]
    assert mine, "NVML does not list this process (container pid namespace?)"
    used, total = reader.memory()
    assert 0 < mine[0].used <= used <= total
    print(f"\nthis process: {mine[0].used / MIB:.0f} MiB of {total / MIB:.0f} MiB")


# --- capacity emulation (issue 13): the torch-backed sim through the emulated 24 GiB host ------

EMULATED = "sim-on-h200"


def _emulated_attempts(project):
    loaded, problems = load_project(project)
    assert problems == [], problems
    return loaded, loaded.evidence.for_host(EMULATED, include_simulated=True, include_emulated=True)


def test_an_emulated_24_gib_host_caps_the_torch_sim_in_pytorchs_own_oom(project, port,
                                                                       monkeypatch):
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "1")  # keep each modelled state >= 250 ms
    cap_mib = load_hosts(project.hosts_file).emulated_cap_mib(EMULATED)
    args = probe_argv("probe-serve", port, "--host", EMULATED, "--flag-set", "cpuoff",
                      "--gpu-index", str(_nvml_index()))
    code = _run(project, args)
    loaded, [attempt] = _emulated_attempts(project)
    prov = attempt.meta.provenance
    [run] = attempt.runs
    [life] = run.lifetimes
    check = life.timeline.emulation
    # by reference count: the default fixtures are the seed's stand-ins (or the sim's, if named)
    requests = {loaded.fixtures.get(r.fixture).reference_count: r for r in attempt.requests}
    four = requests[4]
    print(f"\nprovenance: {prov.kind}, cap {prov.cap_mib} MiB on {prov.physical_gpu} "
          f"(sm {prov.physical_compute_capability}), mechanism {prov.mechanism}")
    print(f"hook: {[c.model_dump() for c in check.capped]}")
    print(f"tree peak {check.peak_mib} MiB of the {check.cap_mib} MiB cap over "
          f"{check.checked_samples} samples ({check.unchecked_samples} unchecked); "
          f"breach {check.breach}")
    print(f"four references: {four.outcome}: {four.error}")
    print({f: (r.outcome, r.structure) for f, r in requests.items()})

    assert code == 0  # an OOM reply is a result: the server stayed up and every request ran
    assert (prov.kind, prov.cap_mib, prov.mechanism) == ("emulated", cap_mib, "memory-fraction")
    # the cap reached the server process: the hook capped it, measuring its CUDA context
    [capped] = check.capped
    assert 0 < capped.context_mib < 2048
    assert capped.allowed_mib == pytest.approx(cap_mib - capped.context_mib, abs=0.2)
    # the four-reference request OOMs with PyTorch's own text and the cap's figure
    assert four.outcome == "oom"
    assert "CUDA out of memory. Tried to allocate 1.50 GiB." in four.error
    assert four.oom.allowed == f"{capped.allowed_mib / 1024:.2f} GiB"
    assert four.oom.requested == "1.50 GiB"
    # three references fit, with sound output; the tree never went over the cap
    assert (requests[3].outcome, requests[3].structure) == ("ok", "sound")
    assert requests[1].outcome == "ok"
    assert check.breach is None and check.unchecked_samples == 0
    assert check.peak_mib <= cap_mib
    assert check.peak_mib > cap_mib - 2048  # it came close: the cap, not the card, stopped it
    verdict = host_verdict(EMULATED, loaded.hosts, loaded.fixtures, loaded.evidence)
    assert verdict.highest_served_refs == 3 and verdict.blocker == "capacity"


_OUTSIDE_PYTORCH = """
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
status = cuda.cuMemAlloc_v2(ctypes.byref(ptr), int(sys.argv[1]) * 1024**2)
print("cuMemAlloc", sys.argv[1], "MiB:", status, flush=True)
time.sleep(1.5)
"""


def test_a_process_allocating_outside_pytorch_past_the_cap_is_caught(project):
    cfg = load_hosts(project.hosts_file)
    cap_mib = cfg.emulated_cap_mib(EMULATED)
    env = {**os.environ, **emulation_env(cfg.host(EMULATED), cap_mib, dict(os.environ))}
    over_mib = cap_mib + 1024
    server = SupervisedProcess([sys.executable, "-c", _OUTSIDE_PYTORCH, str(over_mib)], env,
                           project.root / "outside.log", None, grace_s=5)
    guard = EmulationGuard(cap_mib)
    with server:
        sampler = Sampler(NvmlReader(_nvml_index()), project.root / "outside.jsonl", hz=10,
                          root_pid=lambda: server.pid, t0=server.started, guard=guard)
        with sampler:
            code = server.wait_exit(60)
    log = server.log_path.read_text()
    check = guard.check(capped_processes(log))
    print(f"\n{log.strip()}\nguard: {check}")
    assert code == 0 and "cuMemAlloc" in log and f"{over_mib} MiB: 0" in log
    assert check.capped == []  # no PyTorch in it: the hook had nothing to cap
    assert check.breach is not None and check.breach.held_mib > cap_mib
    assert check.breach.cap_mib == cap_mib and check.breach.t_s > 0


def test_a_sweep_gives_the_capacity_models_curve_on_a_real_gpu(project, port):
    caps_gib = (16, 20, 24, 32)
    args = probe_argv("probe-serve", port, "--host", EMULATED, "--flag-set", "cpuoff",
                      "--caps", ",".join(map(str, caps_gib)), "--gpu-index", str(_nvml_index()))
    _run(project, args)
    loaded, attempts = _emulated_attempts(project)
    curve = capacity_curve(EMULATED, loaded.hosts, loaded.fixtures, loaded.evidence)
    model = loaded.hosts.host(EMULATED).capacity
    flags = Flags("bf16", cpu_offload=True, layerwise=False)
    rows = []
    for attempt in sorted(attempts, key=lambda a: a.meta.provenance.cap_mib):
        cap_mib = attempt.meta.provenance.cap_mib
        [run] = attempt.runs
        check = run.lifetimes[-1].timeline.emulation
        # the model's prediction with this process's own context, as the hook measured it
        allowed = check.capped[0].allowed_mib if check.capped else cap_mib - model.context_mib
        predicted = (max((r for r in range(5) if request_peak_mib(model, flags, r) <= allowed),
                         default=0) if resident_mib(model, flags) <= allowed else 0)
        measured = curve.max_served("cpuoff", cap_mib)
        rows.append((cap_mib, run.init.outcome, measured, predicted, check.peak_mib,
                     check.breach))
    print("\ncap MiB | init | served | model | tree peak MiB | breach")
    for row in rows:
        print(" | ".join(str(v) for v in row))
    print("minimum cap per reference count:",
          {r: curve.min_cap("cpuoff", r) for r in curve.reference_counts})
    assert len(rows) == len(caps_gib) >= 3
    for cap_mib, _init, measured, predicted, peak, breach in rows:
        assert abs(measured - predicted) <= 1, (cap_mib, measured, predicted)
        assert breach is None and (peak is None or peak <= cap_mib)
    assert [m for _, _, m, _, _, _ in rows] == sorted(m for _, _, m, _, _, _ in rows)


_PLAIN_TORCH = """
import json, sys, torch
torch.zeros(1, device="cuda")
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(int(sys.argv[1]) * 1024**2, dtype=torch.uint8, device="cuda")
    oom = None
except torch.cuda.OutOfMemoryError as exc:
    oom = str(exc)
print(json.dumps({"free": free, "total": total, "oom": oom}))
"""


def test_the_hook_makes_any_torch_process_see_and_hit_the_emulated_card(project):
    cfg = load_hosts(project.hosts_file)
    cap_mib = cfg.emulated_cap_mib(EMULATED)
    env = {**os.environ, **emulation_env(cfg.host(EMULATED), cap_mib, dict(os.environ))}
    proc = subprocess.run([sys.executable, "-c", _PLAIN_TORCH, str(cap_mib)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    [capped] = capped_processes(proc.stderr)
    print(f"\nmem_get_info: free {seen['free'] / MIB:.0f} MiB of {seen['total'] / MIB:.0f} MiB; "
          f"hook: {capped}; a {cap_mib} MiB tensor: {seen['oom'][:160]}")
    assert seen["total"] == cap_mib * MIB
    assert seen["free"] <= (cap_mib - capped.context_mib) * MIB
    assert "CUDA out of memory" in seen["oom"]
    assert f"{capped.allowed_mib / 1024:.2f} GiB allowed" in seen["oom"]
