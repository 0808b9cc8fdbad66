"""The resume rule, one rule for both Diffusers paths: an attempt resumes a profile only under the
settings it recorded (read as today's model reads them), and a capacity search only under the
same grid and search rule; each difference is named, with --fresh."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from omniprobe.config.diffusers import profile_differences
from omniprobe.config.hosts import load_hosts
from omniprobe.evidence.attempts import SettingsChanged
from omniprobe.evidence.models.capacity import ProfileSearch, SearchSettings
from omniprobe.harness.offline.capacity_session import refuse_changed_settings
from omniprobe_engine.search import RULE_VERSION

from .conftest import REPO

CFG = load_hosts(REPO / "hosts.toml")
GROUP_LEAF = CFG.diffusers_profiles["group-leaf"].model_dump(mode="json")
# The committed capacity attempt recorded its profiles before streams were a setting.
RECORDED = {**{k: v for k, v in GROUP_LEAF.items()
               if k not in ("use_stream", "low_cpu_mem_usage", "record_stream",
                            "quantize_text_encoder")}, "offload": "group-leaf-stream"}
GRID = SearchSettings(floor_mib=4096, ceiling_mib=32768, resolution_mib=256, repeats=2)


@pytest.mark.parametrize(("recorded", "now", "differences"), [
    (GROUP_LEAF, GROUP_LEAF, []),
    # Migrated: the old stream offload is group-leaf with streams; settings added since, defaults.
    (RECORDED, GROUP_LEAF, []),
    ({**RECORDED, "offload": "group-block"}, GROUP_LEAF,
     ["offload: 'group-block' -> 'group-leaf'", "use_stream: False -> True"]),
    (GROUP_LEAF, {**GROUP_LEAF, "use_kv_cache": False}, ["use_kv_cache: True -> False"]),
    (GROUP_LEAF, {**GROUP_LEAF, "use_stream": False},
     ["use_stream: True -> False"]),
    (GROUP_LEAF, {**GROUP_LEAF, "steps": 20, "seeds": [1, 2]},
     ["seeds: [2301] -> [1, 2]", "steps: 2 -> 20"]),
    # A profile's words change nothing it builds or runs.
    (GROUP_LEAF, {**GROUP_LEAF, "description": "reworded", "seed_says": "quoted",
                  "chosen_by_omniprobe": []}, []),
])
def test_a_profiles_settings_differ_only_where_todays_model_reads_them_apart(recorded, now,
                                                                            differences):
    assert profile_differences(recorded, now) == differences


def test_the_committed_capacity_attempt_resumes_under_todays_profiles():
    paths = sorted(REPO.glob("evidence/h200-diffusers/*-capacity/capacity.json"))
    assert paths
    for path in paths:
        for search in json.loads(path.read_text())["capacity"]:
            today = CFG.diffusers_profiles[search["profile"]].model_dump(mode="json")
            assert profile_differences(search["settings"], today) == [], search["profile"]


def _store(*searches: ProfileSearch):
    return SimpleNamespace(capacity=list(searches), capacity_trials=[],
                           meta=SimpleNamespace(id="A-capacity"))


def _search(settings: dict, grid: SearchSettings = GRID) -> ProfileSearch:
    return ProfileSearch(profile="group-leaf", settings=settings, search=grid,
                         num_inference_steps=2, true_cfg_scale=1.0, seed=2301, sizes={})


ENTRY = SimpleNamespace(name="group-leaf", kwargs={"profile": GROUP_LEAF})


@pytest.mark.parametrize(("recorded", "grid", "now", "named"), [
    (_search(RECORDED), GRID, GRID, None),
    (_search(RECORDED), GRID, GRID.model_copy(update={"chosen_by": "command line"}), None),
    (_search({**RECORDED, "use_kv_cache": False}), GRID, GRID, ["use_kv_cache: False -> True"]),
    (_search(RECORDED), GRID, GRID.model_copy(update={"resolution_mib": 512}),
     ["search resolution_mib: 256 -> 512"]),
    (_search(RECORDED), GRID, GRID.model_copy(update={"repeats": 1, "floor_mib": 2048}),
     ["search floor_mib: 4096 -> 2048", "search repeats: 2 -> 1"]),
    # A search recorded before the rule had a version ran version 1: a later rule refuses it.
    (_search(RECORDED), GRID, GRID.model_copy(update={"rule": RULE_VERSION + 1}),
     [f"search rule: 1 -> {RULE_VERSION + 1}"]),
])
def test_a_capacity_search_resumes_only_under_the_settings_it_recorded(recorded, grid, now, named):
    store = _store(recorded)
    if named is None:
        refuse_changed_settings(store, [ENTRY], now)
        return
    with pytest.raises(SettingsChanged) as refused:
        refuse_changed_settings(store, [ENTRY], now)
    text = str(refused.value)
    assert "attempt A-capacity ran Diffusers profile(s) 'group-leaf'" in text
    assert all(f"  group-leaf: {line}" in text for line in named), text
    assert "--fresh" in text


def test_a_profile_not_searched_yet_resumes_under_any_settings():
    refuse_changed_settings(_store(), [ENTRY], GRID)


def test_the_rule_version_is_recorded_and_old_searches_read_as_version_one():
    assert SearchSettings.model_validate({"floor_mib": 1, "ceiling_mib": 2, "resolution_mib": 1,
                                          "repeats": 0}).rule == 1
    assert RULE_VERSION >= 1
