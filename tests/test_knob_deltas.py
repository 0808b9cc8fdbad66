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
    gpus = {"h200-diffusers": "NVIDIA H200"}
    line = spill_line(knob_deltas(searches, bases), searches, gpus)
    assert (line.references, line.pool_mib, line.base_pool_mib, line.saved_mib) == (
        4, 10240, 18176, 7936)
    assert (line.step_ratio, line.steps, line.gpu) == (1.75, 20, "NVIDIA H200")
    assert line.pinned_more_gib is None  # no build on record: no host figures to hold
    assert line.most == ['`kv_placement` = "host-pinned"']
    assert (line.most_at_zero, line.most_at_zero_mib) == (["`vae_tiling` = true"], 4096)
    # No host placement searched beside its base: nothing to say.
    without = {"group-leaf": BASE, "group-leaf-tiled": TILED}
    assert spill_line(knob_deltas(without, bases), without, gpus) is None


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
    assert starts_words(searches, KnobDelta("p", "b", None, "vae_tiling", True, (), None)) == words


def _on(found, host):
    from dataclasses import replace

    return replace(found, host=host, timed=tuple((host, t) for _, t in found.timed))


def test_a_knob_is_held_against_its_base_on_the_same_machine_where_the_base_ran_there():
    from dataclasses import replace

    # the base on two machines: its H100 search banded 4 references one step higher
    h100_base = _on(searched("group-leaf", LEAF, {0: (7936, 8192), 4: (17920, 18432)},
                             [(20, 64.0, 2.2, 4.0)]), "h100-diffusers")
    base = replace(BASE, elsewhere=(h100_base,),
                   timed=(*BASE.timed, *h100_base.timed))
    host = _on(HOST, "h100-diffusers")
    bases = {"group-leaf-kv-host-pinned": "group-leaf"}
    [delta] = knob_deltas({"group-leaf": base, "group-leaf-kv-host-pinned": host}, bases)
    assert delta.base_host is None  # its own machine's base
    assert [p.saved_mib for p in delta.pool] == [0, 18432 - 10240]
    # walls from one machine only: the H100's, never the H100's against the H200's
    assert (delta.time.host, delta.time.wall_ratio) == ("h100-diffusers", 90.0 / 64.0)
    # a base never searched on the profile's machine: its newest bands, and said so
    [far] = knob_deltas({"group-leaf": BASE, "group-leaf-kv-host-pinned": host}, bases)
    assert far.base_host == "h200-diffusers" and far.pool[-1].saved_mib == 18176 - 10240
    assert far.time is None  # timed on different machines: no ratio


def test_the_pinned_bytes_of_a_count_are_read_where_it_came_first_in_its_runner():
    """torch keeps freed pinned blocks: a runner that ran smaller counts first holds more at 4
    references than one whose first request was the 4-reference one (its timed request, in a
    runner of its own)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from omniprobe.analysis.card_answers import first_request_pinned_mib

    trial = SimpleNamespace(lifetime=0)
    timed = HOST.search.timed[0]
    own_runner = timed.model_copy(update={"lifetime": 1, "pinned_host_peak_mib": 56471.3})
    shared = timed.model_copy(update={"lifetime": 0, "pinned_host_peak_mib": 68775.3})
    for requests, expected in [([own_runner], 56471.3), ([shared], None),
                               ([shared, own_runner], 56471.3)]:
        found = replace(HOST, search=HOST.search.model_copy(update={"timed": requests}),
                        trials=(trial,))
        assert first_request_pinned_mib(found, 4) == expected
        assert first_request_pinned_mib(found, 3) is None


@pytest.mark.parametrize("apart, words", [
    ({}, "`p`, the GPU A (`a`) against the GPU B (`b`): A the same at 0, 1, 4 reference(s)"),
    ({1: 256, 4: 256}, "`p`, the GPU A (`a`) against the GPU B (`b`): A the same at 0 "
                       "reference(s); +256 MiB at 1 and 4"),
    ({0: -256, 1: 256, 4: 512}, "`p`, the GPU A (`a`) against the GPU B (`b`): -256 MiB at 0; "
                                "+256 MiB at 1; +512 MiB at 4"),
])
def test_a_profile_on_two_machines_reads_where_its_bands_agree_and_by_how_much_not(apart, words):
    from omniprobe.analysis.capacity_bands import MachineAgreement
    from omniprobe.report.capacity_view import agreement_words

    gpus = {"a": "GPU A", "b": "GPU B"}
    assert agreement_words(MachineAgreement("p", ("a", "b"), (0, 1, 4), apart), gpus) == words


@pytest.mark.parametrize("aparts, words", [
    ([], None),
    ([{}], "A the same where a profile ran on two"),
    ([{1: 256, 4: 256}, {4: -512}], "A within 512 MiB where a profile ran on two"),
])
def test_the_report_says_in_a_few_words_how_far_a_moved_between_machines(aparts, words):
    from omniprobe.analysis.capacity_bands import MachineAgreement
    from omniprobe.report.capacity_view import agreement_brief

    found = [MachineAgreement("p", ("a", "b"), (0, 1, 4), apart) for apart in aparts]
    assert agreement_brief(found) == words


def test_the_spill_line_holds_the_host_placement_against_the_same_base_its_saving_came_from():
    """The base banded on two machines: the line's base pool is the one on the profile's own
    machine, so its pool, the base's and the saving agree with each other."""
    from dataclasses import replace

    from omniprobe.report.knobs_view import spill_line

    h100_base = _on(searched("group-leaf", LEAF, {0: (7936, 8192), 4: (17920, 18432)}),
                    "h100-diffusers")
    base = replace(BASE, elsewhere=(h100_base,))
    host = _on(HOST, "h100-diffusers")
    searches = {"group-leaf": base, "group-leaf-kv-host-pinned": host}
    bases = {"group-leaf-kv-host-pinned": "group-leaf"}
    line = spill_line(knob_deltas(searches, bases), searches, {})
    assert (line.pool_mib, line.base_pool_mib, line.saved_mib) == (10240, 18432, 18432 - 10240)


def test_of_two_pinned_placements_the_spill_line_reads_the_one_that_pins_less():
    """Pinned one block per tensor and packed into slabs: the line says the placement that needs
    the less page-locked memory beyond its base's, in its own words; without host figures, by
    name (the unpacked one, as before packing existed)."""
    from dataclasses import replace

    from omniprobe.evidence.models.offline import DiffusersBuild
    from omniprobe.report.knobs_view import spill_line

    def built(found, pinned_gib):
        build = DiffusersBuild(parameters_b={}, build_s=1.0, build_path="random-streamed",
                               build_host_peak_mib=pinned_gib * 1024 + 2048,
                               steady_host_mib=pinned_gib * 1024 + 2048,
                               pinned_host_mib=pinned_gib * 1024)
        return replace(found, search=found.search.model_copy(update={"build": build}))

    packed = searched("group-leaf-kv-host-packed",
                      {**LEAF, "kv_placement": "host-pinned-packed", "description": "packed"},
                      {0: (7936, 8192), 4: (9984, 10240)}, [(20, 92.0, 3.6, 4.0)])
    bases = {"group-leaf-kv-host-pinned": "group-leaf", "group-leaf-kv-host-packed": "group-leaf"}
    unmeasured = {s.search.profile: s for s in (BASE, HOST, packed)}
    line = spill_line(knob_deltas(unmeasured, bases), unmeasured, {})
    assert line.where == "pinned host memory"
    measured = {"group-leaf": built(BASE, 39), "group-leaf-kv-host-pinned": built(HOST, 67),
                "group-leaf-kv-host-packed": built(packed, 48)}
    line = spill_line(knob_deltas(measured, bases), measured, {})
    assert (line.where, line.pinned_more_gib) == ("packed pinned host memory", 9.0)
    measured["group-leaf-kv-host-packed"] = built(packed, 70)
    line = spill_line(knob_deltas(measured, bases), measured, {})
    assert (line.where, line.pinned_more_gib) == ("pinned host memory", 28.0)


@pytest.mark.parametrize("base_gib, mine_gib, words", [
    (None, 67, "—"),                                        # a side without host figures
    (39, 67, "+28.0 GiB (+28.0 page-locked)"),              # the cache pinned on the host
    (39, 39, "0.0 GiB (0.0 page-locked)"),                  # a setting of the GPU's alone
    (39, 31.6, "-7.4 GiB (-7.4 page-locked)"),              # weights packed: less pinned
])
def test_what_a_setting_costs_in_host_ram_is_its_searchs_most_less_the_bases(base_gib, mine_gib,
                                                                             words):
    """The knob table's host column: the most each search's runner held (build, trials, timed),
    the profile's less its base's, with the page-locked part beside it; never "-0.0"."""
    from dataclasses import replace

    from omniprobe.evidence.models.offline import DiffusersBuild
    from omniprobe.report.knobs_view import host_more_mib, host_more_words

    def built(found, pinned_gib):
        if pinned_gib is None:
            return found
        build = DiffusersBuild(parameters_b={}, build_s=1.0, build_path="random-streamed",
                               build_host_peak_mib=pinned_gib * 1024 + 2048,
                               steady_host_mib=pinned_gib * 1024 + 2048,
                               pinned_host_mib=pinned_gib * 1024)
        return replace(found, search=found.search.model_copy(update={"build": build}))

    searches = {"group-leaf": built(BASE, base_gib), "group-leaf-kv-host-pinned": built(HOST,
                                                                                        mine_gib)}
    [delta] = knob_deltas(searches, {"group-leaf-kv-host-pinned": "group-leaf"})
    assert host_more_words(host_more_mib(delta, searches)) == words
