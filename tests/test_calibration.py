"""The emulation held against the seed's real Diffusers runs (issue 32): the reading rules as
tables, the speed reference, and the committed calibration read back from the evidence, changing
when the evidence does."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from omniprobe.analysis.calibration import (
    RealRun,
    compared_counts,
    observed,
    reading,
    slowdown,
    wall_baseline,
)
from omniprobe.analysis.diffusers_capacity import CapacityCell, HostRam, ProfileRun
from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.evidence.validate import load_valid_project
from omniprobe.report.diffusers_view import diffusers_section

GIB = 1024
B2G = RealRun(1, True, "the card's one-reference Diffusers ceiling (B2g)", None)
Q3_4R = RealRun(4, False, "ran edit-compose-four", 145.8)


def run(cells: dict[int, tuple[str, bool]], *, init: str = "ready", killed: bool = False,
        held_gib: float | None = 29.9, build_path: str | None = "random-streamed") -> ProfileRun:
    return ProfileRun("rtx5080-on-h200-diffusers", 16 * GIB, "p", "a", tuple(
        CapacityCell(n, f"f{n}", outcome, outcome == "ok" and not breach, 9000.0, 9000.0, None,
                     breach, None, 25.0) for n, (outcome, breach) in cells.items()), init,
        HostRam(30 * GIB, held_gib and held_gib * GIB, killed), build_path=build_path)


@pytest.mark.parametrize(("the_run", "refs", "outcome", "b2g", "q3_4r"), [
    # run on the emulated card                        refs  outcome        B2g (1, a ceiling)  q3-4r (4)
    (run({1: ("ok", False), 4: ("ok", False)}),       1,    "fits",        "agrees",           "agrees"),
    (run({1: ("ok", False), 4: ("ok", False)}),       4,    "fits",        "not compared",     "agrees"),
    (run({1: ("oom", False)}),                        1,    "gpu-oom",     "disagrees",        "disagrees"),
    (run({1: ("ok", True)}),                          1,    "over-cap",    "disagrees",        "disagrees"),
    (run({}, init="init-error", killed=True),         1,    "host-killed", "disagrees",        "disagrees"),
    # held more than the card's host has, though the cap let it run: no fit with the host
    (run({1: ("ok", False)}, held_gib=31.0),          1,    "host-over",   "disagrees",        "disagrees"),
    # killed by the random build that held the whole bf16 model at once: the harness's, not run
    (run({}, init="init-error", killed=True, build_path=None), 1, "not-run", "not run",    "not run"),
    (None,                                            1,    "not-run",     "not run",          "not run"),
    (run({4: ("ok", False)}),                         1,    "not-run",     "not run",          "not run"),
])
def test_each_grid_cell_reads_against_what_the_real_run_did(the_run, refs, outcome, b2g, q3_4r):
    seen = observed(the_run, refs, 30 * GIB)
    assert seen.outcome == outcome
    assert reading(B2G, refs, seen) == b2g
    assert reading(Q3_4R, refs, seen) == (q3_4r if refs <= 4 else "not compared")


def test_a_ceiling_shows_the_target_beside_its_count_and_a_plain_run_its_own_alone():
    assert compared_counts(B2G, 4) == [1, 4]
    assert compared_counts(Q3_4R, 4) == [4]
    assert compared_counts(replace(B2G, references=4), 4) == [4]


def profile(**given) -> DiffusersProfile:
    return DiffusersProfile(**{"description": "d", "offload": "group-leaf", "use_kv_cache": False,
                               "quantize_dit": "int8-weight-only", "steps": 2, **given})


@pytest.mark.parametrize("walls, baseline", [
    # one baseline per table and count: its fastest fit, whatever the row's placement or work
    ({"seed-baseline-te8": 7.4, "int8-leaf-nostream": 31.8, "int8-block-nostream-te8": 28.2},
     "seed-baseline-te8"),
    ({"killed": None, "slow": 30.0, "fast": 25.0}, "fast"),
    ({"killed": None}, None),       # nothing fit: no ratio is given
    ({"a": 5.0, "b": 5.0}, "a"),    # a tie, by name
])
def test_a_tables_walls_are_held_against_its_fastest_fit(walls, baseline):
    assert wall_baseline(walls) == baseline
    assert slowdown(30.0, 7.5) == 4.0 and slowdown(30.0, None) is None
    assert slowdown(None, 7.5) is None


def _calibration(project, name):
    loaded = load_valid_project(project)
    return next(c for c in diffusers_section(loaded, project.root).calibrations if c.name == name)


def test_the_committed_b2g_calibration_disagrees_under_its_closest_profile(repo):
    b2g = _calibration(repo, "b2g")
    assert b2g.counts == [1, 4]
    assert "seed-baseline-capacity" in b2g.disagree
    assert {"int8-leaf-nostream", "int8-leaf-nostream-te8", "seed-baseline-te8"} <= set(b2g.agree)
    assert b2g.finding is not None and "page-locked" in b2g.finding


def test_the_reading_follows_the_evidence(repo_copy):
    """Drop the int8-leaf-nostream records from the 5080's capped attempt: its cell is then not
    run, and it no longer agrees."""
    folder = next((repo_copy.root / "evidence" / "rtx5080-on-h200-diffusers").glob(
        "2026-12-02T003903Z-*"))
    for name, key in (("offline.json", "offline"), ("offline-requests.json",
                                                    "offline_requests")):
        path = folder / name
        data = json.loads(path.read_text())
        data[key] = [r for r in data[key] if r.get("profile") != "int8-leaf-nostream"]
        path.write_text(json.dumps(data))
    b2g = _calibration(repo_copy, "b2g")
    assert "int8-leaf-nostream" not in b2g.agree
    row = next(r for r in b2g.rows if r.profile == "int8-leaf-nostream")
    assert [c.reading for c in row.cells] == ["not run", "not run"]
