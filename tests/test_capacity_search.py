"""The capacity search's rule (omniprobe_engine/search.py) and what its bands say of a card
(analysis/capacity_bands.py), table by table, with no GPU: a trial runner that fits whenever the
pool limit reaches a need, noisy at the boundary as the allocator's history is."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from omniprobe.analysis.capacity_bands import (
    Searched,
    band_verdict,
    newest_searches,
    reference_contradictions,
    sweep_reading,
)
from omniprobe.evidence.models.capacity import (
    CapacityBand,
    CapacityTrial,
    ProfileSearch,
    SearchSettings,
)
from omniprobe.evidence.validate import load_valid_project
from omniprobe_engine.search import (
    FIT,
    OOM,
    Grid,
    SearchError,
    next_guess_mib,
    requests_saved,
    search,
)

GRID = Grid(4096, 32768, 256)


def noisy(need_mib: int, noise_mib: int, seed: int = 1):
    """A trial runner: fits when the limit reaches the need, the need moving by up to
    `noise_mib` from one trial to the next."""
    rnd = random.Random(seed)

    def run(limit: int, phase: str, repeat: bool) -> str:
        return "fit" if limit >= need_mib + rnd.randint(-noise_mib, noise_mib) else "oom"

    return run


@pytest.mark.parametrize("need, noise", [
    (10000, 0), (10000, 200), (13300, 150), (18922, 300), (22390, 100), (4100, 0), (32700, 0),
])
def test_the_band_lies_across_the_boundary_and_every_trial_agrees_with_it(need, noise):
    band = search(noisy(need, noise), GRID, 2)
    assert need - noise <= band.fits_at_mib <= need + noise + GRID.resolution_mib
    assert band.fails_at_mib is None or band.fails_at_mib < need + noise
    assert all(t.outcome == "fit" for t in band.trials if t.limit_mib >= band.fits_at_mib)
    assert all(t.outcome == "oom" for t in band.trials
               if band.fails_at_mib is not None and t.limit_mib <= band.fails_at_mib)
    firsts = [t.limit_mib for t in band.trials if not t.repeat]
    assert len(firsts) == len(set(firsts))  # a limit runs twice only as a repeat
    # Both sides are confirmed: at least `repeats` trials beyond the first at A (and at B).
    assert sum(t.limit_mib == band.fits_at_mib for t in band.trials) >= 3


@pytest.mark.parametrize("need, fits_at, fails_at", [
    (40000, None, 32768),  # nothing up to the ceiling: no A, the ceiling failed
    (3000, 4096, None),  # the floor already fits: no B
])
def test_a_need_outside_the_grid_has_one_side_only(need, fits_at, fails_at):
    band = search(noisy(need, 0), GRID, 2)
    assert (band.fits_at_mib, band.fails_at_mib) == (fits_at, fails_at)


def test_a_trial_that_errors_ends_the_search_without_a_band():
    band = search(lambda limit, phase, repeat: "error", GRID, 2)
    assert (band.fits_at_mib, band.fails_at_mib, band.stopped) == (None, None, "error")
    assert len(band.trials) == 1


def test_a_count_guided_by_the_last_saves_requests_and_keeps_its_band():
    first = search(noisy(10000, 0), GRID, 2)
    guess = next_guess_mib([first.fits_at_mib], GRID.resolution_mib)
    guided = search(noisy(13300, 0), GRID, 2, fail_hint_mib=first.fails_at_mib,
                    first_guess_mib=guess)
    alone = search(noisy(13300, 0), GRID, 2)
    assert (guided.fits_at_mib, guided.fails_at_mib) == (alone.fits_at_mib, alone.fails_at_mib)
    saved = requests_saved(GRID, 2, guided, first.fails_at_mib, guess)
    assert saved == len(alone.trials) - len(guided.trials) > 0


def _earned(band):
    """Each side of the band is a trial of this count: a fit at A, a failure at B, each with its
    repeats agreeing."""
    at_a = [t.outcome for t in band.trials if t.limit_mib == band.fits_at_mib]
    at_b = [t.outcome for t in band.trials if t.limit_mib == band.fails_at_mib]
    return at_a and set(at_a) == {FIT} and at_b and set(at_b) == {OOM}


@pytest.mark.parametrize("need", [8192, 8100, 6000])
def test_a_band_is_earned_at_its_count_even_where_the_neighbours_edge_would_do(need):
    """The need does not grow with the count (no KV cache), or shrinks: the previous count's B
    says where to look, and B is still a failure seen at this count, never the neighbour's."""
    first = search(noisy(8192, 0), GRID, 2)
    second = search(noisy(need, 0), GRID, 2, fail_hint_mib=first.fails_at_mib,
                    first_guess_mib=first.fits_at_mib)
    assert _earned(second), second.trials
    assert second.fails_at_mib < need <= second.fits_at_mib
    assert len([t for t in second.trials if t.limit_mib == second.fails_at_mib]) == 3


@pytest.mark.parametrize("floor, ceiling, resolution, words", [
    (8192, 8192, 256, "at or above the ceiling"),
    (9000, 4096, 256, "at or above the ceiling"),
    (4096, 8192, 0, "resolution 0"),
    (4096, 8192, -256, "resolution -256"),
    (4096, 8192, 4097, "at most the span"),
    (0, 8192, 256, "above 0"),
])
def test_a_grid_that_cannot_be_one_is_refused(floor, ceiling, resolution, words):
    with pytest.raises(SearchError, match=words):
        Grid(floor, ceiling, resolution)


def band(fits_at, fails_at):
    return CapacityBand(reference_count=4, fixture="standin-four", fits_at_mib=fits_at,
                        fails_at_mib=fails_at, trials=5, requests_saved=0)


# The card's usable pool against a band: fits at or above A, not at or below B, else at the
# margin; a pool the search never reached is said as such.
@pytest.mark.parametrize("fits_at, fails_at, usable, verdict, margin, shortfall", [
    (15360, 14848, 15872, "fits", 512, None),
    (15360, 14848, 15360, "fits", 0, None),
    (15360, 14848, 15104, "at the margin", 256, 256),
    (15360, 14848, 14848, "does not fit", None, 512),
    (18176, 17920, 11715, "does not fit", None, 6461),
    (None, 32768, 32607, "does not fit", None, 161),
    (None, 32768, 40000, "not searched so high", None, None),
    (4096, None, 3000, "not searched so low", None, 1096),
])
def test_a_cards_verdict_is_its_usable_pool_against_the_band(fits_at, fails_at, usable, verdict,
                                                              margin, shortfall):
    got = band_verdict(band(fits_at, fails_at), usable, 4096)
    assert (got.verdict, got.margin_mib, got.shortfall_mib) == (verdict, margin, shortfall)


@pytest.mark.parametrize("fits, pool, reading", [
    (True, 16000, "agrees"),  # fit at a pool at or above A
    (True, 15000, "uncertain"),  # between B and A either can happen
    (True, 14000, "contradicts"),  # fit at or below B
    (False, 14000, "agrees"),
    (False, 15000, "uncertain"),
    (False, 16000, "contradicts"),  # OOM at or above A
])
def test_a_sweep_cell_is_held_against_its_band(fits, pool, reading):
    assert sweep_reading(fits, pool, band(15360, 14848)) == reading


@pytest.mark.parametrize("fields, words", [
    ({"fits_at_mib": 8192, "fails_at_mib": 8192}, "must lie above"),
    ({"fits_at_mib": 8192, "fails_at_mib": 9000}, "must lie above"),
])
def test_a_band_whose_sides_cross_is_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        CapacityBand(reference_count=0, fixture="x", trials=1, requests_saved=0, **fields)


def trial(refs, limit, outcome):
    return CapacityTrial(profile="p", reference_count=refs, fixture="f", inputs="stand-in",
                         limit_mib=limit, outcome=outcome, phase="bisect", repeat=False,
                         wall_s=1.0, lifetime=0, **({"error": "OOM"} if outcome == "oom" else {}))


@pytest.mark.parametrize("trials, flagged", [
    # More references fit where fewer failed: the boundary's noise, flagged.
    ([trial(0, 8192, "oom"), trial(1, 8192, "fit")],
     ["`p`: 1 reference(s) fit at 8,192 MiB, where 0 failed at 8,192"]),
    ([trial(0, 8448, "oom"), trial(2, 8192, "fit")],
     ["`p`: 2 reference(s) fit at 8,192 MiB, where 0 failed at 8,448"]),
    # Fewer references fitting in less is what the search takes for granted: nothing to flag.
    ([trial(0, 8192, "fit"), trial(1, 8192, "oom")], []),
    ([trial(0, 8192, "oom"), trial(1, 8448, "fit")], []),
    ([trial(1, 8192, "oom"), trial(1, 8192, "fit")], []),  # one count's noise lies in its band
])
def test_more_references_fitting_in_less_is_flagged(trials, flagged):
    search = ProfileSearch(profile="p", settings={}, search=SearchSettings(
        floor_mib=4096, ceiling_mib=32768, resolution_mib=256, repeats=2),
        num_inference_steps=2, true_cfg_scale=1.0, seed=1, sizes={})
    assert reference_contradictions(Searched("a", "h", search, tuple(trials))) == flagged


def searched(profile, *bands):
    return Searched("a", "h", ProfileSearch(
        profile=profile, settings={}, search=SearchSettings(floor_mib=4096, ceiling_mib=32768,
                                                            resolution_mib=256, repeats=2),
        num_inference_steps=2, true_cfg_scale=1.0, seed=1, sizes={}, bands=list(bands)))


def _band(fits_at, fails_at, inferred=False):
    return CapacityBand(reference_count=1, fixture="f", fits_at_mib=fits_at,
                        fails_at_mib=fails_at, fails_at_inferred=inferred, trials=4,
                        requests_saved=0)


@pytest.mark.parametrize("band, trials, disagreements", [
    (_band(8448, 8192), [trial(1, 8448, "fit"), trial(1, 8192, "oom")], []),
    (_band(8448, 8192), [trial(1, 8448, "fit")],
     ["fails_at_mib 8192: no counted trial failed there"]),
    # Before bands were earned at their count, B was the neighbour's: not tried, and said so.
    (_band(8448, 8192, inferred=True), [trial(1, 8448, "fit")], []),
    (_band(8448, 8192), [trial(1, 8192, "oom")], ["fits_at_mib 8448: no counted trial fit there"]),
    (_band(8448, 8192), [trial(1, 8448, "fit"), trial(1, 8192, "oom"), trial(1, 8704, "oom")],
     ["fits_at_mib 8448: a counted trial at 8704 MiB ended oom"]),
    (_band(8448, 8192), [trial(1, 8448, "fit"), trial(1, 8192, "oom"), trial(1, 7936, "fit")],
     ["fails_at_mib 8192: a counted trial at 7936 MiB fit"]),
    (_band(None, 32768), [trial(1, 32768, "oom")], []),
])
def test_a_band_is_held_to_its_counted_trials(band, trials, disagreements):
    assert band.disagreements(trials) == disagreements


def _searched(bands, trials, aside=(), logs=0):
    from omniprobe.analysis.capacity_bands import Searched
    from omniprobe.evidence.models.capacity import ProfileSearch, SearchSettings

    search = ProfileSearch(profile="p", settings={}, num_inference_steps=2, true_cfg_scale=1.0,
                           seed=1, sizes={}, bands=bands,
                           search=SearchSettings(floor_mib=4096, ceiling_mib=32768,
                                                 resolution_mib=256, repeats=2))
    return Searched("A", "h200", search, tuple(trials), tuple(aside))


def test_a_band_wider_than_two_steps_is_reported_as_noise_with_its_trials():
    from omniprobe.analysis.capacity_bands import noisy_bands

    narrow = _band(8448, 8192)
    wide = CapacityBand(reference_count=2, fixture="f", fits_at_mib=9216, fails_at_mib=8448,
                        trials=6, requests_saved=0)
    found = _searched([narrow, wide], [trial(2, 8448, "oom"), trial(2, 8704, "fit"),
                                       trial(2, 8704, "oom"), trial(2, 9216, "fit"),
                                       trial(1, 8448, "fit")])
    assert noisy_bands(found) == [
        "`p`, 2 reference(s): 8,448–9,216 is 768 MiB wide, more than 2 steps of 256 MiB; its "
        "trials there: 8,448 oom, 8,704 fit, 8,704 oom, 9,216 fit"]


@pytest.mark.parametrize("starts, words", [
    ([None, None], "not recorded"),
    ([512.0, None], "1 of 2 recorded"),
    ([512.0, 500.0], "recorded"),
])
def test_trials_without_start_figures_are_read_as_before_and_said_so(starts, words):
    trials = [trial(1, 8448, "fit").model_copy(update={"start_allocated_mib": s})
              for s in starts]
    assert _searched([], trials).start_figures() == words


QWEN, KLEIN = "models/qwen-image-2.1/full", "models/flux2-klein/4b"


def _attempt(attempt_id, configs, searches, trials, simulated=False, host="h"):
    """An attempt as newest_searches reads one: its id, host, model folder, searches, trials."""
    served = SimpleNamespace(configs=configs)
    return SimpleNamespace(id=attempt_id, host=host, simulated=simulated, capacity=searches,
                           capacity_trials=trials,
                           meta=SimpleNamespace(environment=SimpleNamespace(served=served)))


def _committed_search(repo):
    attempt = next(a for a in load_valid_project(repo).evidence.attempts if a.capacity)
    search = next(s for s in attempt.capacity if s.profile == "group-leaf")
    return search, [t for t in attempt.capacity_trials if t.profile == "group-leaf"]


@pytest.mark.parametrize("later, kept", [
    # a later complete search of the same model supersedes
    (lambda s, t: _attempt("2", QWEN, [s], t), "2"),
    # a partial re-run (one count banded) never hides the complete search
    (lambda s, t: _attempt("2", QWEN, [s.model_copy(update={"bands": s.bands[:1]})], t), "1"),
    # another model's search is never this model's
    (lambda s, t: _attempt("2", KLEIN, [s], t), "1"),
    # a search whose trials set no pool limit (the CPU) answers for no card
    (lambda s, t: _attempt("2", QWEN, [s], [x.model_copy(update={"mem_get_info_total_mib": None})
                                            for x in t]), "1"),
    (lambda s, t: _attempt("2", QWEN, [s], t, simulated=True), "1"),
])
def test_the_newest_search_per_profile_is_this_models_limited_and_complete(repo, later, kept):
    search, trials = _committed_search(repo)
    evidence = SimpleNamespace(attempts=[_attempt("1", QWEN, [search], trials),
                                         later(search, trials)])
    assert newest_searches(evidence, QWEN)["group-leaf"].attempt == kept
    assert newest_searches(evidence, "models/other") == {}


def test_a_search_on_another_machine_is_kept_beside_the_newest_and_held_against_it(repo):
    from omniprobe.analysis.capacity_bands import machine_agreement

    search, trials = _committed_search(repo)
    # the same search again on another machine, its A at 1 reference one grid step higher
    moved = [b.model_copy(update={"fits_at_mib": b.fits_at_mib + 256})
             if b.reference_count == 1 else b for b in search.bands]
    evidence = SimpleNamespace(attempts=[
        _attempt("1", QWEN, [search], trials, host="h200"),
        _attempt("2", QWEN, [search.model_copy(update={"bands": moved})], trials, host="h100")])
    found = newest_searches(evidence, QWEN)["group-leaf"]
    assert (found.attempt, found.host) == ("2", "h100")
    assert [(s.attempt, s.host) for s in found.elsewhere] == [("1", "h200")]
    assert found.on("h200").attempt == "1" and found.on("h300") is None
    # every timed request of the profile, each with the machine it ran on
    assert [host for host, _ in found.timed] == ["h200"] * len(search.timed) + [
        "h100"] * len(search.timed)
    [agreement] = machine_agreement({"group-leaf": found})
    counts = tuple(sorted(b.reference_count for b in search.bands))
    assert (agreement.hosts, agreement.counts, agreement.apart_mib) == (
        ("h100", "h200"), counts, {1: 256})
    # one machine only: nothing to hold against
    alone = newest_searches(SimpleNamespace(attempts=evidence.attempts[:1]), QWEN)
    assert machine_agreement(alone) == []


def test_a_profile_set_up_and_never_searched_is_named_until_a_search_records_it(repo):
    from omniprobe.analysis.capacity_bands import never_searched

    search, trials = _committed_search(repo)
    listed = ["group-leaf", "group-leaf-kv-host-packed", "model-cpu"]
    evidence = SimpleNamespace(attempts=[_attempt("1", QWEN, [search], trials)])
    assert never_searched(evidence, QWEN, listed) == ["group-leaf-kv-host-packed", "model-cpu"]
    # a search cut before its first band is a record: it is said among the cut, not here
    cut = search.model_copy(update={"profile": "model-cpu", "bands": []})
    evidence.attempts.append(_attempt("2", QWEN, [cut], []))
    assert never_searched(evidence, QWEN, listed) == ["group-leaf-kv-host-packed"]
    # another model's searches are not this model's
    assert never_searched(evidence, KLEIN, listed) == listed


def test_a_model_set_up_on_a_gpu_host_and_never_searched_is_named_with_its_hosts(repo):
    from omniprobe.analysis.capacity_bands import unsearched_models

    hosts = load_valid_project(repo).hosts
    search, trials = _committed_search(repo)
    klein_9b, klein_kv = "models/flux2-klein/9b", "models/flux2-klein-kv/9b"
    evidence = SimpleNamespace(attempts=[_attempt("1", QWEN, [search], trials),
                                         _attempt("2", KLEIN, [search], trials)])
    assert unsearched_models(evidence, hosts) == {
        klein_9b: ["h200-klein9b-diffusers", "h100-klein9b-diffusers"],
        klein_kv: ["h200-klein9b-kv-diffusers", "h100-klein9b-kv-diffusers"]}
    # a search of it, even cut before its first band, is a record: it leaves the list
    evidence.attempts.append(_attempt("3", klein_9b, [search.model_copy(update={"bands": []})],
                                      []))
    assert set(unsearched_models(evidence, hosts)) == {klein_kv}
    # nothing searched: every model a GPU host builds, never the tiny ones only the CPU runs
    assert set(unsearched_models(SimpleNamespace(attempts=[]), hosts)) == {
        QWEN, KLEIN, klein_9b, klein_kv}


def test_a_models_sweep_runs_are_its_own_emulated_cards_only(repo):
    from omniprobe.analysis.diffusers_capacity import model_sweep_runs

    loaded = load_valid_project(repo)
    qwen = model_sweep_runs(loaded.hosts, loaded.evidence, loaded.fixtures, QWEN)
    assert qwen and {r.host for r in qwen} == {
        key for key, host in loaded.hosts.hosts.items()
        if host.emulation is not None and host.diffusers is not None
        and host.diffusers.configs == QWEN}
    # klein has no emulated card: its answers are held to no other model's sweeps
    assert model_sweep_runs(loaded.hosts, loaded.evidence, loaded.fixtures, KLEIN) == []
