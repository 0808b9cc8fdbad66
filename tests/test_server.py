"""Server lifecycle against the simulated server: ready, init failures, timeout, port, stop."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from omniprobe.classify.imaging import decode_pixels, pixels_sha256
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.digests import sha256_bytes
from omniprobe.env.serve_command import (
    FlagSetNotRunnable,
    NotInEnv,
    in_env,
    server_command,
    server_env,
)
from omniprobe.harness.common.process import QUICK_POLL_S, Endpoints, PortInUse, SupervisedProcess
from omniprobe.harness.serve import client

from .conftest import processes_with, wait_for


def start(project, port, flag_set="cpuoff", *extra, ready_path=None, env=None):
    """A not yet started server lifetime; `with` starts it."""
    cfg = load_hosts(project.hosts_file)
    command = server_command(cfg, "sim", flag_set, port=port, model="Qwen/Qwen-Image-2.1",
                             hosts_file=project.hosts_file) + list(extra)
    return SupervisedProcess(command, server_env(cfg, flag_set, {**os.environ, **(env or {})}),
                         project.root / "logs" / f"{flag_set}.log",
                         Endpoints(f"http://127.0.0.1:{port}", "/health", ready_path),
                         grace_s=2, model_code=tuple(cfg.host("sim").model_code))


def test_command_and_environment(project):
    cfg = load_hosts(project.hosts_file)
    command = server_command(cfg, "sim", "fp8", port=9, model="M", hosts_file=Path("/h.toml"))
    assert command[1:] == ["-m", "omniprobe.sim", "serve", "M", "--omni", "--hosts-file",
                           "/h.toml", "--sim-host", "sim", "--host", "127.0.0.1", "--port", "9",
                           "--enforce-eager", "--served-model-name", "Qwen/Qwen-Image-2.1",
                           "--enable-cpu-offload", "--quantization", "fp8"]
    real = server_command(cfg, "rtx3090", "cpuoff", port=8091, model="M",
                          hosts_file=Path("/h.toml"))
    assert real[:5] == ["vllm", "serve", "M", "--omni", "--host"]
    env = server_env(cfg, "cpuoff-expandable", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def fake_vllm(bin_dir: Path, project, marker: Path) -> Path:
    """A `vllm` that notes how it was started, then is the sim (the sim host's capacity model)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "vllm"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$0 offline=$HF_HUB_OFFLINE path-vllm=$(command -v vllm)" > "{marker}"\n'
        f'exec "{sys.executable}" -m omniprobe.sim "$@" --hosts-file "{project.hosts_file}" '
        "--sim-host sim\n")
    script.chmod(0o755)
    return script


def test_the_program_resolves_in_the_env_bin_and_nowhere_else(tmp_path):
    bin_dir = tmp_path / "venv" / "bin"
    with pytest.raises(NotInEnv, match=f"'vllm' is not in the probe env: {bin_dir}/vllm is missing"):
        in_env("vllm", bin_dir)
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    with pytest.raises(NotInEnv, match="missing or not executable"):
        in_env("vllm", bin_dir)
    (bin_dir / "vllm").chmod(0o755)
    assert in_env("vllm", bin_dir) == str(bin_dir / "vllm")
    assert in_env("/usr/bin/python3", bin_dir) == "/usr/bin/python3"
    assert in_env("vllm", None) == "vllm"


def test_a_real_hosts_server_runs_from_its_env(project, port, tmp_path):
    cfg = load_hosts(project.hosts_file)
    bin_dir, marker = tmp_path / "env" / "bin", tmp_path / "started-as"
    script = fake_vllm(bin_dir, project, marker)
    command = server_command(cfg, "rtx3090", "cpuoff", port=port, model="Qwen/Qwen-Image-2.1",
                             hosts_file=project.hosts_file, bin_dir=bin_dir)
    assert command[:4] == [str(script), "serve", "Qwen/Qwen-Image-2.1", "--omni"]
    env = server_env(cfg, "cpuoff", {**os.environ, "PATH": "/usr/bin:/bin"}, bin_dir)
    assert env["PATH"] == f"{bin_dir}:/usr/bin:/bin" and env["VIRTUAL_ENV"] == str(bin_dir.parent)
    with SupervisedProcess(command, env, tmp_path / "server.log",
                       Endpoints(f"http://127.0.0.1:{port}"), grace_s=2) as server:
        assert server.wait_ready(20, 0.05).outcome == "ready"
    assert marker.read_text().split() == [str(script), "offline=1", f"path-vllm={script}"]


def test_deploy_config_of_unknown_content_is_refused(project):
    cfg = load_hosts(project.hosts_file)
    with pytest.raises(FlagSetNotRunnable, match="deploy/deploy-fp8v.yaml, whose content"):
        server_command(cfg, "rtx3090", "cpuoff-fp8v", port=1, model="M",
                       hosts_file=project.hosts_file)


def test_ready_then_stopped_with_its_whole_group(project, port):
    with start(project, port, ready_path="/ready") as server:
        init = server.wait_ready(20, 0.05)
        assert init.outcome == "ready" and init.time_s < 20
        assert processes_with(str(project.root))
    assert server.ended == "stopped"
    assert wait_for(lambda: not processes_with(str(project.root)), 5)


def test_oom_at_init_is_classified_with_its_signature(project, port):
    with start(project, port, "default") as server:
        init = server.wait_ready(20, 0.05)
    assert init.outcome == "oom"
    assert init.oom.phase == "init" and init.oom.requested == "96.00 MiB"
    assert init.oom.location.file == "omniprobe/sim/model.py"
    assert init.oom.location.function == "init_parameters"
    assert server.ended == "exited 1"


def test_other_init_failure_is_an_error_with_the_reason(project, port):
    with start(project, port, "cpuoff", "--quantization", "awq") as server:
        init = server.wait_ready(20, 0.05)
    assert init.outcome == "error"
    assert "exited 2" in init.note and "'awq' is not in the capacity model" in init.note


def test_init_timeout_and_the_slow_server_is_killed(project, port):
    with start(project, port, env={"OMNIPROBE_SIM_TIME_SCALE": "1000"}) as server:
        init = server.wait_ready(1.0, 0.1)
        assert init.outcome == "timeout" and init.note == "not ready after 1 s"
    assert server.ended == "stopped"
    assert wait_for(lambda: not processes_with(str(project.root)), 5)


def test_port_in_use_is_a_clear_error(project, port):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is already in use"):
            start(project, port).start()
    assert not processes_with(str(project.root))


def test_request_oom_leaves_the_server_serving(project, port):
    suite = load_fixtures(project.fixtures_file)
    fixtures_dir = project.fixtures_file.parent
    url = f"http://127.0.0.1:{port}"
    with start(project, port) as server:
        assert server.wait_ready(20, 0.05).outcome == "ready"
        four = client.send(url, suite.get("sim-four"), 2301, suite.sampling, fixtures_dir, 30)
        single = client.send(url, suite.get("sim-single"), 2301, suite.sampling, fixtures_dir, 30)
        assert server.returncode() is None
    assert four.outcome == "oom" and four.status == 500
    assert four.oom.requested == "1.50 GiB" and four.oom.total_capacity == "24.00 GiB"
    assert single.outcome == "ok" and single.server_peak_mb == 18944
    assert single.denoise_step_latency_ms is not None
    assert pixels_sha256(decode_pixels(single.image, "single")) != sha256_bytes(single.image)


def test_readiness_is_polled_often_at_first_then_every_poll_s(project, port, monkeypatch):
    delays = []
    sleep = time.sleep

    def recorded(seconds):
        delays.append(round(seconds, 3))
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded)
    quits = [sys.executable, "-c", "import time; time.sleep(2)"]  # never serves, then exits
    with SupervisedProcess(quits, dict(os.environ), project.root / "quits.log",
                       Endpoints(f"http://127.0.0.1:{port}"), grace_s=1) as server:
        init = server.wait_ready(20, 0.25)
    assert init.outcome == "error" and init.note == "exited 0 before it was ready"
    # every 20 ms for the first second, then doubling up to poll_s
    quick = [d for d in delays if d == QUICK_POLL_S]
    assert 20 <= len(quick) <= 55 and delays[:len(quick)] == quick
    assert delays[len(quick):len(quick) + 4] == [0.04, 0.08, 0.16, 0.25]
