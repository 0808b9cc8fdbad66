"""The bounds an attempt's figures must lie within, and where each comes from (issue 24)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from omniprobe.evidence.consistency import memory_bound
from omniprobe.evidence.models.attempt import Attempt, AttemptEnvironment, ServedModel
from omniprobe.evidence.validate import load_project, load_valid_project

from .evidence_scaffold import add_attempt

PROBE = "2026-11-30T095416Z-sim-probe"
EVIDENCE = Path(__file__).resolve().parent.parent / "evidence"
EMULATED = next((EVIDENCE / "sim-emulated").glob("*-32768mib-probe")).name
ON_H200 = next((EVIDENCE / "sim-on-h200").glob("*-32768mib-probe")).name


@pytest.mark.parametrize(("attempt_id", "mib", "source"), [
    ("seed-3090-1-serve-matrix", 24 * 1024, "vram_gb 24 of hosts.toml, read as GiB"),
    ("seed-5080-1-init-matrix", 16 * 1024, "vram_gb 16 of hosts.toml, read as GiB"),
    (PROBE, 24576, "the simulated card's [capacity] vram_mib"),
    (EMULATED, 32768, "the emulated cap the simulated account took as its total"),
    (ON_H200, 141 * 1024, "vram_gb 141 of hosts.toml, read as GiB"),  # the physical GPU's
])
def test_the_gpu_memory_an_attempt_is_bounded_by(repo, attempt_id, mib, source):
    loaded = load_valid_project(repo)
    attempt = loaded.evidence.attempt(attempt_id)
    bounds = memory_bound(attempt, loaded.hosts.hosts[attempt.host], loaded.evidence)
    assert (bounds.memory_mib, bounds.memory_source) == (mib, source)


def _manifest_attempt(repo_copy, memory_total_mib: int) -> str:
    """An env attempt of rtx3090 whose manifest records NVML's total."""
    folder = add_attempt(repo_copy, "rtx3090", "2026-11-30T080000Z-rtx3090-env")
    manifest = {
        "host": "rtx3090", "action": "built", "venv": "/v", "pins_hash": "0" * 64,
        "python": {"pinned": "3.13"},
        "host_facts": {"hostname": "h", "platform": "linux", "machine": "x86_64",
                       "gpu": {"index": 0, "device_count": 1, "name": "NVIDIA GeForce RTX 3090",
                               "memory_total_mib": memory_total_mib, "compute_capability": "8.6",
                               "driver_version": "580"}},
        "model_snapshot": "Qwen/Qwen-Image-2.1@790c9263", "pins": [], "freeze": [],
        "checks": [{"name": "x", "status": "pass", "detail": "d"}],
        "timings": {"total_s": 1, "verify_s": 1}}
    (folder / "environment.json").write_text(json.dumps(manifest))
    return folder.name


def test_nvml_s_total_in_the_env_manifest_bounds_a_probe_attempt(repo_copy):
    manifest = _manifest_attempt(repo_copy, 24000)
    loaded = load_valid_project(repo_copy)
    attempt = loaded.evidence.attempt("seed-3090-1-serve-matrix")
    env = AttemptEnvironment(manifest=manifest, digest="0" * 64,
                             served=ServedModel(model="m", source="by_hand"))
    probed = replace(attempt, meta=Attempt.model_validate(
        {**attempt.meta.model_dump(), "environment": env.model_dump()}))
    bounds = memory_bound(probed, loaded.hosts.hosts["rtx3090"], loaded.evidence)
    assert (bounds.memory_mib, bounds.memory_source) == (
        24000, f"NVML's total in manifest {manifest}")


@pytest.mark.parametrize(("peak", "valid"), [(24137, True), (24576, True), (24577, False)])
def test_a_3090_peak_is_bounded_by_24_gib_not_24e9_bytes(repo_copy, peak, valid):
    """The seed's 3090 reached 24,137 MiB: a bound of 24x10^9 bytes (22,888 MiB) would refuse it."""
    add_attempt(repo_copy, "rtx3090", "peaked", runs=[
        {"flag_set": "cpuoff", "init": {"outcome": "ready"}, "gpu_peak_mib": peak}])
    problems = [str(p) for p in load_project(repo_copy)[1]]
    assert (problems == []) == valid, problems
    if not valid:
        assert problems == [f"{repo_copy.evidence_dir}/rtx3090/peaked/runs.json: "
                            "$.runs[0].gpu_peak_mib: 24,577.0 MiB exceeds the GPU's memory, "
                            "24,576 MiB (vram_gb 24 of hosts.toml, read as GiB)"]
