"""What one setting buys (analysis/knob_deltas.py), as a table that reads like the report's: a
profile, its base, the bands at each count (B, A in MiB) and the timed requests."""

import pytest

from omniprobe.analysis.capacity_bands import Searched
from omniprobe.analysis.knob_deltas import (
    PoolSaved,
    knob_deltas,
    one_setting_apart,
    pool_saved,
    time_cost,
)
from omniprobe.evidence.models.capacity import (
    CapacityBand,
    ProfileSearch,
    SearchSettings,
    TimedRequest,
)

# A recorded setting missing (recorded before it existed) reads as its default.
LEAF = {"description": "leaf", "offload": "group-leaf", "use_stream": True, "use_kv_cache": True,
        "vae_tiling": False, "chosen_by_omniprobe": ["offload", "use_stream"]}


def searched(name, settings, bands, timed=()):
    return Searched("a", "h200-diffusers", ProfileSearch(
        profile=name, settings=settings,
        search=SearchSettings(floor_mib=1024, ceiling_mib=32768, resolution_mib=256, repeats=2),
        num_inference_steps=2, true_cfg_scale=1.0, seed=2301, sizes={},
        bands=[CapacityBand(reference_count=refs, fixture=f"f{refs}", fits_at_mib=a,
                            fails_at_mib=b, trials=4, requests_saved=0)
               for refs, (b, a) in bands.items()],
        timed=[TimedRequest(reference_count=4, fixture="f4", num_inference_steps=steps,
                            limit_mib=32768, outcome="fit", wall_s=wall,
                            step_after_first_s=step, decode_s=decode, lifetime=0)
               for steps, wall, step, decode in timed]))


BASE = searched("group-leaf", LEAF, {0: (7936, 8192), 4: (17920, 18176)},
                [(20, 60.0, 2.0, 4.0)])
TILED = searched("group-leaf-tiled", {**LEAF, "description": "tiled", "vae_tiling": True},
                 {0: (3840, 4096), 4: (16896, 17408)}, [(20, 66.0, 2.0, 10.0)])
HOST = searched("group-leaf-kv-host-pinned", {**LEAF, "kv_placement": "host-pinned",
                                               "description": "host"},
                {0: (7936, 8192), 4: (9984, 10240)}, [(20, 90.0, 3.5, 4.0), (2, 9.0, 3.5, 4.0)])
TWO_APART = searched("two", {**LEAF, "vae_tiling": True, "kv_placement": "host-pinned"},
                     {0: (3840, 4096)})


@pytest.mark.parametrize("mine, theirs, knob", [
    (TILED, BASE, ("vae_tiling", True)),
    (HOST, BASE, ("kv_placement", "host-pinned")),
    (BASE, BASE, None),                      # no setting apart
    (TWO_APART, BASE, None),                 # two settings apart: not one knob's doing
])
def test_a_knob_is_the_one_setting_two_profiles_differ_in_their_descriptions_aside(
        mine, theirs, knob):
    assert one_setting_apart(mine.search.settings, theirs.search.settings) == knob


@pytest.mark.parametrize("mine, saved", [
    # count: base A - own A, within both bands' widths
    (TILED, (PoolSaved(0, 4096, 512), PoolSaved(4, 768, 768))),
    (HOST, (PoolSaved(0, 0, 512), PoolSaved(4, 7936, 512))),
])
def test_the_pool_a_knob_saves_is_the_bases_a_less_its_own_within_both_widths(mine, saved):
    assert pool_saved(BASE, mine) == saved


def test_a_count_without_a_b_on_either_side_saves_nothing_said():
    open_band = searched("open", {**LEAF, "vae_tiling": True}, {0: (None, 2048)})
    assert pool_saved(BASE, open_band) == ()


def test_the_time_a_knob_costs_is_ratios_at_the_most_steps_both_timed():
    cost = time_cost(BASE, HOST)
    assert (cost.steps, cost.reference_count) == (20, 4)
    assert (cost.step_ratio, cost.decode_ratio, cost.wall_ratio) == (1.75, 1.0, 1.5)
    assert time_cost(BASE, TWO_APART) is None  # never timed


def test_each_searched_profile_is_held_against_its_searched_base_only():
    searches = {s.search.profile: s for s in (BASE, TILED, HOST, TWO_APART)}
    bases = {"group-leaf-tiled": "group-leaf", "group-leaf-kv-host-pinned": "group-leaf",
             "two": "group-leaf", "group-leaf": None}
    found = knob_deltas(searches, bases)
    assert [(d.profile, d.base, d.knob, d.value) for d in found] == [
        ("group-leaf-tiled", "group-leaf", "vae_tiling", True),
        ("group-leaf-kv-host-pinned", "group-leaf", "kv_placement", "host-pinned")]
    # The base not searched: nothing to hold the profile against.
    assert knob_deltas({"group-leaf-tiled": TILED}, bases) == []


def test_the_spill_line_reads_the_host_placement_against_its_base_and_names_the_best_savers():
    from omniprobe.report.knobs_view import spill_line

    searches = {s.search.profile: s for s in (BASE, TILED, HOST)}
    bases = {"group-leaf-tiled": "group-leaf", "group-leaf-kv-host-pinned": "group-leaf"}
    line = spill_line(knob_deltas(searches, bases), searches)
    assert (line.references, line.pool_mib, line.base_pool_mib, line.saved_mib) == (
        4, 10240, 18176, 7936)
    assert (line.step_ratio, line.steps) == (1.75, 20)
    assert line.pinned_more_gib is None  # no build on record: no host figures to hold
    assert line.most == ['`kv_placement` = "host-pinned"']
    assert (line.most_at_zero, line.most_at_zero_mib) == (["`vae_tiling` = true"], 4096)
    # No host placement searched beside its base: nothing to say.
    without = {"group-leaf": BASE, "group-leaf-tiled": TILED}
    assert spill_line(knob_deltas(without, bases), without) is None


@pytest.mark.parametrize("figures, words", [
    ({"p": "recorded", "b": "recorded"}, "both recorded"),
    ({"p": "recorded", "b": "not recorded"}, "not recorded: `b`"),
    ({"p": "3 of 9 recorded", "b": "not recorded"}, "not recorded: `p`, `b`"),
])
def test_a_saving_says_whether_both_sides_trials_showed_a_clean_start(figures, words):
    from types import SimpleNamespace

    from omniprobe.analysis.knob_deltas import KnobDelta
    from omniprobe.report.knobs_view import starts_words

    searches = {name: SimpleNamespace(start_figures=lambda f=f: f) for name, f in figures.items()}
    assert starts_words(searches, KnobDelta("p", "b", "vae_tiling", True, (), None)) == words
