"""The conditioning cache pinned on the host against an emulated host's RAM cap
(config/pinned_cache.py): refused before any build where the cache alone outgrows the cap."""

import json

import pytest

from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.config.hosts import load_hosts
from omniprobe.config.pinned_cache import (
    architecture_bytes_per_token,
    pinned_cache_bytes,
    pinned_cache_problems,
)
from omniprobe.errors import InputError
from omniprobe.harness.offline.matrix import offline_matrix
from omniprobe_engine.pinned_slabs import packed_bytes, power_of_two_ceil, slab_bytes

from .conftest import REPO, in_process, make_project

QWEN = json.loads((REPO / "models/qwen-image-2.1/full/transformer.json").read_text())["config"]
KLEIN_KV = json.loads((REPO / "models/flux2-klein-kv/9b/transformer.json").read_text())["config"]
GIB = 2**30


@pytest.mark.parametrize("size, block", [(1, 1), (2, 2), (3, 4), (128 * 2**20, 128 * 2**20),
                                         (128 * 2**20 + 1, 256 * 2**20)])
def test_a_pinned_block_rounds_up_to_a_power_of_two(size, block):
    assert power_of_two_ceil(size) == block


MIB = 2**20
MEASURED_4_REFS = 8_740_405_248 // 64  # bytes a tensor: the H100's cache at 4 references


@pytest.mark.parametrize("tensor_bytes, to_come, slab", [
    (128 * MIB, 64, 8 * GIB),                 # the cache exactly a power of two: one slab
    (96 * MIB, 64, 4 * GIB),                  # 6 GiB to come: the 4 GiB it fills, not 8
    (96 * MIB, 1, 128 * MIB),                 # the last tensor: its own block
    (MEASURED_4_REFS, 64, 8 * GIB),           # 8.14 GiB to come: 8 GiB holds 62 of them
    (MEASURED_4_REFS, 2, 256 * MIB),          # 260 MiB: 512 wastes more than a tensor
    (MEASURED_4_REFS, 1, 256 * MIB),
])
def test_a_slab_is_the_power_of_two_the_tensors_to_come_fill(tensor_bytes, to_come, slab):
    assert slab_bytes(tensor_bytes, to_come * tensor_bytes) == slab


@pytest.mark.parametrize("tensor_bytes, tensors, blocks_gib, packed_gib", [
    (128 * MIB, 64, 8.0, 8.0),            # a power of two a tensor: packing changes nothing
    (96 * MIB, 64, 8.0, 6.125),           # 3 references: 4 GiB + 2 GiB + 128 MiB
    (MEASURED_4_REFS, 64, 16.0, 8.5),     # the H100's 16.0 GiB, against 8 GiB + 2 x 256 MiB
])
def test_packed_the_cache_pins_about_its_own_bytes(tensor_bytes, tensors, blocks_gib, packed_gib):
    assert tensors * power_of_two_ceil(tensor_bytes) == blocks_gib * GIB
    assert packed_bytes(tensor_bytes, tensors) == packed_gib * GIB


@pytest.mark.parametrize("resolution, references, gib, packed_gib", [
    # 1024²: 4,096 tokens a reference, 8 KiB per token per tensor; 64 tensors
    (1024, 1, 2.0, 2.0), (1024, 4, 8.0, 8.0),
    (1024, 3, 8.0, 6.125),  # 96 MiB a tensor rounds to 128 MiB; packed, 4 + 2 GiB + 128 MiB
    (512, 4, 2.0, 2.0),
])
def test_the_pinned_cache_of_the_seeds_dit(resolution, references, gib, packed_gib):
    assert architecture_bytes_per_token(QWEN) == 512 * 1024  # the report's 512 KiB per token
    # klein 9B KV's cache spans its 8 double- and 24 single-stream blocks: the same 512 KiB
    assert architecture_bytes_per_token(KLEIN_KV) == 512 * 1024
    assert pinned_cache_bytes(KLEIN_KV, "bfloat16", resolution, references) == gib * GIB
    assert pinned_cache_bytes(QWEN, "bfloat16", resolution, references) == gib * GIB
    assert pinned_cache_bytes(QWEN, "bfloat16", resolution, references, packed=True) == (
        packed_gib * GIB)


def profile(placement):
    return DiffusersProfile(description="d", offload="group-leaf", use_stream=True,
                            use_kv_cache=True, kv_placement=placement)


@pytest.mark.parametrize("placement, references, ram_gib, refused", [
    ("host-pinned", 4, 6, "8.0"),          # 8 GiB pinned at 4 references under a 6 GiB cap
    ("host-pinned", 4, 8, None),           # exactly the cap: no refusal on the cache alone
    ("host-pinned", 3, 7, "8.0"),          # 3 references: 64 blocks rounded to 128 MiB
    ("host-pinned-packed", 3, 7, None),    # packed: 6.1 GiB
    ("host-pinned-packed", 4, 6, "8.0"),
    ("host-pageable", 4, 6, None),         # pageable memory can page
    ("gpu", 4, 6, None),
    ("host-pinned", 4, None, None),        # no cap: nothing to hold it against
])
def test_pinned_cache_over_a_host_ram_cap_is_refused(placement, references, ram_gib, refused):
    problems = pinned_cache_problems({"p": profile(placement)}, QWEN, {"p": 1024}, references,
                                     ram_gib, "h", "hosts.toml")
    assert bool(problems) is bool(refused)
    if refused:
        (p,) = problems
        assert (p.file, p.path) == ("hosts.toml", "[diffusers_profiles.p] key 'kv_placement'")
        assert f"at least {refused} GiB, more than host h's {ram_gib} GiB RAM cap" in p.message
        assert "expected 'host-pageable'" in p.message


def test_the_offline_plan_refuses_it_before_any_build(repo):
    cfg = load_hosts(repo.hosts_file)
    name = "rtx5080-on-h200-diffusers"
    host = cfg.host(name)
    pinned = host.model_copy(update={
        "diffusers_profiles": [*host.diffusers_profiles, "group-leaf-kv-host-pinned"]})
    small = pinned.model_copy(update={
        "emulation": host.emulation.model_copy(update={"host_ram_gib": 6.0})})
    with pytest.raises(InputError) as refused:
        offline_matrix(cfg, repo, name, small, ("group-leaf-kv-host-pinned",))
    assert "[diffusers_profiles.group-leaf-kv-host-pinned] key 'kv_placement'" in str(refused.value)
    # under its own 30 GiB cap the 8 GiB cache is no refusal
    entries, _, _ = offline_matrix(cfg, repo, name, pinned, ("group-leaf-kv-host-pinned",))
    assert [e.name for e in entries] == ["group-leaf-kv-host-pinned"]


def test_probe_offline_refuses_it_with_exit_2_before_any_attempt(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    text = project.hosts_file.read_text()
    host = "rtx5080-on-h200-diffusers"
    table = text.index(f"[hosts.{host}.emulation]")
    ram = text.index("host_ram_gib = ", table)
    text = text[:ram] + "host_ram_gib = 6 #" + text[ram + len("host_ram_gib = "):]
    at = text.index("card-emulations = [") + len("card-emulations = [")  # the host's list
    project.hosts_file.write_text(text[:at] + '"group-leaf-kv-host-pinned", ' + text[at:])
    folder = project.evidence_dir / host
    before = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
    code, out = in_process(project, ["probe-offline", "--host", host,
                                     "--profile", "group-leaf-kv-host-pinned"])
    assert code == InputError.exit_code, out
    assert "[diffusers_profiles.group-leaf-kv-host-pinned] key 'kv_placement'" in out
    assert "Traceback" not in out
    assert (sorted(p.name for p in folder.iterdir()) if folder.exists() else None) == before
