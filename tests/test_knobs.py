"""Every Diffusers knob once (omniprobe_engine/knobs.py): the profile model is made from the table,
the engine and the analysis read it, and a profile may name a base whose settings it changes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from omniprobe.analysis.calibration import placement
from omniprobe.config.diffusers import DiffusersProfile, DiffusersProfileDefaults, with_bases
from omniprobe.config.hosts import load_hosts
from omniprobe_engine.knobs import (
    GPU_MEMORY,
    HOST_MEMORY,
    KNOBS,
    REQUIRED,
    SPEED,
    host_footprint_knobs,
    setting,
)

from .conftest import REPO

PROSE = ("description", "chosen_by_omniprobe", "seed_says")


def test_the_profile_model_has_one_field_per_knob_and_its_words():
    assert list(DiffusersProfile.model_fields) == ["description", "base",
                                                   *(k.name for k in KNOBS), *PROSE[1:]]
    for knob in KNOBS:
        field = DiffusersProfile.model_fields[knob.name]
        assert field.description == knob.description, knob.name
        assert field.is_required() == (knob.default is REQUIRED), knob.name
        assert set(knob.affects) <= {GPU_MEMORY, HOST_MEMORY, SPEED}, knob.name
        assert knob.applied, knob.name
    sampling = {k.name for k in KNOBS if k.sampling}
    assert set(DiffusersProfileDefaults.model_fields) == {"output_resolution", *sampling,
                                                          "chosen_by_omniprobe"}


def test_every_committed_profile_resolves_to_the_settings_it_had_before_bases():
    """The evidence records each profile's settings (model_dump): a resume compares them, so the
    profiles written with bases must resolve to what they were, key for key and in order; a knob
    added since is at its default in every one of them."""
    before = json.loads((REPO / "tests/data/profiles-before-bases.json").read_text())
    profiles = load_hosts(REPO / "hosts.toml").diffusers_profiles
    for name, was in before.items():
        now = profiles[name].model_dump(mode="json")
        assert {k: v for k, v in now.items() if k in was} == was, name
        assert [k for k in now if k in was] == list(was), name
        added = {k: v for k, v in now.items() if k not in was}
        assert added == {k.name: k.default for k in KNOBS if k.name in added}, name


GROUP_LEAF = {"description": "leaf", "offload": "group-leaf", "use_stream": True,
              "use_kv_cache": True, "chosen_by_omniprobe": ["offload", "use_stream"],
              "seed_says": "quoted"}


@pytest.mark.parametrize(("child", "resolved"), [
    # A setting changed: the base's others kept, its chosen keys kept with the child's added.
    ({"base": "leaf", "description": "no cache", "use_kv_cache": False,
      "chosen_by_omniprobe": ["use_kv_cache"]},
     {"base": "leaf", "description": "no cache", "offload": "group-leaf", "use_stream": True,
      "use_kv_cache": False, "chosen_by_omniprobe": ["offload", "use_stream", "use_kv_cache"]}),
    # A key the base chose that the child sets itself is the child's to mark (here: stated).
    ({"base": "leaf", "description": "blocks", "offload": "group-block"},
     {"base": "leaf", "description": "blocks", "offload": "group-block", "use_stream": True,
      "use_kv_cache": True, "chosen_by_omniprobe": ["use_stream"]}),
    # The child's chosen keys come in the knob table's order, wherever it lists them.
    ({"base": "leaf", "description": "d", "allocator": "expandable_segments:True",
      "offload": "group-block", "chosen_by_omniprobe": ["allocator", "offload"]},
     {"base": "leaf", "description": "d", "offload": "group-block", "use_stream": True,
      "use_kv_cache": True, "allocator": "expandable_segments:True",
      "chosen_by_omniprobe": ["offload", "use_stream", "allocator"]}),
])
def test_a_profile_is_its_bases_settings_with_its_own_on_top_and_its_own_words(child, resolved):
    out = with_bases({"leaf": GROUP_LEAF, "child": child})
    assert out["child"] == resolved  # seed_says and the description are never inherited
    assert out["leaf"] == GROUP_LEAF


def test_a_chain_of_bases_resolves_from_the_root():
    out = with_bases({"c": {"base": "b", "description": "c", "quantize_dit": "int8-weight-only"},
                      "b": {"base": "leaf", "description": "b", "use_stream": False},
                      "leaf": GROUP_LEAF})
    assert out["c"]["use_stream"] is False and out["c"]["offload"] == "group-leaf"
    assert out["c"]["chosen_by_omniprobe"] == ["offload"]


@pytest.mark.parametrize(("profiles", "words"), [
    ({"a": {"base": "nope", "description": "a"}},
     "[diffusers_profiles.a] key 'base': 'nope' is not a profile of [diffusers_profiles]"),
    ({"a": {"base": "a", "description": "a"}}, "a circle of bases, a -> a"),
    ({"a": {"base": "b", "description": "a"}, "b": {"base": "a", "description": "b"}},
     "a circle of bases, a -> b -> a"),
    ({"a": {"base": 3, "description": "a"}}, "key 'base': 3 is not a profile"),
])
def test_a_base_that_is_no_profile_or_a_circle_is_refused_naming_it(profiles, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        with_bases(profiles)


def test_a_profile_with_a_base_still_says_what_it_is():
    with pytest.raises(ValidationError, match="description"):
        DiffusersProfile.model_validate(with_bases({"leaf": GROUP_LEAF,
                                                    "x": {"base": "leaf"}})["x"])


def test_the_engine_reads_a_knobs_default_and_refuses_a_missing_required_one():
    assert setting({"offload": "none"}, "dtype") == "bfloat16"
    assert setting({"dtype": "float32"}, "dtype") == "float32"
    with pytest.raises(KeyError, match="profile lacks 'use_kv_cache'"):
        setting({}, "use_kv_cache")


PROFILES = load_hosts(REPO / "hosts.toml").diffusers_profiles


def test_the_analysis_groups_profiles_by_what_their_knobs_affect():
    assert set(host_footprint_knobs()) == {"dtype", "offload", "use_stream", "low_cpu_mem_usage",
                                           "pinned_weights", "kv_placement", "quantize_dit",
                                           "quantize_text_encoder"}
    assert placement(PROFILES["group-leaf-nokv"]) == placement(PROFILES["group-leaf"])
    assert placement(PROFILES["seed-baseline-te8"]) != placement(PROFILES["seed-baseline-capacity"])


def test_releasing_the_cache_before_the_decode_needs_the_cache():
    base = {"description": "d", "offload": "none", "use_kv_cache": False}
    with pytest.raises(ValidationError, match="release_kv_before_decode = true needs "
                                              "use_kv_cache = true"):
        DiffusersProfile.model_validate({**base, "release_kv_before_decode": True})
    on = DiffusersProfile.model_validate({**base, "use_kv_cache": True,
                                          "release_kv_before_decode": True, "vae_tiling": True})
    assert on.release_kv_before_decode and on.vae_tiling


@pytest.mark.parametrize("placement", ["host-pinned", "host-pageable"])
def test_a_host_placement_of_the_cache_needs_the_cache(placement):
    base = {"description": "d", "offload": "none", "use_kv_cache": False}
    with pytest.raises(ValidationError, match=f"kv_placement = '{placement}' needs use_kv_cache"):
        DiffusersProfile.model_validate({**base, "kv_placement": placement})
    placed = DiffusersProfile.model_validate({**base, "use_kv_cache": True,
                                              "kv_placement": placement})
    assert placed.kv_placement == placement


@pytest.mark.parametrize("base", ["group-leaf", "group-leaf-nokv", "seed-baseline-te8",
                                  "int8-leaf-nostream", "int8-leaf-nostream-te8",
                                  "int8-block-nostream-te8"])
def test_each_tiled_profile_is_its_base_with_the_vae_tiled(base):
    tiled, plain = PROFILES[f"{base}-tiled"], PROFILES[base]
    assert tiled.vae_tiling and not plain.vae_tiling
    differs = {k for k, v in tiled.model_dump().items() if plain.model_dump()[k] != v}
    assert differs == {"vae_tiling", "description", "chosen_by_omniprobe"}
    assert set(tiled.chosen_by_omniprobe) - set(plain.chosen_by_omniprobe) == {"vae_tiling"}
