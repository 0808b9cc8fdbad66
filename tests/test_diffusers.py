"""The Diffusers engine on the CPU: a real QwenImage21Pipeline of the same classes at a tiny size
(models/qwen-image-2.1/tiny), with random weights, through the whole offline path: build,
requests, an OOM survived, the one recorder, resume, caps, `validate`; and the full configs'
parameter counts.

These need torch, transformers and diffusers: `nox -s tests-diffusers` installs them (pinned to
what the GPU machine has) and runs this file; the plain suite skips it where they are absent.
"""

from __future__ import annotations

import io
import json
import textwrap

import pytest

from omniprobe import cli
from omniprobe.analysis.diffusers_capacity import (
    card_capacity,
    host_runs,
    kv_measures,
    kv_per_reference,
)
from omniprobe.cli import build_parser
from omniprobe.cli.options import options_from
from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.pinned_cache import architecture_bytes_per_token
from omniprobe.evidence.validate import load_project
from omniprobe.harness.offline.baseline import run_baseline

from .conftest import REPO, in_process, make_project

torch = pytest.importorskip("torch", reason="needs torch: run `nox -s tests-diffusers`")
pytest.importorskip("diffusers", reason="needs diffusers: run `nox -s tests-diffusers`")

HOST = "diffusers-tiny-cpu"
KLEIN_HOST = "diffusers-klein-tiny-cpu"  # a second family: FLUX.2 [klein]'s classes, tiny
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # layers x (K, V) x heads x head_dim x bf16


@pytest.fixture
def project(tmp_path, monkeypatch):
    proj = make_project(tmp_path, size=(96, 64))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    monkeypatch.delenv("OMNIPROBE_ARTIFACTS", raising=False)
    return proj


def offline(project, *extra, **doubles):
    return in_process(project, ["probe-offline", "--host", HOST, *extra], **doubles)


def attempts(project, host=HOST):
    loaded, problems = load_project(project)
    assert problems == []
    return loaded, loaded.evidence.for_host(host, include_emulated=True)


# Runs a double's source once diffusers is imported, not at every Python's startup: the supervisor
# and the cgroup helper inherit PYTHONPATH too, and importing diffusers costs each ~10 s here.
AFTER_DIFFUSERS = textwrap.dedent('''
    import importlib.abc, importlib.machinery, sys

    class AfterDiffusers(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "diffusers":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                exec(DOUBLE, {})

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterDiffusers())
''')


def pipeline_double(tmp_path, monkeypatch, source: str) -> None:
    """A test double of the pipeline's call, applied in the runner's process once it imports
    diffusers (every Python it starts reads the sitecustomize)."""
    double = tmp_path / "double"
    double.mkdir()
    (double / "sitecustomize.py").write_text(f"DOUBLE = {source!r}\n" + AFTER_DIFFUSERS)
    monkeypatch.setenv("PYTHONPATH", str(double))


def stand_in_cgroups(tmp_path, monkeypatch):
    """A stand-in cgroup v2 root: runners join their cgroups there as they would the kernel's."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    monkeypatch.setenv("OMNIPROBE_CGROUP_ROOT", str(root))
    return root


def add_tiny_host(project, name: str, *, weights: str = "random", tables: str = "",
                  gpu: str = "none (the CPU)", cc: str = "0.0", vram_gb: int = 1) -> None:
    """Another host of the tiny model's profile, in the project's hosts.toml, its runner on the
    probe's own Python."""
    configs = 'configs = "models/qwen-image-2.1/tiny"\n' if weights == "random" else ""
    with open(project.hosts_file, "a") as handle:
        handle.write(f'''
[hosts.{name}]
kind = "diffusers"
name = "the tiny model ({name})"
hostname = "(any)"
gpu = "{gpu}"
compute_capability = "{cc}"
vram_gb = {vram_gb}
python_provider = "the probe's own Python"
diffusers_profiles = ["tiny-cpu"]
offline_command = ["{{python}}", "{{runner}}"]
[hosts.{name}.diffusers]
weights = "{weights}"
runner_env = "own"
{configs}{textwrap.dedent(tables)}''')


# --- the full model's size -------------------------------------------------------------------


def test_the_full_configs_build_qwen_image_21_at_its_public_parameter_counts():
    """Built on the meta device (no memory): the text encoder at Qwen3-VL-8B's 8.77 B (its model
    cards), the DiT and VAE at diffusers' defaults, and the bf16 total beside the seed's "~32 GiB
    of BF16 weights"."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage21, QwenImage21Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    configs = {name: spec["config"] for name, spec in
               load_model_configs(REPO, "models/qwen-image-2.1/full").engine_components().items()}
    with init_empty_weights():
        built = {"text_encoder": Qwen3VLForConditionalGeneration(
                     Qwen3VLConfig(**configs["text_encoder"])),
                 "transformer": QwenImage21Transformer2DModel(**configs["transformer"]),
                 "vae": AutoencoderKLQwenImage21(**configs["vae"])}
    billions = {k: round(sum(p.numel() for p in m.parameters()) / 1e9, 3) for k, m in built.items()}
    assert billions == {"text_encoder": 8.767, "transformer": 7.115, "vae": 0.338}
    total_gib = sum(sum(p.numel() for p in m.parameters()) for m in built.values()) * 2 / 2**30
    # 32.44 GB, 30.21 GiB: the seed says "~32 GiB of BF16 weights" (diffusers-facts.md: 30.24).
    assert round(total_gib, 2) == 30.21


def test_the_architecture_implies_512_kib_of_cache_per_prefix_token():
    configs = load_model_configs(REPO, "models/qwen-image-2.1/full").components
    assert architecture_bytes_per_token(configs["transformer"].config) == 32 * 2 * 32 * 128 * 2 == 2**19


# --- the whole offline path ------------------------------------------------------------------


def test_the_tiny_pipeline_runs_end_to_end_and_records_capacity_only(project):
    code, out = offline(project, "--profile", "tiny-cpu")
    assert code == 0, out
    loaded, [attempt] = attempts(project)
    assert attempt.meta.weights == "random"
    # The profile's settings in full, once, beside its records; the records name the profile.
    [run] = attempt.offline
    assert (run.engine, run.profile, run.kwarg_set) == ("diffusers", "tiny-cpu", None)
    assert run.settings["offload"] == "none" and run.init.outcome == "ready"
    assert [c.fixture for c in run.cells] == [r.fixture for r in attempt.offline_requests]
    assert len(run.lifetimes) == 1 and run.build is not None
    assert {(r.profile, r.kwarg_set) for r in attempt.offline_requests} == {("tiny-cpu", None)}
    served = attempt.meta.environment.served
    assert served.source == "random" and set(served.config_digests) == {
        "transformer", "vae", "text_encoder", "processor"}
    assert attempt.meta.environment.packages["diffusers"] == "0.42.1"
    records = attempt.offline_requests
    assert [loaded.fixtures.get(r.fixture).reference_count for r in records] == [0, 1, 2, 3, 4]
    for r in records:
        assert (r.outcome, r.weights, r.engine, r.structure) == ("ok", "random", "diffusers",
                                                              "unchecked")
        assert r.image is None and r.structure_note.startswith("random weights")
        assert r.output_sha256 is not None and r.artifact is not None  # hashed, not judged
        assert (r.num_inference_steps, r.sampling_from) == (2, "profile")
        assert r.peak_mib is None and r.peak_source is None  # no CUDA here: no peak to claim
        assert r.kv_cache_layers == r.kv_cache_layers_total == 2
        assert r.kv_cache_bytes == r.prefix_tokens * TINY_KV_BYTES_PER_TOKEN
    # More references, more prefix tokens: each condition image adds its own.
    tokens = [r.prefix_tokens for r in records]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    [row, *_] = attempt.offline
    assert row.build.parameters_b["transformer"] > 0 and row.build.build_peak_mib is None
    # The host figures, recorded apart: the build's peak, the steady footprint once placed (no
    # CUDA: nothing pinned, none to split), and each request's peak sampled beside it.
    build = row.build
    assert build.build_path == "random-streamed"
    assert build.build_host_peak_mib >= build.steady_host_mib > build.host_weights_mib > 0
    assert build.pinned_host_mib is None and build.pageable_host_mib is None
    # The sampled peak holds its own last reading; the kernel's high-water mark (ru_maxrss) is
    # a lifetime peak, updated lazily, so it may trail the latest reading by a few pages.
    assert all(r.host_peak_mib >= r.host_end_mib > 0 for r in records)
    assert all(r.host_peak_mib <= r.max_rss_mib + 1 for r in records)
    measures = kv_measures([attempt], loaded.fixtures, {"tiny-cpu": 64})
    per_ref = kv_per_reference(measures)
    assert [p.reference_count for p in per_ref] == [1, 2, 3, 4]
    # Each fixture has its own prompt, counted as encoded: less it, every reference (one size)
    # adds the same tokens, which the share against the text-only fixture would not show.
    assert all(0 < r.prompt_text_tokens < r.prefix_tokens for r in records[1:])
    assert len({p.tokens_per_reference for p in per_ref}) == 1
    assert records[0].prompt_text_tokens == records[0].prefix_tokens  # no reference: all text
    assert all(p.bytes_per_reference == p.tokens_per_reference * TINY_KV_BYTES_PER_TOKEN
               for p in per_ref)


def test_a_second_family_runs_through_the_same_engine_from_its_configs_and_adapter(project):
    """FLUX.2 [klein] at a tiny size (models/flux2-klein/tiny, omniprobe_engine/adapters/flux2klein.py,
    its hosts.toml entries): the same offline path builds Flux2KleinPipeline from its configs'
    classes and runs every fixture, its references handed over as a list."""
    code, out = in_process(project, ["probe-offline", "--host", KLEIN_HOST])
    assert code == 0, out
    loaded, [attempt] = attempts(project, KLEIN_HOST)
    [run] = attempt.offline
    assert (run.profile, run.settings["pipeline"], run.settings["dtype"]) == (
        "klein-tiny-cpu", "Flux2KleinPipeline", "float32")
    served = attempt.meta.environment.served
    assert (served.source, served.configs) == ("random", "models/flux2-klein/tiny")
    assert set(served.config_digests) == {"text_encoder", "tokenizer", "transformer", "vae"}
    # Its own classes' weights: a Qwen3 text encoder, FLUX.2's DiT and VAE (no processor).
    assert set(run.build.parameters_b) == {"text_encoder", "transformer", "vae"}
    assert run.build.build_path == "random-streamed"
    records = attempt.offline_requests
    assert [loaded.fixtures.get(r.fixture).reference_count for r in records] == [0, 1, 2, 3, 4]
    for r in records:
        assert (r.outcome, r.weights, r.engine, r.profile) == ("ok", "random", "diffusers",
                                                               "klein-tiny-cpu")
        assert r.output_sha256 is not None and r.artifact is not None
        assert r.kv_cache_bytes is None and r.prefix_tokens is None  # no cache to record
    # (Random weights at a tiny spread decode every request to the same flat picture, so the
    # outputs' hashes cannot tell the references apart; each count went through the pipeline's
    # own reference path, its VAE encoding them, and came back ok.)


def test_klein_kvs_reference_cache_is_recorded_through_the_offline_path(project):
    """FLUX.2 [klein]'s KV release at a tiny size (models/flux2-klein-kv/tiny,
    Flux2KleinKVPipeline): the offline path records its reference tokens' cache per request,
    reference tokens only (no prompt text among them), none without references, and each
    reference adds the same tokens and bytes."""
    host = "diffusers-klein-kv-tiny-cpu"
    code, out = in_process(project, ["probe-offline", "--host", host])
    assert code == 0, out
    loaded, [attempt] = attempts(project, host)
    [run] = attempt.offline
    assert (run.profile, run.settings["pipeline"]) == ("klein-kv-tiny-cpu", "Flux2KleinKVPipeline")
    records = attempt.offline_requests
    counts = [loaded.fixtures.get(r.fixture).reference_count for r in records]
    assert counts == [0, 1, 2, 3, 4] and all(r.outcome == "ok" for r in records)
    assert records[0].kv_cache_bytes is None and records[0].prefix_tokens is None
    cached = records[1:]
    assert all(r.prompt_text_tokens == 0 and r.kv_cache_host_bytes == 0 for r in cached)
    per_reference = {(r.kv_cache_bytes // n, r.prefix_tokens // n)
                     for r, n in zip(cached, counts[1:], strict=True)}
    assert len(per_reference) == 1 and min(per_reference.pop()) > 0


def test_a_profile_naming_a_pipeline_no_adapter_serves_is_refused_before_any_attempt(project):
    hosts = project.hosts_file.read_text()
    project.hosts_file.write_text(hosts.replace('pipeline = "Flux2KleinPipeline"',
                                                'pipeline = "NoSuchPipeline"'))
    code, out = in_process(project, ["probe-offline", "--host", KLEIN_HOST])
    assert code == 3, out
    assert ("Diffusers profile 'klein-tiny-cpu': pipeline 'NoSuchPipeline' has no adapter in "
            "omniprobe_engine/adapters/") in out
    assert "Flux2KleinPipeline, QwenImage21Pipeline" in out
    assert not (project.evidence_dir / KLEIN_HOST).exists()


def test_a_profile_setting_the_pipeline_lacks_is_refused_in_the_adapters_words(project):
    hosts = project.hosts_file.read_text()
    block = hosts[hosts.index("[diffusers_profiles.klein-tiny-cpu]"):]
    project.hosts_file.write_text(hosts.replace(block, block.replace(
        "use_kv_cache = false", "use_kv_cache = true", 1)))
    code, out = in_process(project, ["probe-offline", "--host", KLEIN_HOST])
    assert code == 3, out
    assert ("Diffusers profile 'klein-tiny-cpu': use_kv_cache = true: Flux2KleinPipeline has no "
            "conditioning KV cache") in out
    assert not (project.evidence_dir / KLEIN_HOST).exists()


# A test double of the pipeline's call, loaded in the runner's process at startup: the request
# with four condition images raises PyTorch's own OOM class with a real PyTorch message.
OOM_AT_FOUR = textwrap.dedent('''
    import diffusers, torch
    real = diffusers.QwenImage21Pipeline.__call__
    def call(self, *args, image=None, **kwargs):
        if image is not None and len(image) == 4:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 490.00 MiB. GPU 0 has a total capacity of "
                "23.56 GiB of which 380.50 MiB is free. Including non-PyTorch memory, this process "
                "has 23.17 GiB memory in use. Of the allocated memory 21.02 GiB is allocated by "
                "PyTorch, and 1.84 GiB is reserved by PyTorch but unallocated.")
        return real(self, *args, image=image, **kwargs)
    diffusers.QwenImage21Pipeline.__call__ = call
''')


def test_an_oom_is_recorded_with_its_signature_and_the_pipeline_goes_on(project, tmp_path,
                                                                         monkeypatch):
    pipeline_double(tmp_path, monkeypatch, OOM_AT_FOUR)
    code, out = offline(project, "--profile", "tiny-cpu", "--seed", "2301", "--seed", "2302")
    assert code == 0, out
    _, [attempt] = attempts(project)
    four = [r for r in attempt.offline_requests if r.fixture == "standin-four"]
    assert [r.outcome for r in four] == ["oom", "oom"]
    assert four[0].oom.requested == "490.00 MiB" and four[0].cause.kind == "card"
    # One runner for all ten: the OOM cost no rebuild, and the next request after it ran.
    assert {r.lifetime for r in attempt.offline_requests} == {0}
    assert four[1].outcome == "oom" and len(attempt.offline[0].lifetimes) == 1
    assert "a fresh runner" not in out


def test_a_rerun_resumes_the_attempt_and_a_complete_one_says_so(project):
    code, out = offline(project, "--profile", "tiny-cpu", "--fixture", "standin-t2i")
    assert code == 0, out
    code, out = offline(project, "--fixture", "standin-t2i")
    assert code == 0 and "resumed: " in out, out
    _, [attempt] = attempts(project)
    assert [r.profile for r in attempt.offline_requests] == ["tiny-cpu", "tiny-cpu-nokv"]
    nokv = attempt.offline_requests[1]
    assert nokv.kv_cache_bytes is None and nokv.prefix_tokens is None  # no cache to measure
    code, out = offline(project, "--fixture", "standin-t2i")
    assert code == 0 and "complete: " in out, out
    assert len(attempts(project)[1]) == 1


def test_a_cap_reaches_the_runner_through_the_hook_and_is_recorded(project, tmp_path,
                                                                   monkeypatch):
    """An emulated tiny host: its runner starts with the emulation hook and the cap, and the
    attempt, the guard and the capacity verdict record the cap (the CPU allocates no CUDA memory,
    so nothing is capped here; a real capped OOM is the GPU test's)."""
    from omniprobe.harness.common.sampler import MIB, NvmlReader
    from tests.fakenvml import FakeNvml, Frame

    add_tiny_host(project, "tiny-emulated", gpu="Fake GPU", cc="8.6", vram_gb=24, tables='''
        [hosts.tiny-emulated.emulation]
        capacity_mib = 2048
        host_ram_gib = 30
        mechanism = "memory-fraction"
    ''')
    cgroups = stand_in_cgroups(tmp_path, monkeypatch)
    fake = FakeNvml([Frame(0.0, 100 * MIB)])
    code, out = in_process(project, ["probe-offline", "--host", "tiny-emulated", "--caps", "1,2",
                                     "--fixture", "standin-t2i", "--fixture", "standin-four"],
                           readers=lambda folder: NvmlReader(nvml=fake))
    assert code == 0, out
    loaded, found = attempts(project, "tiny-emulated")
    assert sorted(a.meta.provenance.cap_mib for a in found) == [1024, 2048]
    for attempt in found:
        [row, *_] = attempt.offline
        check = row.timelines[0].emulation
        assert check.cap_mib == attempt.meta.provenance.cap_mib and check.breach is None
        assert check.checked_samples > 0
        assert [(h.mechanism, h.cap_mib, h.oom_kills) for h in row.host_ram] == [
            ("cgroup-v2", 30 * 1024, 0)]
    assert list(cgroups.iterdir()) == [cgroups / "cgroup.controllers"]  # each one removed
    runs = host_runs("tiny-emulated", loaded.evidence, loaded.fixtures)
    verdict = card_capacity("tiny-emulated", runs, 2048, 4)
    assert verdict.verdict == "fits" and [f.profile for f in verdict.fits] == ["tiny-cpu"]


def test_validate_refuses_a_random_weight_record_that_claims_a_structure_verdict(project):
    code, out = offline(project, "--profile", "tiny-cpu", "--fixture", "standin-t2i")
    assert code == 0, out
    [folder] = (project.evidence_dir / HOST).iterdir()
    path = folder / "offline-requests.json"
    data = json.loads(path.read_text())
    data["offline_requests"][0]["structure"] = "sound"
    path.write_text(json.dumps(data))
    loaded, problems = load_project(project)
    assert any("random-weight record claims no output structure" in str(p) for p in problems)
    data["offline_requests"][0]["structure"] = "unchecked"
    data["offline_requests"][0].pop("weights")
    path.write_text(json.dumps(data))
    _, problems = load_project(project)
    assert any("expected 'random' in a random-weight attempt" in str(p) for p in problems)


def test_probe_baseline_lays_out_its_images_and_quality_refuses_random_weights_by_name(
        project, monkeypatch, capsys):
    code, out = offline(project, "--profile", "tiny-cpu", "--fixture", "standin-t2i",
                        "--fixture", "standin-single")
    assert code == 0, out
    # As the nox session runs it: --build-env builds nothing for a runner on the machine's Python.
    args = build_parser().parse_args(["probe-baseline", "--host", HOST, "--profile", "tiny-cpu",
                                      "--fixture", "standin-t2i", "--fixture", "standin-single",
                                      "--build-env"])
    said = io.StringIO()
    assert run_baseline(project, options_from(args), command=["omniprobe"], out=said) == 0
    assert "Diffusers env" not in said.getvalue()
    _, [attempt] = attempts(project)
    # The record says no built env ran (the machine's own Python) and what that Python holds.
    assert attempt.meta.environment.env is None
    assert attempt.meta.environment.packages["diffusers"] == "0.42.1"
    folder = project.artifacts_dir / HOST / attempt.id / "baseline"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png")) == [
        "standin-single/2301.png", "standin-t2i/2301.png"]
    marker = json.loads((folder / "baseline.json").read_text())
    assert (marker["attempt"], marker["weights"]) == (attempt.id, "random")
    assert f"--baseline {folder} --baseline-attempt {attempt.id}" in said.getvalue()
    monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
    code = cli.main(["quality", "--baseline", str(folder), "--attempt", attempt.id,
                     "--baseline-attempt", attempt.id])
    err = capsys.readouterr().err
    assert code == 3 and f"baseline attempt {attempt.id!r} was made with random weights" in err




def test_a_snapshot_host_loads_the_pinned_snapshot_from_the_hub_cache_and_gates_its_output(
        project, tmp_path, monkeypatch):
    """Snapshot weights: the pipeline saved, laid out as the hub cache keeps the pinned revision,
    loaded offline by the runner; its records are real weights', so the structure gate applies."""
    from omniprobe_engine.diffusers_engine import DiffusersEngine

    from .env_scaffold import make_hf_cache

    components = load_model_configs(REPO, "models/qwen-image-2.1/tiny").engine_components()
    engine = DiffusersEngine("random", {
        "profile": {"pipeline": "QwenImage21Pipeline", "offload": "none", "use_kv_cache": True},
        "weights": {"kind": "random", "seed": 0, "components": components}})
    saved = tmp_path / "saved"
    engine.pipe.save_pretrained(saved)
    files = {p.relative_to(saved).as_posix(): p.read_bytes() for p in saved.rglob("*")
             if p.is_file()}
    revision = "790c9263" + "0" * 32  # hosts.toml pins Qwen/Qwen-Image-2.1@790c9263
    snapshot = make_hf_cache(tmp_path / "hub", "Qwen/Qwen-Image-2.1", revision, files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    add_tiny_host(project, "tiny-snapshot", weights="snapshot")
    code, out = in_process(project, ["probe-offline", "--host", "tiny-snapshot",
                                     "--fixture", "standin-t2i"])
    assert code == 0, out
    loaded, [attempt] = attempts(project, "tiny-snapshot")
    served = attempt.meta.environment.served
    assert (served.source, served.model, served.revision) == ("pinned", str(snapshot), revision)
    [record] = attempt.offline_requests
    assert record.outcome == "ok" and record.weights == "snapshot"
    # The gate applies to a snapshot's output: this one holds random values, so it is noise.
    assert record.image is not None and record.structure == record.image.verdict == "broken"


def test_a_snapshot_host_without_its_snapshot_is_refused_before_any_attempt(project, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    add_tiny_host(project, "tiny-snapshot", weights="snapshot")
    code, out = in_process(project, ["probe-offline", "--host", "tiny-snapshot"])
    assert code == 3 and "no single snapshot of Qwen/Qwen-Image-2.1@790c9263" in out, out
    assert not (project.evidence_dir / "tiny-snapshot").exists()


# A test double of the kernel at an emulated host RAM cap: at the request with four condition
# images, the runner's cgroup counts an OOM kill and the runner dies by SIGKILL, as the kernel's
# OOM killer leaves it.
# The kernel's OOM kill as a stand-in cgroup shows it: the runner's cgroup counts one, and the
# runner dies of SIGKILL.
OOM_KILLED = textwrap.dedent('''
    import glob, os, signal, sys, diffusers
    def oom_killed():
        root = os.environ["OMNIPROBE_CGROUP_ROOT"]
        for procs in glob.glob(os.path.join(root, "omniprobe-*", "cgroup.procs")):
            if str(os.getpid()) in open(procs).read().split():
                with open(os.path.join(os.path.dirname(procs), "memory.events"), "w") as f:
                    f.write("low 0\\nhigh 0\\nmax 3\\noom 1\\noom_kill 1\\n")
        os.kill(os.getpid(), signal.SIGKILL)
''')
KILLED_AT_FOUR = OOM_KILLED + textwrap.dedent('''
    real = diffusers.QwenImage21Pipeline.__call__
    def call(self, *args, image=None, **kwargs):
        if image is not None and len(image) == 4:
            oom_killed()
        return real(self, *args, image=image, **kwargs)
    diffusers.QwenImage21Pipeline.__call__ = call
''')


def test_a_runner_the_kernel_killed_at_the_host_ram_cap_is_a_host_ram_failure(project, tmp_path,
                                                                              monkeypatch):
    stand_in_cgroups(tmp_path, monkeypatch)
    pipeline_double(tmp_path, monkeypatch, KILLED_AT_FOUR)
    add_tiny_host(project, "tiny-30gib-host")
    # Not an emulated card (no GPU to cap here): host RAM alone, through the settings' hook.
    from omniprobe.harness.offline import session as offline_session

    monkeypatch.setattr(offline_session, "host_ram_mib", lambda host: 30 * 1024)
    code, out = in_process(project, ["probe-offline", "--host", "tiny-30gib-host",
                                     "--fixture", "standin-t2i", "--fixture", "standin-four"])
    _, [attempt] = attempts(project, "tiny-30gib-host")
    t2i, four = attempt.offline_requests
    assert t2i.outcome == "ok"
    assert four.outcome == "error" and four.cause.kind == "host", four
    assert "oom_kill went from 0 to 1" in four.cause.reason
    assert [h.oom_kills for h in attempt.offline[0].host_ram] == [1]
    assert "transport" not in out


KILLED_AT_BUILD = OOM_KILLED + textwrap.dedent('''
    def init(self, *args, **kwargs):
        print("Unable to import `torchao` Tensor objects.", file=sys.stderr, flush=True)
        oom_killed()
    diffusers.QwenImage21Pipeline.__init__ = init
''')


def test_a_runner_killed_at_the_host_ram_cap_while_building_says_so_not_its_last_log_line(
        project, tmp_path, monkeypatch):
    """Issue 34 item 8: the record's note and the console give the cause (the cgroup's OOM
    kill), not the unrelated last line the runner logged."""
    stand_in_cgroups(tmp_path, monkeypatch)
    pipeline_double(tmp_path, monkeypatch, KILLED_AT_BUILD)
    add_tiny_host(project, "tiny-30gib-host")
    from omniprobe.harness.offline import session as offline_session

    monkeypatch.setattr(offline_session, "host_ram_mib", lambda host: 30 * 1024)
    code, out = in_process(project, ["probe-offline", "--host", "tiny-30gib-host",
                                     "--fixture", "standin-t2i"])
    _, [attempt] = attempts(project, "tiny-30gib-host")
    [run] = attempt.offline
    init = run.init
    assert run.init_failed == "init-error" and init.cause.kind == "host", run
    assert "oom_kill went from 0 to 1" in init.note and "torchao" not in init.note
    assert "oom_kill went from 0 to 1" in out and "Unable to import" not in out


@pytest.mark.parametrize("offload", ["model-cpu", "group-leaf", "group-block"])
def test_a_profile_the_engine_would_refuse_is_refused_before_any_runner(project, offload):
    """Issue 35 class 8: on a machine without CUDA, an offload profile is refused in the
    engine's own words, asked of the runner's Python, before any attempt or runner exists."""
    text = project.hosts_file.read_text().replace(
        '''[diffusers_profiles.tiny-cpu]
description = "the tiny model on the CPU: everything resident, two steps"
offload = "none"''', f'''[diffusers_profiles.tiny-cpu]
description = "the tiny model on the CPU: everything resident, two steps"
offload = "{offload}"''')
    project.hosts_file.write_text(text)
    code, out = offline(project, "--profile", "tiny-cpu")
    assert code == 3, out
    assert (f"Diffusers profile 'tiny-cpu': offload {offload!r} needs a CUDA device; this "
            "machine has none") in out
    assert not (project.evidence_dir / HOST).exists() and "starting the runner" not in out


def test_a_profile_whose_allocator_setting_torch_cannot_read_back_is_refused(project):
    """The one rule for the allocator variable (env/allocator.py): torch must read the setting
    back; the CPU build of torch has no API for it and no CUDA, so the run stops before any
    attempt rather than measure the plain configuration."""
    text = project.hosts_file.read_text().replace(
        '''[diffusers_profiles.tiny-cpu]
description = "the tiny model on the CPU: everything resident, two steps"
offload = "none"''', '''[diffusers_profiles.tiny-cpu]
description = "the tiny model on the CPU: everything resident, two steps"
offload = "none"
allocator = "expandable_segments:True"''')
    project.hosts_file.write_text(text)
    code, out = offline(project, "--profile", "tiny-cpu")
    assert code == 4 and "the allocator setting cannot be read back from torch" in out, out
    assert not (project.evidence_dir / HOST).exists()


# --- the capacity search, end to end on the CPU ---------------------------------------------

# A test double of the pipeline's call: an OOM whenever the trial's pool limit lies below a need
# set per reference count, the need moving by up to 100 MiB from one call to the next (the
# allocator's history at the boundary). It reads the limit where the engine publishes it.
NEED_MIB = {0: 3000, 1: 4100, 2: 5300, 3: 6400, 4: 7600}
NOISE_MIB = 100
POOL_NEED = textwrap.dedent(f'''
    import os, random, diffusers, torch
    real = diffusers.QwenImage21Pipeline.__call__
    noise = random.Random(7)
    NEED = {NEED_MIB!r}
    def call(self, *args, image=None, **kwargs):
        limit = int(os.environ["OMNIPROBE_POOL_LIMIT_MIB"])
        need = NEED[len(image or [])] + noise.choice((-{NOISE_MIB}, 0, {NOISE_MIB}))
        if limit < need:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of "
                f"{{limit / 1024:.2f}} GiB of which 0 bytes is free. Of the allocated memory "
                f"{{limit / 1024:.2f}} GiB is allocated by PyTorch, and 0 bytes is reserved by "
                f"PyTorch but unallocated.")
        return real(self, *args, image=image, **kwargs)
    diffusers.QwenImage21Pipeline.__call__ = call
''')
SEARCH_FLAGS = ["--floor-mib", "1024", "--ceiling-mib", "12288", "--resolution-mib", "256",
                "--repeats", "1"]


def capacity(project, *extra):
    return in_process(project, ["probe-capacity", "--host", HOST, "--profile", "tiny-cpu",
                                *SEARCH_FLAGS, *extra])


def test_the_capacity_search_bands_every_count_in_one_runner_and_resumes_nothing_twice(
        project, tmp_path, monkeypatch):
    pipeline_double(tmp_path, monkeypatch, POOL_NEED)
    code, out = capacity(project)
    assert code == 0, out
    loaded, [attempt] = attempts(project)
    assert attempt.id.endswith("-capacity")
    [search] = attempt.capacity
    assert search.profile == "tiny-cpu" and search.settings["offload"] == "none"
    assert (search.search.floor_mib, search.search.resolution_mib, search.search.chosen_by) == (
        1024, 256, "command line")
    assert len(search.logs) == 1  # one runner, one build, every count
    grid = 256
    for band in search.bands:
        need = NEED_MIB[band.reference_count]
        # Every limit at or above need + noise fits, every one below need - noise fails: the
        # band lies across that boundary, at most a step outside it, and holds its trials.
        assert need - NOISE_MIB <= band.fits_at_mib <= need + NOISE_MIB + grid, band
        assert need - NOISE_MIB - grid <= band.fails_at_mib < need + NOISE_MIB, band
        mine = [t for t in attempt.capacity_trials if t.reference_count == band.reference_count]
        assert len(mine) == band.trials
        assert all(t.outcome == "fit" for t in mine if t.limit_mib >= band.fits_at_mib)
        assert all(t.outcome == "oom" for t in mine if t.limit_mib <= band.fails_at_mib)
        assert all(t.oom is not None for t in mine if t.outcome == "oom")
        limits = [t.limit_mib for t in mine if not t.repeat]
        assert len(limits) == len(set(limits))  # no limit twice but as a repeat
    assert [b.reference_count for b in search.bands] == [0, 1, 2, 3, 4]
    assert sum(b.requests_saved for b in search.bands[1:]) > 0  # the earlier bands bound later
    assert search.gpu_s is not None and search.gpu_s > 0
    assert search.timed == []  # none asked
    # Every trial is timed at its steps' ends: the capacity profiles' 2 steps give one step after
    # the first.
    assert all(t.first_step_end_s > 0 and t.step_after_first_s > 0 and t.decode_s >= 0
               for t in attempt.capacity_trials if t.outcome == "fit")
    # Nothing left to search: a re-run runs no trial.
    before = len(attempt.capacity_trials)
    code, out = capacity(project)
    assert code == 0 and "searched already" in out, out
    _, [again] = attempts(project)
    assert len(again.capacity_trials) == before
    # A timed request asked after the bands: one runner runs it alone, at the largest count with
    # the pool at the ceiling, no trial again; asked again, it is on record.
    code, out = capacity(project, "--speed-steps", "3")
    assert code == 0 and "timed: 4 ref(s), 3 steps: fit" in out, out
    _, [again] = attempts(project)
    [timed] = again.capacity[0].timed
    assert (timed.reference_count, timed.num_inference_steps, timed.limit_mib, timed.outcome,
            timed.lifetime) == (4, 3, 12288, "fit", 1)
    assert timed.step_after_first_s > 0 and timed.first_step_end_s > 0
    assert timed.wall_s >= timed.first_step_end_s + 2 * timed.step_after_first_s
    assert len(again.capacity_trials) == before
    code, out = capacity(project, "--speed-steps", "3")
    assert code == 0 and "searched already" in out, out
    # Another profile setting or grid: the attempt's bands would mean two things, so the resume
    # is refused, naming each difference, before any runner starts; the evidence stays as it was.
    recorded = {p: p.read_bytes() for p in (project.evidence_dir / HOST).rglob("*") if p.is_file()}
    hosts = project.hosts_file.read_text()
    block = hosts[hosts.index("[diffusers_profiles.tiny-cpu]"):]
    project.hosts_file.write_text(hosts.replace(block, block.replace(
        "use_kv_cache = true", "use_kv_cache = false", 1)))
    code, out = capacity(project, "--resolution-mib", "512")
    assert code == 3, out
    assert "tiny-cpu: use_kv_cache: True -> False" in out, out
    assert "tiny-cpu: search resolution_mib: 256 -> 512" in out, out
    assert "--fresh" in out and "starting the runner" not in out, out
    assert {p: p.read_bytes() for p in (project.evidence_dir / HOST).rglob("*")
            if p.is_file()} == recorded


# A double of a pipeline whose failed call leaves memory allocated, as Qwen-Image-2.1's VAE does
# (its feature cache), on the CPU: the engine's device readings come from the double (held_mib,
# the engine's injection point), and a leftover makes the next call fail early. The VAE's
# clear_cache releases it, except the first failure's (a leftover recovery cannot reach: the
# runner closes, a fresh one takes the search up); and the second call that fits leaks after it
# (the next trial starts dirty: set aside, recovered, run again). Failures and fits are counted
# across runners in a file, each runner being its own process.
LEAKY = textwrap.dedent('''
    import json, os, pathlib, random, sys, diffusers, torch
    engine = sys.modules["omniprobe_engine.diffusers_engine"]
    real = diffusers.QwenImage21Pipeline.__call__
    noise = random.Random(7)
    NEED, BASE_MIB, LEFTOVER_MIB = {need!r}, 500.0, 1800.0
    COUNTS = pathlib.Path({counts!r})
    left = [0.0]

    def counted(key):
        seen = json.loads(COUNTS.read_text()) if COUNTS.exists() else {{}}
        seen[key] = seen.get(key, 0) + 1
        COUNTS.write_text(json.dumps(seen))
        return seen[key]

    engine.held_mib = lambda torch, device: (BASE_MIB + left[0], BASE_MIB + left[0] + 64.0)

    def call(self, *args, image=None, **kwargs):
        limit = int(os.environ["OMNIPROBE_POOL_LIMIT_MIB"])
        need = NEED[len(image or [])] + noise.choice((-{noise}, 0, {noise})) + left[0]
        if limit < need:
            left[0] = LEFTOVER_MIB if counted("failures") > 1 else LEFTOVER_MIB + 1.0
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of "
                f"{{limit / 1024:.2f}} GiB of which 0 bytes is free.")
        out = real(self, *args, image=image, **kwargs)
        if counted("fits") == 2:
            left[0] = LEFTOVER_MIB
        return out
    diffusers.QwenImage21Pipeline.__call__ = call

    clear = diffusers.AutoencoderKLQwenImage21.clear_cache
    def clear_cache(self):
        clear(self)
        if left[0] != LEFTOVER_MIB + 1.0:  # the first failure's leftover stays
            left[0] = 0.0
    diffusers.AutoencoderKLQwenImage21.clear_cache = clear_cache
''')


def test_a_trial_starts_clean_or_is_set_aside_and_a_band_is_earned_at_every_count(
        project, tmp_path, monkeypatch):
    pipeline_double(tmp_path, monkeypatch, LEAKY.format(need=NEED_MIB, noise=NOISE_MIB,
                                                        counts=str(tmp_path / "counts.json")))
    code, out = capacity(project)
    assert code == 0, out
    _, [attempt] = attempts(project)
    [search] = attempt.capacity
    trials = attempt.capacity_trials
    assert all(t.start_allocated_mib is not None and t.start_reserved_mib is not None
               for t in trials)
    # The first failure's leftover: recovery could not reach the build's state, so a fresh
    # runner took the search up, its own log and lifetime beside the first's.
    [restart] = search.restarts
    assert "did not recover from the failure" in restart and "1,801 MiB over" in restart, restart
    assert len(search.logs) == 2 and {t.lifetime for t in trials} == {0, 1}
    # The second fit's leak: the next trial started dirty, was set aside, and ran again clean.
    aside = [t for t in trials if not t.counts]
    assert aside and all("it started dirty" in t.set_aside and t.start_allocated_mib > 500 + 128
                         for t in aside), [t.set_aside for t in aside]
    assert all(t.start_allocated_mib <= 500 for t in trials if t.counts)
    assert [b.reference_count for b in search.bands] == [0, 1, 2, 3, 4]
    for band in search.bands:
        need = NEED_MIB[band.reference_count]
        counted = [t for t in trials if t.counts and t.reference_count == band.reference_count]
        # Earned at its count: a failure at B and a fit at A, each with its repeat.
        assert {t.outcome for t in counted if t.limit_mib == band.fails_at_mib} == {"oom"}
        assert {t.outcome for t in counted if t.limit_mib == band.fits_at_mib} == {"fit"}
        assert len([t for t in counted if t.limit_mib == band.fails_at_mib]) >= 2
        assert not band.fails_at_inferred
        assert need - NOISE_MIB - 256 <= band.fails_at_mib < need + NOISE_MIB, band
        assert need - NOISE_MIB <= band.fits_at_mib <= need + NOISE_MIB + 256, band
        assert band.trials == len(counted)


@pytest.mark.parametrize("flags, field", [
    (["--floor-mib", "8192", "--ceiling-mib", "8192"], "--floor-mib"),
    (["--floor-mib", "9000", "--ceiling-mib", "4096"], "--floor-mib"),
    (["--resolution-mib", "40000"], "--resolution-mib"),
])
def test_a_search_grid_that_cannot_be_one_is_refused_before_any_work(project, flags, field):
    code, out = in_process(project, ["probe-capacity", "--host", HOST, *flags])
    assert code == 2 and field in out and "expected" in out, out
    assert not (project.evidence_dir / HOST).exists()  # refused before any attempt existed


# A test double of an upstream failure that is no lack of memory: at the request with one
# condition image, the pipeline raises the error diffusers 0.42.1 with torchao 0.18.0 raises when
# leaf offload with streams and low_cpu_mem_usage pins an int8 tensor on the fly (diffusers-facts),
# from a frame in diffusers' group offloading hooks, as the real one is raised.
CANNOT_PIN_AT_ONE = textwrap.dedent('''
    import os, diffusers
    hooks = os.path.join(os.path.dirname(diffusers.__file__), "hooks", "group_offloading.py")
    scope = {}
    exec(compile("def _pinned_memory_tensors():\\n"
                 "    raise RuntimeError(\\"cannot pin 'torch.cuda.CharTensor' only dense CPU "
                 "tensors can be pinned\\")\\n", hooks, "exec"), scope)
    real = diffusers.QwenImage21Pipeline.__call__
    def call(self, *args, image=None, **kwargs):
        if image is not None and len(image) == 1:
            scope["_pinned_memory_tensors"]()
        return real(self, *args, image=image, **kwargs)
    diffusers.QwenImage21Pipeline.__call__ = call
''')


def test_an_upstream_failure_is_recorded_with_its_text_and_where_it_was_raised_never_as_an_oom(
        project, tmp_path, monkeypatch):
    pipeline_double(tmp_path, monkeypatch, CANNOT_PIN_AT_ONE)
    code, out = offline(project, "--profile", "tiny-cpu", "--fixture", "standin-t2i",
                        "--fixture", "standin-single", "--fixture", "standin-pair")
    assert code == 0, out
    loaded, [attempt] = attempts(project)
    t2i, single, pair = attempt.offline_requests
    assert (t2i.outcome, pair.outcome) == ("ok", "ok")  # the pipeline went on after it
    assert single.outcome == "error" and single.oom is None
    assert "cannot pin 'torch.cuda.CharTensor' only dense CPU tensors can be pinned" in single.error
    assert single.cause.kind == "server"  # upstream's code, neither the card nor its host
    assert "diffusers/hooks/group_offloading.py:2 in _pinned_memory_tensors" in single.cause.reason
    runs = host_runs(HOST, loaded.evidence, loaded.fixtures)
    [run] = runs
    cell = run.cell(1)
    assert not cell.fits and cell.upstream_failure == single.cause.reason
    # Never the card's answer: the one reference count it ran is not measured, not a no.
    assert card_capacity(HOST, runs, None, 1).verdict == "not measured"
    assert card_capacity(HOST, runs, None, 2).verdict == "fits"


# The same failure raised while the pipeline is built (as pre-pinning an int8 tensor would, when
# group offload is applied): the build is upstream's failure, not the card's nor its host's.
CANNOT_PIN_AT_BUILD = textwrap.dedent('''
    import os, diffusers
    hooks = os.path.join(os.path.dirname(diffusers.__file__), "hooks", "group_offloading.py")
    scope = {}
    exec(compile("def _init_cpu_param_dict():\\n"
                 "    raise RuntimeError(\\"cannot pin 'torch.cuda.CharTensor' only dense CPU "
                 "tensors can be pinned\\")\\n", hooks, "exec"), scope)
    def init(self, *args, **kwargs):
        scope["_init_cpu_param_dict"]()
    diffusers.QwenImage21Pipeline.__init__ = init
''')


def test_a_build_that_fails_upstream_is_recorded_as_upstreams_and_asks_nothing_of_the_card(
        project, tmp_path, monkeypatch):
    pipeline_double(tmp_path, monkeypatch, CANNOT_PIN_AT_BUILD)
    code, out = offline(project, "--profile", "tiny-cpu", "--fixture", "standin-t2i")
    loaded, [attempt] = attempts(project)
    [init] = [r.init for r in attempt.offline]
    assert (init.outcome, init.oom) == ("error", None), out
    assert init.cause.kind == "server"
    assert "diffusers/hooks/group_offloading.py:2 in _init_cpu_param_dict" in init.cause.reason
    assert "cannot pin" in init.cause.reason
    [run] = host_runs(HOST, loaded.evidence, loaded.fixtures)
    assert run.init_upstream_failure == init.cause.reason
    assert card_capacity(HOST, [run], None, 0).verdict == "not measured"


@pytest.mark.parametrize(("parameters", "ram_gib", "refused"), [
    # Issue 35 class 8: sized before it is built, against the machine's own RAM.
    ({"text_encoder": 8_767_100_000, "transformer": 7_115_100_000}, 128, False),  # the real one
    ({"transformer": 10**12}, 128, True),  # about 10^12 parameters: a TB even at int8
    ({"transformer": 10**12}, 2048, False),
    ({"transformer": 40 * 2**30}, 32, True),
    ({"transformer": 40 * 2**30}, None, False),  # the RAM unknown: not refused on a guess
    ({}, 1, False),
])
def test_a_random_build_larger_than_the_machine_is_refused_before_it_starts(parameters,
                                                                             ram_gib, refused):
    from omniprobe.harness.offline.build_size import build_size_refusal

    why = build_size_refusal(parameters, ram_gib and ram_gib * 2**30, "models/x")
    assert (why is not None) is refused
    if refused:
        assert "models/x" in why and f"{ram_gib:,.1f} GiB of RAM" in why


def test_the_tiny_build_is_sized_by_the_runner_and_refused_on_a_machine_too_small(
        project, monkeypatch):
    from omniprobe.harness.offline import session as offline_session

    monkeypatch.setattr(offline_session, "machine_ram_bytes", lambda: 1024)
    code, out = offline(project, "--profile", "tiny-cpu")
    assert code == 3 and "more than this machine's 0.0 GiB of RAM" in out, out
    assert "models/qwen-image-2.1/tiny" in out
    assert not (project.evidence_dir / HOST).exists()
