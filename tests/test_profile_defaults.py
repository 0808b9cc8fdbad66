"""Diffusers profiles share their defaults from one table and hosts name shared profile lists
(issue 36 item 7)."""

from __future__ import annotations

import pytest

from omniprobe.config.diffusers import with_defaults
from omniprobe.config.hosts import load_hosts
from omniprobe.errors import InputError

DEFAULTS = {"output_resolution": 1024, "steps": 2, "true_cfg_scale": 1.0, "seeds": [2301],
            "chosen_by_omniprobe": ["steps", "seeds"]}


@pytest.mark.parametrize(("profile", "expected"), [
    # Taken from the defaults, and marked chosen where the defaults mark them.
    ({"offload": "none", "chosen_by_omniprobe": ["offload"]},
     {"offload": "none", "steps": 2, "true_cfg_scale": 1.0, "seeds": [2301],
      "chosen_by_omniprobe": ["offload", "steps", "seeds"]}),
    # A profile's own values stand, and are not marked by the defaults.
    ({"steps": 20, "seeds": [1, 2], "chosen_by_omniprobe": []},
     {"steps": 20, "seeds": [1, 2], "true_cfg_scale": 1.0, "chosen_by_omniprobe": []}),
    # The condition size is never merged: records keep a profile's own (null) as before.
    ({"steps": 3, "true_cfg_scale": 4.0, "seeds": [7]},
     {"steps": 3, "true_cfg_scale": 4.0, "seeds": [7]}),
    # A malformed table is left for the model to name.
    ("not a table", "not a table"),
])
def test_with_defaults(profile, expected):
    assert with_defaults(profile, DEFAULTS) == expected


def test_the_committed_profiles_state_only_what_differs(repo):
    text = repo.hosts_file.read_text()
    assert text.count("steps = 2\n") == 1 and text.count("seeds = [2301]\n") == 1
    cfg = load_hosts(repo.hosts_file)
    leaf = cfg.diffusers_profiles["group-leaf"]
    assert (leaf.steps, leaf.true_cfg_scale, leaf.seeds) == (2, 1.0, [2301])
    assert leaf.chosen_by_omniprobe == ["offload", "use_stream", "steps", "seeds"]
    assert leaf.output_resolution is None  # as its records have it
    assert cfg.output_resolution("group-leaf") == 1024
    assert cfg.output_resolution("group-leaf-res512") == 512
    assert cfg.diffusers_profiles["seed-baseline"].steps == 20


def test_hosts_naming_one_list_run_its_profiles(repo):
    cfg = load_hosts(repo.hosts_file)
    listed = cfg.diffusers_profile_lists["card-emulations"]
    for name in ("rtx3090-on-h200-diffusers", "rtx5080-on-h200-diffusers"):
        assert cfg.hosts[name].diffusers_profile_list == "card-emulations"
        assert cfg.hosts[name].diffusers_profiles == listed


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('diffusers_profile_list = "card-emulations"', 'diffusers_profile_list = "cards"',
     "[hosts.rtx3090-on-h200-diffusers] key 'diffusers_profile_list': list 'cards' is not "
     "defined under [diffusers_profile_lists]"),
    ('card-emulations = ["model-cpu", ', 'card-emulations = ["turbo", "model-cpu", ',
     "[diffusers_profile_lists] key 'card-emulations': Diffusers profile 'turbo' is not defined"),
    ("[diffusers_profile_defaults]\noutput_resolution = 1024\nsteps = 2\ntrue_cfg_scale = 1.0\n"
     'seeds = [2301]\nchosen_by_omniprobe = ["steps", "seeds"]\n', "",
     "[diffusers_profiles] need a [diffusers_profile_defaults] table"),
    ("output_resolution = 1024\n", "output_resolution = 0\n",
     "[diffusers_profile_defaults] key 'output_resolution': Input should be greater than 0"),
])
def test_bad_defaults_and_lists_are_refused_naming_them(repo_copy, old, new, expected):
    text = repo_copy.hosts_file.read_text()
    assert old in text
    repo_copy.hosts_file.write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as caught:
        load_hosts(repo_copy.hosts_file)
    assert any(expected in str(p) for p in caught.value.problems), caught.value.problems


def test_the_runner_is_given_the_condition_size_its_profile_records_none_of(repo):
    """The recorded profile keeps output_resolution null; the runner's kwargs carry the size
    resolved from [diffusers_profile_defaults] (or the profile's own)."""
    from omniprobe.harness.offline.matrix import offline_matrix

    cfg = load_hosts(repo.hosts_file)
    host = "h200-diffusers"
    entries, _, _ = offline_matrix(cfg, repo, host, cfg.hosts[host],
                                   ("group-leaf", "group-leaf-res512"))
    assert {e.name: (e.kwargs["profile"]["output_resolution"], e.kwargs["output_resolution"])
            for e in entries} == {"group-leaf": (None, 1024), "group-leaf-res512": (512, 512)}
