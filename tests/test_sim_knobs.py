"""The simulated model's knobs: offline kwargs, deploy config extras and the conditioning KV."""

from __future__ import annotations

import json

import numpy as np
import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.sim import images
from omniprobe.sim.__main__ import main as sim_main
from omniprobe.sim.knobs import DeployConfigError, deploy_extras, flags_from_kwargs
from omniprobe.sim.model import Flags, UnsupportedFlags, reference_cost_mib, request_peak_mib


@pytest.fixture
def cap(repo):
    return load_hosts(repo.hosts_file).hosts["sim"].capacity


def test_kwargs_map_onto_the_server_flags():
    assert flags_from_kwargs({}) == Flags("bf16", False, False, "auto")
    assert flags_from_kwargs({"enforce_eager": True, "enable_cpu_offload": True,
                              "quantization": "fp8"}) == Flags("fp8", True, False, "auto")
    assert flags_from_kwargs({"quantization_config": {"method": "int8"},
                              "enable_layerwise_offload": True,
                              "extras": {"prefix_kv_cache_dtype": "fp8_v"}}
                             ) == Flags("int8", False, True, "fp8_v")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"vae_use_tiling": True}, "kwarg\\(s\\) vae_use_tiling are not in the capacity model"),
    ({"quantization_config": {"transformer": {"method": "fp8"}}},
     "quantization_config .* is not in the capacity model"),
    ({"extras": {"auxiliary_text_encoder": "x"}}, "extras key\\(s\\) auxiliary_text_encoder"),
    ({"extras": "fp8_v"}, "extras must be a table"),
])
def test_what_the_capacity_model_lacks_is_named(kwargs, message):
    with pytest.raises(UnsupportedFlags, match=message):
        flags_from_kwargs(kwargs)


def test_fp8_v_saves_a_quarter_of_the_kv_and_four_references_still_do_not_fit(cap):
    budget = cap.vram_mib - cap.context_mib
    bf16 = Flags("bf16", True, False)
    fp8v = Flags("bf16", True, False, "fp8_v")
    assert reference_cost_mib(cap, bf16) - reference_cost_mib(cap, fp8v) == cap.kv_reference_mib // 4
    assert request_peak_mib(cap, fp8v, 3) <= budget < request_peak_mib(cap, fp8v, 4)
    with pytest.raises(UnsupportedFlags, match="prefix_kv_cache_dtype 'int4'"):
        reference_cost_mib(cap, Flags("bf16", True, False, "int4"))


def test_kv_rounding_changes_pixels_but_not_the_picture():
    picture = images.sound("p", [], 2301, 96, 64)
    rounded = images.kv_rounding(picture, "fp8_v", 2301)
    diff = np.asarray(rounded).astype(int) - np.asarray(picture).astype(int)
    assert diff.any() and np.abs(diff).max() <= 2 and (diff[..., 3] == 0).all()
    assert images.png(rounded) == images.png(images.kv_rounding(picture, "fp8_v", 2301))


def test_deploy_extras_read_the_stage_extras(tmp_path, repo):
    assert deploy_extras(str(repo.root / "deploy" / "sim-kvfp8v.yaml")) == {
        "prefix_kv_cache_dtype": "fp8_v"}
    bad = tmp_path / "bad.yaml"
    for text, message in [
        ("stages:\n  - stage_id: 0\n", "reads only YAML written as JSON; line 1 column 1"),
        ('{"stages": []}', "expected a non-empty top-level 'stages' list"),
        ('{"stages": [{"engine_extras": {"extras": 3}}]}', "stages\\[0\\].engine_extras.extras"),
    ]:
        bad.write_text(text)
        with pytest.raises(DeployConfigError, match=message):
            deploy_extras(str(bad))
    with pytest.raises(DeployConfigError, match="file not found"):
        deploy_extras(str(tmp_path / "absent.yaml"))


def test_the_sim_server_refuses_a_deploy_config_it_cannot_read(tmp_path, repo, capsys):
    bad = tmp_path / "deploy.yaml"
    bad.write_text(json.dumps({"stages": [{"engine_extras": {"extras": {"other": 1}}}]}))
    code = sim_main(["serve", "m", "--omni", "--hosts-file", str(repo.hosts_file), "--sim-host",
                     "sim", "--deploy-config", str(bad)])
    assert code == 2
    assert "stages[].engine_extras.extras key(s) other are not in the capacity model" in (
        capsys.readouterr().err)
