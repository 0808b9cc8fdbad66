"""Harness overhead per request against the sim with zero model time, for a 1248x832 PNG.

Runs probe-serve's own request path (send, hash the bytes, decode once for the pixel hash and the
structure gate's image metrics, save the image, validate and atomically rewrite requests.json) and
subtracts the time the sim reports spending on the request itself (model, image, encoding).
Target: under 20 ms a request.

    PYTHONPATH=src python3 benchmarks/harness_overhead.py [REQUESTS]
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
from machine import describe

from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env.serve_command import server_command
from omniprobe.env.simulated import sim_env_digest
from omniprobe.evidence.attempts import open_probe_attempt
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.harness.common.process import free_port
from omniprobe.harness.common.progress import Progress
from omniprobe.harness.serve import probe as probe_module
from omniprobe.harness.serve.plan import ServeSettings
from omniprobe.harness.serve.probe import ServeProbe

REPO = Path(__file__).resolve().parent.parent
FIXTURE = "sim-pair"  # two references, 1248x832 output


class RecordingSession(requests.Session):
    """Keeps the last answer's sim_handle_ms, read after the timed path."""

    last_handle_ms: float = 0.0

    def post(self, *args, **kwargs):
        response = super().post(*args, **kwargs)
        self.last_handle_ms = json.loads(response.content).get("sim_handle_ms", 0.0)
        return response


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(count: int) -> None:
    machine = describe()  # before the run: the load average is the machine's, not ours
    root = Path(tempfile.mkdtemp(prefix="omniprobe-bench-"))
    shutil.copy(REPO / "hosts.toml", root / "hosts.toml")
    shutil.copytree(REPO / "fixtures", root / "fixtures")
    os.environ["OMNIPROBE_SIM_TIME_SCALE"] = "0"
    # The sim imports what this process imports: keep the caller's PYTHONPATH, src first.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    project = Project(root)
    cfg, suite = load_hosts(project.hosts_file), load_fixtures(project.fixtures_file)
    fixture = suite.get(FIXTURE)
    port = free_port()
    environment = AttemptEnvironment(digest=sim_env_digest(),
                                     served=ServedModel(model="Qwen/Qwen-Image-2.1", source="simulated"))
    store, _ = open_probe_attempt(project, "sim", cfg.host("sim"), ["benchmark"],
                                  environment=environment, fresh=True, fresh_id=None,
                                  complete=lambda _: False)
    options = ServeSettings(port=port, model="Qwen/Qwen-Image-2.1", ready_timeout_s=60,
                           request_timeout_s=60, grace_s=5)
    probe = ServeProbe(cfg, suite, project.fixtures_file.parent, project.hosts_file, "sim", store,
                  options, out=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the run
    session = RecordingSession()
    probe.http = session
    sent: list[float] = []
    original_send = probe_module.client.send

    def timed_send(*args, **kwargs):
        started = time.perf_counter()
        reply = original_send(*args, **kwargs)
        sent.append(time.perf_counter() - started)
        return reply

    probe_module.client.send = timed_send
    recorded: list[float] = []
    original_record = probe._record

    def timed_record(*args):
        started = time.perf_counter()
        original_record(*args)
        recorded.append(time.perf_counter() - started)

    probe._record = timed_record
    command = server_command(cfg, "sim", "cpuoff", port=port, model=options.model,
                             hosts_file=project.hosts_file)
    paths, handles = [], []
    try:
        with probe.lifetime("cpuoff", "probe-serve", command) as live:
            if live.init.outcome != "ready":
                raise SystemExit(f"the simulated server did not start: init {live.init.outcome}: "
                                 f"{live.init.note} (its log: {live.server.log_path})")
            progress = Progress(3 + count, io.StringIO())  # the per-request lines, unprinted
            for seed in range(3):  # warm-up: imports, connection, caches
                assert probe._request(live, "cpuoff", fixture, seed, progress, "warm-up")
            probe.recorder.drain()
            sent.clear()
            recorded.clear()
            batch_wall, batch_cpu = time.perf_counter(), time.process_time()
            for seed in range(100, 100 + count):
                started = time.perf_counter()
                assert probe._request(live, "cpuoff", fixture, seed, progress, "batch")
                paths.append(time.perf_counter() - started)
                handles.append(session.last_handle_ms / 1000)
            probe.recorder.drain()  # the batch is done when its last record is written
            batch_wall = time.perf_counter() - batch_wall
            batch_cpu = time.process_time() - batch_cpu
    finally:
        probe_module.client.send = original_send
        probe.recorder.close()
        store.close()
    assert all(r.outcome == "ok" and r.structure == "sound" for r in store.requests)
    per_request = batch_wall / count - statistics.mean(handles)
    size = len(Path(project.artifacts_dir / store.requests[-1].artifact).read_bytes())

    def ms(values: list[float]) -> str:
        return (f"median {1000 * statistics.median(values):6.1f} ms, "
                f"p90 {1000 * percentile(values, 0.9):6.1f} ms")

    print(f"harness overhead per request, {count} requests of {FIXTURE} "
          f"({fixture.width}x{fixture.height} PNG, {size / 1024:.0f} KiB), sim model time 0")
    print(machine)
    print(f"  harness overhead         {1000 * per_request:6.1f} ms a request  (target < 20 ms)"
          "\n    = batch wall time / requests - the sim's own handling, records all written")
    print(f"  sim's own handling       {ms(handles)}")
    print(f"  request path             {ms(paths)}  (send, checks, hand-off)")
    print(f"    HTTP + JSON + base64   {ms([s - h for s, h in zip(sent, handles, strict=True)])}")
    print(f"  recorder, overlapped     {ms(recorded)}  (decode, pixel hash, metrics, image, record)")
    print(f"  harness CPU              {1000 * batch_cpu / count:6.1f} ms a request "
          "(all harness threads)")
    shutil.rmtree(root)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
