import json

import pytest

from omniprobe.analysis.summaries import cell_from, cells_from_requests
from omniprobe.analysis.verdicts import all_verdicts
from omniprobe.evidence.models import RequestRecord
from omniprobe.evidence.validate import load_valid_project

from .evidence_scaffold import SIMULATED, add_attempt

FIXTURE_OF = {
    1: "single-reference",
    2: "edit-compose-pair",
    3: "edit-compose-three",
    4: "edit-compose-four",
}


def cells(spec: dict[int, tuple[str, str]]) -> list[dict]:
    """{refs: (outcome, quality)} -> cell records, one fixture per reference count."""
    return [
        {"fixture": FIXTURE_OF[r], "outcome": o, "quality": q, "wall_s": {"min": 40, "max": 41}}
        for r, (o, q) in spec.items()
    ]


def verdicts(repo_copy):
    loaded = load_valid_project(repo_copy)
    return all_verdicts(loaded.hosts, loaded.fixtures, loaded.evidence)


def test_committed_evidence_gives_the_reports_verdicts(repo):
    v = verdicts(repo)
    r3090, r5080 = v["rtx3090"], v["rtx5080"]
    assert (r3090.verdict, r3090.blocker, r3090.highest_served_refs) == ("not-built", "quality", 2)
    assert r3090.served_by[0] == "cpuoff"
    assert [(u.flag_set, u.quality) for u in r3090.capacity_unlocks] == [("fp8", "broken")]
    assert r3090.failed_init == ("default",)
    assert (r5080.verdict, r5080.blocker, r5080.highest_served_refs) == ("not-built", "init", 0)
    assert len(r5080.failed_init) == 6 and r5080.initialised == ()


def test_speedups_against_the_baseline(repo):
    v = verdicts(repo)["rtx3090"]
    pair = [s for s in v.speedups if s.flag_set == "cpuoff" and s.fixture == "edit-compose-pair"][0]
    assert pair.speedup.min == pytest.approx(81.16 / 36.7)
    four = [s for s in v.speedups if s.fixture == "edit-compose-four"][0]
    assert (four.flag_set, four.quality) == ("fp8", "broken")
    assert four.speedup.min == pytest.approx(145.8 / 44.35)
    assert four.speedup.max == pytest.approx(145.8 / 44.06)


SCENARIOS = [
    # host, flag set, init outcome, cells -> verdict, blocker, highest served
    (
        "5080 init succeeds and serves four soundly",
        "rtx5080",
        "cpuoff",
        "ready",
        {1: ("ok", "sound"), 2: ("ok", "sound"), 4: ("ok", "sound")},
        ("built", None, 4),
    ),
    (
        "5080 initialises but four OOM",
        "rtx5080",
        "cpuoff",
        "ready",
        {1: ("ok", "sound"), 2: ("ok", "sound"), 4: ("oom", "unchecked")},
        ("not-built", "capacity", 2),
    ),
    (
        "5080 four fits but output not checked",
        "rtx5080",
        "int8",
        "ready",
        {4: ("ok", "unchecked")},
        ("not-built", "quality", 0),
    ),
    ("5080 init fails again", "rtx5080", "fp8", "oom", {}, ("not-built", "init", 0)),
    ("5080 serves two but four was never asked", "rtx5080", "cpuoff", "ready",
     {1: ("ok", "sound"), 2: ("ok", "sound")}, ("not-built", "untested", 2)),
    (
        "3090 fp8 with sound outputs",
        "rtx3090",
        "fp8",
        "ready",
        {1: ("ok", "sound"), 2: ("ok", "sound"), 3: ("ok", "sound"), 4: ("ok", "sound")},
        ("built", None, 4),
    ),
    (
        "3090 a sound three-reference run raises the ceiling",
        "rtx3090",
        "cpuoff-expandable",
        "ready",
        {3: ("ok", "sound"), 4: ("oom", "unchecked")},
        ("not-built", "quality", 3),
    ),
]


@pytest.mark.parametrize(
    ("name", "host", "flag_set", "init", "spec", "expected"),
    SCENARIOS,
    ids=[s[0] for s in SCENARIOS],
)
def test_verdict_follows_new_evidence(repo_copy, name, host, flag_set, init, spec, expected):
    add_attempt(
        repo_copy,
        host,
        "new-attempt",
        runs=[{"flag_set": flag_set, "init": {"outcome": init}, "cells": cells(spec)}],
    )
    v = verdicts(repo_copy)[host]
    assert (v.verdict, v.blocker, v.highest_served_refs) == expected
    if expected[0] == "built":
        assert v.served_by == (flag_set,)


def test_fp8_with_sound_output_becomes_the_3090_capacity_unlock(repo_copy):
    add_attempt(
        repo_copy,
        "rtx3090",
        "fp8-fixed",
        runs=[
            {"flag_set": "fp8", "init": {"outcome": "ready"}, "cells": cells({4: ("ok", "sound")})}
        ],
    )
    v = verdicts(repo_copy)["rtx3090"]
    assert ("fp8", "fp8-fixed", "sound") in [
        (u.flag_set, u.attempt, u.quality) for u in v.capacity_unlocks
    ]
    assert v.verdict == "built"


def test_without_the_fp8_row_the_3090_is_capacity_blocked(repo_copy):
    runs = repo_copy.evidence_dir / "rtx3090" / "seed-3090-1-serve-matrix" / "runs.json"
    data = json.loads(runs.read_text())
    data["runs"] = [r for r in data["runs"] if r["flag_set"] != "fp8"]
    runs.write_text(json.dumps(data))
    v = verdicts(repo_copy)["rtx3090"]
    assert (v.verdict, v.blocker, v.capacity_unlocks) == ("not-built", "capacity", ())


def test_simulated_evidence_never_counts_for_a_real_host(repo_copy):
    add_attempt(
        repo_copy,
        "rtx5080",
        "sim-attempt",
        provenance=SIMULATED,
        runs=[
            {
                "flag_set": "cpuoff",
                "init": {"outcome": "ready"},
                "cells": cells({4: ("ok", "sound")}),
            }
        ],
    )
    v = verdicts(repo_copy)["rtx5080"]
    assert (v.verdict, v.blocker) == ("not-built", "init")
    assert "sim-attempt" not in v.attempts


def request(seed, outcome="ok", quality="sound", fixture="edit-compose-four", wall=40.0, peak=None):
    return {
        "flag_set": "cpuoff",
        "fixture": fixture,
        "seed": seed,
        "outcome": outcome,
        "quality": quality,
        "wall_s": wall,
        **({"server_peak_mb": peak} if peak else {}),
    }


def test_measured_requests_are_summarised_into_cells_that_decide_the_verdict(repo_copy):
    reqs = [request(s, wall=40 + i, peak=15000 + i) for i, s in enumerate((2301, 2302, 2303, 2304))]
    add_attempt(
        repo_copy,
        "rtx5080",
        "measured",
        requests=reqs,
        runs=[{"flag_set": "cpuoff", "init": {"outcome": "ready"}}],
    )
    v = verdicts(repo_copy)["rtx5080"]
    assert (v.verdict, v.highest_served_refs) == ("built", 4)
    broken = [*reqs[:3], request(2304, quality="broken")]
    (repo_copy.evidence_dir / "rtx5080" / "measured" / "requests.json").write_text(json.dumps(broken))
    assert verdicts(repo_copy)["rtx5080"].blocker == "quality"


CELL_TABLE = [
    # outcomes/qualities of the requests -> cell outcome, cell quality
    ([("ok", "sound"), ("ok", "sound")], ("ok", "sound")),
    ([("ok", "sound"), ("ok", "broken")], ("ok", "broken")),
    ([("ok", "sound"), ("ok", "unchecked")], ("ok", "unchecked")),
    ([("ok", "sound"), ("oom", "unchecked")], ("oom", "unchecked")),
    ([("error", "unchecked"), ("timeout", "unchecked")], ("error", "unchecked")),
    ([("ok", "sound"), ("error", "unchecked")], ("error", "unchecked")),
]


@pytest.mark.parametrize(("requests", "expected"), CELL_TABLE)
def test_cell_from_requests(requests, expected):
    records = [
        RequestRecord.model_validate(request(2301 + i, o, q)) for i, (o, q) in enumerate(requests)
    ]
    cell = cell_from(records)
    assert (cell.outcome, cell.quality) == expected


def test_cells_from_requests_ranges_and_groups():
    records = [
        RequestRecord.model_validate(r)
        for r in (
            request(2301, wall=44.06, peak=22000),
            request(2302, wall=44.35, peak=22918),
            request(2301, fixture="edit-compose-pair", wall=35.0),
        )
    ]
    by_flag = cells_from_requests(records)
    four, pair = by_flag["cpuoff"]
    assert (four.wall_s.min, four.wall_s.max, four.server_peak_mb.max) == (44.06, 44.35, 22918)
    assert four.seeds == [2301, 2302] and pair.fixture == "edit-compose-pair"
