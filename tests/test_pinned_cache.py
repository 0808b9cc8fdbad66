"""The conditioning cache pinned on the host against an emulated host's RAM cap
(config/pinned_cache.py): refused before any build where the cache alone outgrows the cap."""

import json

import pytest

from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.config.hosts import load_hosts
from omniprobe.config.pinned_cache import (
    architecture_bytes_per_token,
    pinned_block_bytes,
    pinned_cache_bytes,
    pinned_cache_problems,
)
from omniprobe.errors import InputError
from omniprobe.harness.offline.matrix import offline_matrix

from .conftest import REPO, in_process, make_project

QWEN = json.loads((REPO / "models/qwen-image-2.1/full/transformer.json").read_text())["config"]
GIB = 2**30


@pytest.mark.parametrize("size, block", [(1, 1), (2, 2), (3, 4), (128 * 2**20, 128 * 2**20),
                                         (128 * 2**20 + 1, 256 * 2**20)])
def test_a_pinned_block_rounds_up_to_a_power_of_two(size, block):
    assert pinned_block_bytes(size) == block


@pytest.mark.parametrize("resolution, references, gib", [
    # 1024²: 4,096 tokens a reference, 8 KiB per token per tensor; 64 tensors
    (1024, 1, 2.0), (1024, 4, 8.0),
    (1024, 3, 8.0),   # 96 MiB a tensor rounds to 128 MiB
    (512, 4, 2.0),
])
def test_the_pinned_cache_of_the_seeds_dit(resolution, references, gib):
    assert architecture_bytes_per_token(QWEN) == 512 * 1024  # the report's 512 KiB per token
    assert pinned_cache_bytes(QWEN, "bfloat16", resolution, references) == gib * GIB


def profile(placement):
    return DiffusersProfile(description="d", offload="group-leaf", use_stream=True,
                            use_kv_cache=True, kv_placement=placement)


@pytest.mark.parametrize("placement, ram_gib, refused", [
    ("host-pinned", 6, True),      # 8 GiB pinned at 4 references under a 6 GiB cap
    ("host-pinned", 8, False),     # exactly the cap: no refusal on the cache alone
    ("host-pageable", 6, False),   # pageable memory can page
    ("gpu", 6, False),
    ("host-pinned", None, False),  # no cap: nothing to hold it against
])
def test_pinned_cache_over_a_host_ram_cap_is_refused(placement, ram_gib, refused):
    problems = pinned_cache_problems({"p": profile(placement)}, QWEN, {"p": 1024}, 4, ram_gib,
                                     "h", "hosts.toml")
    assert bool(problems) is refused
    if refused:
        (p,) = problems
        assert (p.file, p.path) == ("hosts.toml", "[diffusers_profiles.p] key 'kv_placement'")
        assert "at least 8.0 GiB, more than host h's 6 GiB RAM cap" in p.message
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
