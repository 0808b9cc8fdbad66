"""The answer per card and host (analysis/card_answers.py), as tables that read like the report's:
a card, its host's RAM, the searched profiles' bands and host needs, and what runs."""

from types import SimpleNamespace

import pytest

from omniprobe.analysis.card_answers import (
    HOST_SHORT,
    HOST_UNKNOWN,
    MARGIN,
    NO_FIT,
    NOT_SEARCHED,
    RUNS,
    Answer,
    Candidate,
    CardFigures,
    HostNeed,
    answer,
    gpu_fit,
    host_fits,
    host_needs,
    search_host_figures,
)
from omniprobe.evidence.models.capacity import CapacityBand

GIB = 1024


def band(b, a, stopped=None):
    return CapacityBand(reference_count=4, fixture="standin-four", fits_at_mib=a, fails_at_mib=b,
                        trials=4, requests_saved=0, stopped=stopped)


def need(gib, pinned_gib=0, under="p", same=False):
    return HostNeed(gib * GIB, pinned_gib * GIB, under, same)


def cand(name, b, a, wall, host, gives=()):
    return Candidate(name, band(b, a), 256, wall, host, gives)


# The searched profiles as the committed search has them at 4 references (B, A in MiB), with the
# host needs the sweeps measured (GiB, of it pinned).
LEAF = cand("group-leaf", 17920, 18176, 3.09, need(41.9, 39.1, "group-leaf"))
EXPANDABLE = cand("group-leaf-expandable", 14848, 15360, 3.21,
                  need(41.9, 39.1, "group-leaf", same=True))
NOKV = cand("group-leaf-nokv", 7936, 8192, 3.42, need(41.9, 39.1, "group-leaf", same=True),
            ("KV cache off",))
RES512 = cand("group-leaf-res512", 10240, 11264, 2.07, need(41.6, 39.1, "group-leaf-res512"),
              ("references at 512²",))
SEED = cand("seed-baseline-capacity", 7936, 8192, 4.06, need(35.2, 31.0, "seed-baseline", True),
            ("KV cache off", "DiT int8"))
SEARCHED = [LEAF, EXPANDABLE, NOKV, RES512, SEED]

RTX3090 = CardFigures("RTX 3090", 24064, ("overhead",))
RTX5080 = CardFigures("RTX 5080", 15872, ("memory.total", "overhead"))
RTX3060 = CardFigures("RTX 3060 12GB", 11776, ("overhead",))
SOURCED = CardFigures("a card measured on its host", 24064)


@pytest.mark.parametrize("b, a, usable, reading, margin", [
    # usable at or above A by at least the band's width (A - B): runs
    (17920, 18176, 24064, RUNS, 5888),
    (14848, 15360, 15872, RUNS, 512),        # a margin exactly the band's width runs
    (14592, 16640, 17000, MARGIN, 360),      # above A, inside the band's 2,048 width
    (14592, 16640, 15000, MARGIN, -1640),    # between B and A
    (14592, 16640, 14592, NO_FIT, -2048),    # at B
    (None, 8192, 8192 + 255, MARGIN, 255),   # nothing failed: the width is one grid step
    (None, 8192, 8192 + 256, RUNS, 256),
    (30000, None, 80000, NO_FIT, None),      # no A: nothing up to the ceiling fit
])
def test_the_gpu_rule_asks_a_margin_of_the_bands_own_width(b, a, usable, reading, margin):
    fit = gpu_fit(band(b, a), usable, 256)
    assert (fit.reading, fit.margin_mib) == (reading, margin)


def test_a_band_whose_search_stopped_fits_nothing():
    assert gpu_fit(band(None, None, stopped="error"), 80000, 256).reading == NO_FIT


@pytest.mark.parametrize("host, ram_gib, fits", [
    (need(35.2, 31.0), 64, True),
    (need(35.2, 31.0), 32, False),           # the footprint is more than the RAM
    (need(20.0, 31.0), 30, False),           # pinned alone outgrows it: no swap takes it
    (need(30.0, 0.0), 30, True),
    (None, 64, None),                        # not measured: no answer either way
])
def test_the_host_rule_counts_no_swap(host, ram_gib, fits):
    assert host_fits(host, ram_gib * GIB) is fits


# card, host RAM (GiB), candidates -> status, profile, margin, relative speed, grade
@pytest.mark.parametrize("card, ram_gib, found, expected", [
    # the RTX 3090 with 64 GiB: every profile fits both; the fastest is chosen, at 1.0
    (RTX3090, 64, SEARCHED, (RUNS, "group-leaf-res512", 12800, 1.0, "assumed")),
    # with 32 GiB no searched profile's host need fits: the least need is named
    (RTX3090, 32, SEARCHED, (HOST_SHORT, "seed-baseline-capacity", None, None, "assumed")),
    # the RTX 5080 with 64 GiB: group-leaf is short of A, the fastest that fits is res512
    (RTX5080, 64, SEARCHED, (RUNS, "group-leaf-res512", 4608, 1.0, "assumed")),
    # without res512 the fastest of the rest, relative to the fastest GPU fit
    (RTX5080, 64, [LEAF, EXPANDABLE, NOKV, SEED], (RUNS, "group-leaf-expandable", 512, 1.0,
                                                   "assumed")),
    # a card whose margin lies inside the band's width: at the margin, never "runs"
    (CardFigures("RTX 5080", 15500, ()), 64, [EXPANDABLE], (MARGIN, "group-leaf-expandable",
                                                            140, None, "assumed")),
    # a host that holds the GPU fit but not the pinned memory
    (SOURCED, 30, [cand("pinned", 7936, 8192, 2.0, need(25.0, 31.0))],
     (HOST_SHORT, "pinned", None, None, "derived")),
    # a GPU fit whose host need nobody measured: no fit claimed
    (SOURCED, 64, [cand("unmeasured", 7936, 8192, 2.0, None)],
     (HOST_UNKNOWN, "unmeasured", None, None, "derived")),
    # the RTX 3060 at 4 references: nothing fits the GPU, the nearest is named with its shortfall
    (RTX3060, 64, [LEAF, EXPANDABLE], (NO_FIT, "group-leaf-expandable", -3584, None, "assumed")),
    (SOURCED, 64, [], (NOT_SEARCHED, None, None, None, "derived")),
])
def test_the_answer_per_card_and_host(card, ram_gib, found, expected):
    got = answer(card, ram_gib * GIB, 4, found)
    assert (got.status, got.profile, got.margin_mib, got.relative_speed, got.grade) == expected


def test_a_slower_profile_that_fits_the_host_is_chosen_with_its_speed_against_the_gpus_fastest():
    fast_big = cand("fast", 7936, 8192, 2.0, need(60.0, 50.0))
    slow_small = cand("slow", 7936, 8192, 5.0, need(20.0, 0.0), ("KV cache off",))
    got = answer(SOURCED, 32 * GIB, 4, [fast_big, slow_small])
    assert (got.profile, got.relative_speed, got.gives_up) == ("slow", 2.5, ("KV cache off",))
    # with the RAM for both, the fast one
    assert answer(SOURCED, 64 * GIB, 4, [fast_big, slow_small]).profile == "fast"


def test_a_cell_graded_on_an_assumption_names_each():
    got = answer(RTX5080, 64 * GIB, 4, [SEED])
    assert got.grade == "assumed"
    assert got.assumptions == ("memory.total", "overhead",
                               "host need measured under `seed-baseline`, same placement")
    # the same fit on a card whose figures are sourced, under its own measured need: derived
    own = cand("seed-baseline", 7936, 8192, 4.06, need(35.2, 31.0, "seed-baseline"))
    assert answer(SOURCED, 64 * GIB, 4, [own]).grade == "derived"


def test_the_answer_changes_when_the_evidence_does():
    before = answer(RTX3060, 64 * GIB, 4, [LEAF])
    lower = cand("group-leaf", 8000, 8448, 3.09, LEAF.host)
    after = answer(RTX3060, 64 * GIB, 4, [lower])
    assert (before.status, after.status) == (NO_FIT, RUNS)
    assert after.margin_mib == 11776 - 8448


def test_the_openings_words_name_the_counts_a_short_host_leaves_out():
    from omniprobe.report.answers_view import plain_answer

    runs = Answer("c", 32 * GIB, 1, RUNS, "slow", 512, 1.0, (), 20 * GIB)
    short = Answer("c", 32 * GIB, 2, HOST_SHORT, "big", host_need_mib=40 * GIB)
    words = {"slow": "leaf offload, KV cache off", "big": "leaf offload"}
    assert plain_answer([runs, short], words) == (
        "1 reference with leaf offload, KV cache off (`slow`; derived); "
        "2 references: nothing searched runs, for want of host RAM")
    assert plain_answer([short], words) == "nothing searched runs"


def test_a_gpu_at_the_margin_under_a_short_host_is_the_hosts_answer():
    at_margin = cand("expandable", 10752, 11264, 2.0, need(41.9, 39.1))
    got = answer(CardFigures("RTX 5070", 11715), 32 * GIB, 2, [at_margin])
    assert (got.status, got.profile) == (HOST_SHORT, "expandable")
    assert answer(CardFigures("RTX 5070", 11715), 64 * GIB, 2, [at_margin]).status == MARGIN


def test_speed_ranks_by_the_timed_point_most_profiles_share_on_one_machine():
    from dataclasses import replace
    from types import SimpleNamespace

    from omniprobe.analysis.capacity_bands import Searched
    from omniprobe.analysis.card_answers import candidates_at, timed_basis, untimed_at
    from omniprobe.config.diffusers import DiffusersProfile
    from tests.test_knob_deltas import LEAF as SETTINGS
    from tests.test_knob_deltas import searched

    def search(name, trial_wall, timed, host="h200-diffusers"):
        found = searched(name, SETTINGS, {4: (7936, 8192)}, timed)
        # a fitting 2-step trial at 4 references: the fields the trials' ranking reads
        trial = SimpleNamespace(reference_count=4, outcome="fit", wall_s=trial_wall)
        return Searched(found.attempt, host, found.search, trials=(trial,))

    H200 = "h200-diffusers"
    # (steps, wall, step after the first, decode): the 2-step trials say fast is faster; the
    # 20-step requests say the opposite
    fast = search("fast", 3.0, [(20, 90.0, 4.0, 1.0), (2, 9.0, 4.0, 1.0)])
    slow = search("slow", 4.0, [(20, 60.0, 2.5, 1.0)])
    leaf = DiffusersProfile(description="leaf", offload="group-leaf", use_stream=True,
                            use_kv_cache=True)
    profiles = {"fast": leaf, "slow": leaf, "new": leaf}
    assert timed_basis({"fast": fast, "slow": slow}) == (H200, 20, 4)
    walls = {c.profile: c.wall_s for c in candidates_at(
        4, {"fast": fast, "slow": slow}, profiles, {}, 1024, (H200, 20, 4))}
    assert walls == {"fast": 90.0, "slow": 60.0}
    # one profile without a timed request there: the rest still rank by theirs, it after them
    untimed = search("new", 4.0, [])
    three = {"fast": fast, "slow": slow, "new": untimed}
    assert timed_basis(three) == (H200, 20, 4)
    assert untimed_at((H200, 20, 4), three) == ["new"]
    walls = {c.profile: c.wall_s for c in candidates_at(4, three, profiles, {}, 1024,
                                                        (H200, 20, 4))}
    assert walls == {"fast": 90.0, "slow": 60.0, "new": None}
    # timed on another machine only: its wall never ranks against the H200's
    elsewhere = search("new", 4.0, [(20, 30.0, 1.0, 1.0)], host="h100-diffusers")
    assert timed_basis({**three, "new": elsewhere}) == (H200, 20, 4)
    assert untimed_at((H200, 20, 4), {**three, "new": elsewhere}) == ["new"]
    # ... unless the profile was timed there as well, in an older search of it
    both = replace(elsewhere, timed=(*elsewhere.timed, (H200, slow.search.timed[0])))
    assert untimed_at((H200, 20, 4), {**three, "new": both}) == []
    # no timed request anywhere: the trials rank, every profile alike
    bare = {"fast": search("fast", 3.0, []), "slow": search("slow", 4.0, [])}
    assert timed_basis(bare) is None
    walls = {c.profile: c.wall_s for c in candidates_at(4, bare, profiles, {}, 1024, None)}
    assert walls == {"fast": 3.0, "slow": 4.0}
    # a search cut before its first band ranks nowhere, so it keeps no one from the timed basis
    cut = searched("cut", SETTINGS, {})
    assert timed_basis({"fast": fast, "slow": slow, "cut": cut}) == (H200, 20, 4)
    # timed at different points only (20 steps against 2): each point held once, the most
    # steps first
    assert timed_basis({"fast": search("fast", 3.0, [(2, 9.0, 4.0, 1.0)]),
                        "slow": slow}) == (H200, 20, 4)


def test_a_host_need_is_what_was_held_up_to_the_count_asked():
    """A search's runner grows with the count (a cache in host memory): a host that serves up to
    N references needs the most held by requests of up to N, and the build's, never a larger
    request's."""
    from omniprobe.config.diffusers import DiffusersProfile

    def request(refs, peak_gib, pinned_gib):
        return SimpleNamespace(reference_count=refs, host_peak_mib=peak_gib * 1024,
                               pinned_host_peak_mib=pinned_gib * 1024)

    build = SimpleNamespace(build_path="streamed", pinned_host_mib=39 * 1024,
                            build_host_peak_mib=41 * 1024, steady_host_mib=41 * 1024)
    found = SimpleNamespace(
        trials=(request(0, 41, 39), request(1, 45, 43), request(4, 69, 67)), set_aside=(),
        search=SimpleNamespace(build=build, timed=(request(4, 57, 55),)))
    gib = {n: tuple(f / 1024 for f in search_host_figures(found, n)) for n in (0, 1, 3, 4)}
    assert gib == {0: (41, 39), 1: (45, 43), 3: (45, 43), 4: (69, 67)}
    assert search_host_figures(found) == search_host_figures(found, 4)
    leaf = DiffusersProfile(description="leaf", offload="group-leaf", use_stream=True,
                            use_kv_cache=True, kv_placement="host-pinned")
    at_one = host_needs([], {"p": leaf}, {"p": found}, up_to=1)["p"]
    assert at_one.most_mib == 45 * 1024
    assert host_needs([], {"p": leaf}, {"p": found})["p"].most_mib == 69 * 1024
