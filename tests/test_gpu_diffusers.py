"""On a real NVIDIA GPU: Qwen-Image-2.1 at full size with random weights through the Diffusers
engine, capped like a 16 GiB card, and the few-step peak against 20 steps.

Needs, beside test_gpu.py's packages, diffusers 0.42.1, transformers, accelerate and tokenizers
(the wheels of wheels/h200.txt on the GPU machine):

    PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_diffusers.py -s -rA

Each test prints what it measured, for the closing note of the run.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from omniprobe.evidence.validate import load_project

from .conftest import in_process, make_project

try:
    import torch

    CUDA = torch.cuda.is_available()
    import diffusers  # noqa: F401
except ImportError:
    CUDA = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="needs an NVIDIA GPU with torch built with CUDA, and diffusers")]

CAP_MIB = 16 * 1024


def test_under_a_16_gib_cap_the_random_weight_model_builds_fits_0_refs_ooms_at_4_and_goes_on(
        tmp_path, monkeypatch):
    project = make_project(tmp_path, size=(1248, 832))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    # The 3090's host RAM is not stated, so its host is not capped: the GPU cap alone, at 16 GiB.
    argv = ["probe-offline", "--host", "rtx3090-on-h200-diffusers", "--caps", "16",
            "--profile", "group-leaf", "--fixture", "standin-t2i", "--fixture", "standin-four",
            "--seed", "2301", "--seed", "2302", "--fresh"]
    code, out = in_process(project, argv)
    print(out)
    assert code == 0, out
    loaded, problems = load_project(project)
    assert problems == []
    [attempt] = loaded.evidence.for_host("rtx3090-on-h200-diffusers", include_emulated=True)
    assert attempt.meta.weights == "random" and attempt.meta.provenance.cap_mib == CAP_MIB
    records = attempt.offline_requests
    print(json.dumps([r.model_dump(exclude_none=True, exclude={"error"}) for r in records]))
    ok = [r for r in records if r.fixture == "standin-t2i"]
    oom = [r for r in records if r.fixture == "standin-four"]
    assert [r.outcome for r in ok] == ["ok", "ok"] and all(r.structure == "unchecked" for r in ok)
    assert all(r.peak_mib is not None and r.peak_mib < CAP_MIB for r in ok)
    assert [r.outcome for r in oom] == ["oom", "oom"]
    assert all(r.oom.allowed is not None and r.oom.requested is not None for r in oom)
    # One runner throughout: the pipeline survived its OOM and measured the next request, which
    # failed with the same ask at the same peak. (On the H200, leaf-level group offload kept
    # ~1.8 GiB on the GPU after the first OOM; the record's start_allocated_mib says so.)
    assert {r.lifetime for r in records} == {0}
    assert oom[1].oom.requested == oom[0].oom.requested
    assert oom[1].peak_mib == pytest.approx(oom[0].peak_mib, rel=0.01)
    [row, *_] = attempt.offline
    timeline = row.timelines[0]
    assert timeline.emulation is not None and timeline.emulation.capped
    # The fraction caps torch's pool at the cap less the CUDA context measured at startup; the
    # context grows as kernels load lazily, so an over-cap request can take the tree past the cap
    # (on the H200: 16,512 MiB, 128 MiB over, in the second OOM). Before it, nothing did.
    breach = timeline.emulation.breach
    assert breach is None or breach.t_s >= oom[0].started_s, breach
    assert row.build.build_peak_mib < CAP_MIB


def test_the_5080s_host_ram_cap_stops_leaf_offload_that_pins_the_whole_model(tmp_path,
                                                                             monkeypatch):
    """Leaf-level group offload with streams pins the bf16 model in host memory (the H200's
    runner held 36-43 GiB); under the 5080 host's 30 GiB cgroup the kernel kills it, and that is
    recorded as the host's failure, never a transport failure."""
    project = make_project(tmp_path, size=(1248, 832))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = in_process(project, ["probe-offline", "--host", "rtx5080-on-h200-diffusers",
                                     "--profile", "group-leaf", "--fixture", "standin-t2i",
                                     "--fresh"])
    print(out)
    loaded, problems = load_project(project)
    assert problems == []
    [attempt] = loaded.evidence.for_host("rtx5080-on-h200-diffusers", include_emulated=True)
    [run] = attempt.offline
    print(run.model_dump_json(exclude_none=True))
    causes = [c for c in [run.init.cause if run.init else None,
                          *(r.cause for r in attempt.offline_requests)] if c is not None]
    assert any(c.kind == "host" for c in causes), causes
    assert sum(h.oom_kills for h in run.host_ram) >= 1, run.host_ram
    assert run.host_ram and all(h.cap_mib == 30 * 1024 for h in run.host_ram), run.host_ram


def test_the_streamed_int8_build_stays_under_the_5080_hosts_30_gib_cap(tmp_path, monkeypatch):
    """The int8 DiT and text encoder, leaf offload without streams: quantised unit by unit as
    the build fills them, the build holds about the int8 model, not the 30.2 GiB of bf16 the
    whole-model build held, so the 5080's 30 GiB host builds it and its peaks are recorded."""
    project = make_project(tmp_path, size=(1248, 832))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = in_process(project, ["probe-offline", "--host", "rtx5080-on-h200-diffusers",
                                     "--profile", "int8-leaf-nostream-te8",
                                     "--fixture", "standin-t2i", "--fresh"])
    print(out)
    assert code == 0, out
    loaded, problems = load_project(project)
    assert problems == []
    [attempt] = loaded.evidence.for_host("rtx5080-on-h200-diffusers", include_emulated=True)
    [row] = attempt.offline
    build = row.build
    print(json.dumps(build.model_dump(exclude_none=True)))
    assert [h.oom_kills for h in row.host_ram] == [0]
    assert build.build_path == "random-streamed"
    assert build.build_host_peak_mib < 30 * 1024 and build.pinned_host_mib == 0
    [record] = attempt.offline_requests
    assert record.host_peak_mib is not None and record.pinned_host_peak_mib == 0


def _engine(profile: dict):
    from omniprobe.config.diffusers import load_model_configs
    from omniprobe.config.project import find_project
    from omniprobe_engine.diffusers_engine import DiffusersEngine

    configs = load_model_configs(find_project().root, "models/qwen-image-2.1/full")
    return DiffusersEngine("random", {"profile": {"pipeline": "QwenImage21Pipeline", **profile},
        "weights": {"kind": "random", "seed": 0, "components": configs.engine_components()}})


def _four_references(tmp_path) -> list[str]:
    """Four condition images of the output's size, noise, as files."""
    import numpy as np
    from PIL import Image

    refs = []
    for i in range(4):
        pixels = np.random.default_rng(i).integers(0, 255, (832, 1248, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"ref{i}.png")
        refs.append(str(tmp_path / f"ref{i}.png"))
    return refs


def test_two_steps_reach_the_20_step_peak_with_the_cache_on_and_off(tmp_path):
    """The capacity cells run two denoising steps: the peak comes at the first step (the cache's
    prefill) and the decode, so 20 steps reach no higher. Uncapped, so 4 references fit."""
    refs = _four_references(tmp_path)
    engine = _engine({"offload": "group-leaf", "use_stream": True, "use_kv_cache": True})
    peaks = {}
    for kv in (True, False):
        engine.profile["use_kv_cache"] = kv
        for steps in (2, 20):
            measured = engine.generate({
                "prompt": "compose the four subjects in one scene", "reference_paths": refs,
                "height": 832, "width": 1248, "num_inference_steps": steps,
                "true_cfg_scale": 1.0, "seed": 2301, "output": str(tmp_path / "out.png")})
            peaks[kv, steps] = measured
            print(f"kv {kv} steps {steps}: {json.dumps(measured)}")
    for kv in (True, False):
        few, full = peaks[kv, 2], peaks[kv, 20]
        assert few["peak_mib"] == pytest.approx(full["peak_mib"], rel=0.01)
        assert few["peak_allocated_mib"] == pytest.approx(full["peak_allocated_mib"], rel=0.01)


def test_a_failed_decode_leaves_nothing_once_the_engine_recovers(tmp_path):
    """Issue 48 on the GPU: a request that OOMs in the VAE's decode leaves the VAE's feature cache
    on the device; the engine's recovery (the adapter's clear_cache first) brings torch back to
    what the build left, within CLEAN_TOLERANCE_MIB, and the next request starts clean."""
    from omniprobe_engine.protocol import CLEAN_TOLERANCE_MIB

    refs = _four_references(tmp_path)
    engine = _engine({"offload": "group-leaf", "use_stream": True, "use_kv_cache": False})
    request = {"prompt": "compose the four subjects in one scene", "reference_paths": refs,
               "height": 832, "width": 1248, "num_inference_steps": 2, "true_cfg_scale": 1.0,
               "seed": 2301, "output": str(tmp_path / "out.png")}
    fits = engine.generate(request)
    # Just under the request's own peak: it gets through the DiT and fails late, in the decode.
    engine.set_pool_limit(int(fits["peak_mib"]) - 256)
    with pytest.raises(torch.OutOfMemoryError):
        engine.generate(request)
    left = engine.last["peak_allocated_mib"]
    print(f"resident {engine.resident_mib} MiB; after the OOM torch held "
          f"{torch.cuda.memory_allocated() / 2**20:.0f} MiB (the request peaked at {left})")
    assert engine.recover() is None
    engine.set_pool_limit(int(fits["peak_mib"]) + 1024)
    again = engine.generate(request)
    print(json.dumps({"first": fits, "after recovery": again}))
    assert again["start_allocated_mib"] <= engine.resident_mib + CLEAN_TOLERANCE_MIB
    assert again["peak_mib"] == pytest.approx(fits["peak_mib"], rel=0.02)


def test_the_cache_in_host_memory_frees_the_gpu_of_it_between_blocks(tmp_path):
    """Issue 49 on the GPU: with kv_placement host-pinned (and -packed) the conditioning cache
    stays in host memory, so what torch holds between transformer blocks at a cached step is
    lower than with the cache on the GPU, by about the cache's bytes; all record the same cache.
    A smaller request before it leaves no pinned blocks behind (torch's cache of them is given
    back), and packed, the cache pins little more than its own bytes."""
    refs = _four_references(tmp_path)
    request = {"prompt": "compose the four subjects in one scene", "reference_paths": refs,
               "height": 832, "width": 1248, "num_inference_steps": 2, "true_cfg_scale": 1.0,
               "seed": 2301, "output": str(tmp_path / "out.png")}
    between = {}
    # pinned, each tensor a block rounded up to a power of two; packed, carved out of slabs
    added_at_most = {"host-pinned": 2.0, "host-pinned-packed": 1.1}
    for placement in ("gpu", *added_at_most):
        engine = _engine({"offload": "group-leaf", "use_stream": True, "use_kv_cache": True,
                          "kv_placement": placement})
        held: list[int] = []
        for block in engine.pipe.transformer.transformer_blocks:
            block.register_forward_hook(
                lambda *args, held=held: held.append(torch.cuda.memory_allocated()))
        if placement in added_at_most:  # a smaller request first: its pinned blocks must not stay
            smaller = engine.generate({**request, "reference_paths": refs[:1]})
            held.clear()
        measured = engine.generate(request)
        if placement in added_at_most:
            print("after one reference", json.dumps(smaller))
            # torch's cached pinned blocks were given back before the request: it starts where
            # the smaller one did, and holds its own cache's blocks, not those on top
            assert measured["pinned_host_start_mib"] == pytest.approx(
                smaller["pinned_host_start_mib"], abs=64)
            # (on the H100 in one search runner, 1-3 references first: 3.4 times the cache's bytes;
            # in a runner of its own, 2.0 times: its blocks rounded up to powers of two)
            added_mib = measured["pinned_host_peak_mib"] - measured["pinned_host_start_mib"]
            print(placement, "pinned added", added_mib, "MiB for a cache of",
                  measured["kv_cache_bytes"] / 2**20)
            assert added_mib <= added_at_most[placement] * measured["kv_cache_bytes"] / 2**20
        blocks = len(engine.pipe.transformer.transformer_blocks)
        between[placement] = (max(held[blocks:2 * blocks]), measured)  # the second step: cached
        print(placement, between[placement][0] / 2**20, json.dumps(measured))
        del engine
        torch.cuda.empty_cache()
    on_gpu, gpu = between["gpu"]
    for placement in added_at_most:
        in_host, host = between[placement]
        assert host["kv_cache_host_bytes"] == host["kv_cache_bytes"] == gpu["kv_cache_bytes"] > 0
        assert on_gpu - in_host >= 0.8 * gpu["kv_cache_bytes"]


def test_packed_pinned_weights_pin_about_their_own_bytes_and_compute_the_same():
    """pinned_weights = "packed" on the GPU: leaf offload with streams over 32 layers whose
    tensors are no power of two (3,000 x 3,000 bfloat16, 17.2 MiB: a 32 MiB block each, 1 GiB
    in all) pins about their carved bytes (549 MiB: slabs of 512 and 64 MiB), where blocks pin
    the powers of two; every copy is page-locked (so diffusers never pins it again per onload),
    and the output is the blocks' output."""
    from diffusers.hooks import apply_group_offloading
    from diffusers.hooks.group_offloading import ModuleGroup

    from omniprobe_engine.diffusers_build import pinned_mib, release_pinned_cache
    from omniprobe_engine.pinned_slabs import power_of_two_ceil
    from omniprobe_engine.pinned_weights import carved_bytes, packed_pinning

    def layers():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(3000, 3000, bias=False)
                                     for _ in range(32)]).to(torch.bfloat16)

    x = torch.randn(4, 3000, dtype=torch.bfloat16, device="cuda")
    pinned, out = {}, {}
    for packing in ("blocks", "packed"):
        module = layers()
        release_pinned_cache(torch)
        before = pinned_mib(torch)
        with packed_pinning(module) if packing == "packed" else contextlib.nullcontext():
            apply_group_offloading(module, onload_device=torch.device("cuda"),
                                   offload_device=torch.device("cpu"), offload_type="leaf_level",
                                   use_stream=True)
        pinned[packing] = pinned_mib(torch) - before
        with torch.no_grad():
            out[packing] = module(x)
        torch.cuda.synchronize()
        copies = [h.group.cpu_param_dict for m in module.modules()
                  if (h := getattr(m, "_diffusers_hook", None)) is not None
                  and (h := h.get_hook("group_offloading")) is not None]
        assert copies and all(t.is_pinned() for d in copies for t in d.values())
        expected_mib = (sum(power_of_two_ceil(p.numel() * 2) for p in module.parameters())
                        if packing == "blocks" else carved_bytes(module)) / 2**20
        print(packing, "pinned", pinned[packing], "MiB; expected", expected_mib)
        if packing == "blocks":
            assert pinned[packing] == pytest.approx(expected_mib, rel=0.01)
        else:
            assert pinned[packing] <= 1.1 * expected_mib
        del module, copies
        assert isinstance(ModuleGroup.__dict__["_to_cpu"], staticmethod)
    assert torch.equal(out["blocks"], out["packed"])
    assert pinned["packed"] < 0.6 * pinned["blocks"]
