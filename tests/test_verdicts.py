import json

import pytest

from omniprobe.analysis.summaries import cell_from, cells_from_requests
from omniprobe.analysis.verdicts import all_verdicts
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.validate import load_valid_project

from .conftest import agreeing
from .evidence_scaffold import SIMULATED, add_attempt

FIXTURE_OF = {
    1: "single-reference",
    2: "edit-compose-pair",
    3: "edit-compose-three",
    4: "edit-compose-four",
}


def cells(spec: dict[int, tuple[str, str]]) -> list[dict]:
    """{refs: (outcome, structure)} -> cell records, one fixture per reference count."""
    return [
        {"fixture": FIXTURE_OF[r], "outcome": o, "structure": q, "wall_s": {"min": 40, "max": 41}}
        for r, (o, q) in spec.items()
    ]


def verdicts(repo_copy):
    loaded = load_valid_project(repo_copy)
    return all_verdicts(loaded.hosts, loaded.fixtures, loaded.evidence)


def test_committed_evidence_gives_the_reports_verdicts(repo):
    v = verdicts(repo)
    r3090, r5080 = v["rtx3090"], v["rtx5080"]
    assert (r3090.verdict, r3090.blocker, r3090.highest_served_refs) == ("not-built", "structure", 2)
    assert r3090.served_by[0] == "cpuoff"
    assert [(u.flag_set, u.structure) for u in r3090.capacity_unlocks] == [("fp8", "broken")]
    assert r3090.failed_init == ("default",)
    assert (r5080.verdict, r5080.blocker, r5080.highest_served_refs) == ("not-built", "init", 0)
    assert len(r5080.failed_init) == 6 and r5080.initialised == ()


def test_speedups_against_the_baseline(repo):
    v = verdicts(repo)["rtx3090"]
    pair = [s for s in v.speedups if s.flag_set == "cpuoff" and s.fixture == "edit-compose-pair"][0]
    assert pair.speedup.min == pytest.approx(81.16 / 36.7)
    four = [s for s in v.speedups if s.fixture == "edit-compose-four"][0]
    assert (four.flag_set, four.structure) == ("fp8", "broken")
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
        ("not-built", "structure", 0),
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
        ("not-built", "structure", 3),
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
        (u.flag_set, u.attempt, u.structure) for u in v.capacity_unlocks
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


def request(seed, outcome="ok", structure="sound", fixture="edit-compose-four", wall=40.0, peak=None):
    return {
        "flag_set": "cpuoff",
        "fixture": fixture,
        "seed": seed,
        "outcome": outcome,
        "structure": structure,
        "wall_s": wall,
        **({"server_peak_mb": peak} if peak else {}),
        **agreeing(outcome, structure),
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
    broken = [*reqs[:3], request(2304, structure="broken")]
    (repo_copy.evidence_dir / "rtx5080" / "measured" / "requests.json").write_text(json.dumps(broken))
    assert verdicts(repo_copy)["rtx5080"].blocker == "structure"


CELL_TABLE = [
    # outcomes/structures of the requests -> cell outcome, cell structure
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
    assert (cell.outcome, cell.structure) == expected


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


def blockers_of(v):
    return [(b.kind, b.flag_sets) for b in v.blockers]


def test_every_blocker_of_the_3090_with_its_flag_sets_in_a_fixed_order(repo):
    v = verdicts(repo)["rtx3090"]
    assert blockers_of(v) == [
        ("init", ("default",)),
        ("capacity", ("cpuoff", "cpuoff-layerwise", "cpuoff-fp8v", "cpuoff-expandable")),
        ("structure", ("fp8",)),
    ]


def test_a_blocker_recorded_in_new_evidence_joins_the_verdict(repo_copy):
    add_attempt(repo_copy, "rtx5080", "cpuoff-ready", runs=[
        {"flag_set": "cpuoff", "init": {"outcome": "ready"},
         "cells": cells({1: ("ok", "sound"), 4: ("oom", "unchecked")})},
        {"flag_set": "int8", "init": {"outcome": "ready"}, "cells": cells({1: ("ok", "sound")})}])
    v = verdicts(repo_copy)["rtx5080"]
    assert blockers_of(v) == [
        ("init", ("default", "cpuoff-layerwise", "fp8", "fp8-expandable")),
        ("capacity", ("cpuoff",)),
        ("untested", ("int8",)),
    ]


def signatures(v):
    capacity = next(b for b in v.blockers if b.kind == "capacity")
    return [(g.requested, g.location, g.flag_sets) for g in capacity.oom_signatures]


def test_an_oom_signature_is_attributed_only_to_flag_sets_that_record_it(repo_copy):
    where = "qwen_image_21/qwen_image_21_transformer.py:293"
    assert signatures(verdicts(repo_copy)["rtx3090"]) == [
        ("490.00 MiB", where, ("cpuoff", "cpuoff-fp8v", "cpuoff-expandable")),
        (None, None, ("cpuoff-layerwise",)),
    ]
    runs = repo_copy.evidence_dir / "rtx3090" / "seed-3090-1-serve-matrix" / "runs.json"
    data = json.loads(runs.read_text())
    fp8v = next(r for r in data["runs"] if r["flag_set"] == "cpuoff-fp8v")
    del fp8v["cells"][-1]["oom"]
    expandable = next(r for r in data["runs"] if r["flag_set"] == "cpuoff-expandable")
    expandable["cells"][-1]["oom"]["requested"] = "512.00 MiB"
    runs.write_text(json.dumps(data))
    assert signatures(verdicts(repo_copy)["rtx3090"]) == [
        ("490.00 MiB", where, ("cpuoff",)),
        ("512.00 MiB", where, ("cpuoff-expandable",)),
        (None, None, ("cpuoff-layerwise", "cpuoff-fp8v")),
    ]


def test_the_capacity_unlock_carries_its_own_cells_figures(repo_copy):
    (unlock,) = verdicts(repo_copy)["rtx3090"].capacity_unlocks
    assert (unlock.fixture, unlock.server_peak_mb.max, unlock.wall_s.min) == (
        "edit-compose-four", 22918, 44.06)
    runs = repo_copy.evidence_dir / "rtx3090" / "seed-3090-1-serve-matrix" / "runs.json"
    data = json.loads(runs.read_text())
    fp8 = next(r for r in data["runs"] if r["flag_set"] == "fp8")
    three = next(c for c in fp8["cells"] if c["fixture"] == "edit-compose-three")
    three["server_peak_mb"] = {"min": 23999, "max": 23999}
    runs.write_text(json.dumps(data))
    (unlock,) = verdicts(repo_copy)["rtx3090"].capacity_unlocks
    assert unlock.server_peak_mb.max == 22918


def test_a_knob_that_never_reached_the_model_is_recorded_with_its_base(repo_copy):
    (u,) = verdicts(repo_copy)["rtx3090"].unreached
    assert (u.flag_set, u.base, u.knob) == ("cpuoff-fp8v", "cpuoff", "extras.prefix_kv_cache_dtype")
    prop = repo_copy.evidence_dir / "rtx3090" / "seed-3090-1-serve-matrix" / "propagation.json"
    data = json.loads(prop.read_text())
    data["propagation"][0]["bytes_identical"] = False
    prop.write_text(json.dumps(data))
    assert verdicts(repo_copy)["rtx3090"].unreached == ()


def test_history_shows_a_later_attempt_whose_verdict_differs(repo_copy):
    from omniprobe.analysis.verdicts import verdict_history

    add_attempt(repo_copy, "rtx5080", "fixed", runs=[{
        "flag_set": "int8", "init": {"outcome": "ready"}, "cells": cells({4: ("ok", "sound")})}])
    loaded = load_valid_project(repo_copy)
    history = verdict_history("rtx5080", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert [(e.attempt, e.verdict.verdict, e.provenance) for e in history] == [
        ("seed-5080-1-init-matrix", "not-built", "transcribed"), ("fixed", "built", "measured")]
    assert history[0].upstream_commit == "8484d85d1" and history[1].upstream_commit is None
    assert [b.kind for b in history[0].verdict.blockers] == ["init"]


def test_a_probe_attempts_pins_come_from_the_environment_filed_before_it(repo_copy):
    from datetime import UTC, datetime

    from omniprobe.analysis.verdicts import verdict_history
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.manifest import record_manifest

    from .env_scaffold import sample_manifest

    manifest = sample_manifest(host="rtx5080", pins=[
        {"name": "vllm-omni", "kind": "git", "pin": "8484d85d1", "source": "git", "editable": True,
         "installed_version": "0.31.0", "resolved": "8484d85d1aaa"},
        {"name": "torch", "kind": "index", "pin": "2.13.0+cu130", "source": "index",
         "installed_version": "2.13.0+cu130", "resolved": "2.13.0+cu130"}])
    folder, _ = record_manifest(repo_copy, load_hosts(repo_copy.hosts_file), manifest,
                                command=["omniprobe", "env"],
                                started_at=datetime(2026, 11, 30, 8, tzinfo=UTC))
    add_attempt(repo_copy, "rtx5080", "2026-11-30T090000Z-rtx5080-probe", runs=[{
        "flag_set": "int8", "init": {"outcome": "ready"}, "cells": cells({4: ("ok", "sound")})}])
    loaded = load_valid_project(repo_copy)
    latest = verdict_history("rtx5080", loaded.hosts, loaded.fixtures, loaded.evidence)[-1]
    assert (latest.upstream_commit, latest.torch, latest.pins_from) == (
        "8484d85d1aaa", "2.13.0+cu130", folder.name)


def test_a_model_given_by_hand_is_named_beside_the_verdict(repo_copy):
    from .rendered import render_report

    reqs = [request(s, wall=40, peak=15000) for s in (2301, 2302, 2303, 2304)]
    folder = add_attempt(repo_copy, "rtx5080", "measured", requests=reqs,
                         runs=[{"flag_set": "cpuoff", "init": {"outcome": "ready"}}])
    assert verdicts(repo_copy)["rtx5080"].unpinned == ()
    meta = json.loads((folder / "attempt.json").read_text())
    meta["environment"] = {"digest": "0" * 64,
                           "served": {"model": "/models/qwen", "source": "by_hand"}}
    (folder / "attempt.json").write_text(json.dumps(meta))
    [unpinned] = verdicts(repo_copy)["rtx5080"].unpinned
    assert (unpinned.attempt, unpinned.model) == ("measured", "/models/qwen")
    assert ("Attempt measured served `/models/qwen`, given by hand with `--model`: not the pinned "
            "snapshot") in render_report(repo_copy)


ENV_CAUSE = {"kind": "environment", "reason": "import error: No module named 'vllm'"}


def test_a_host_whose_inits_all_failed_outside_the_card_is_not_measured(repo_copy):
    import shutil

    from .rendered import render_report

    shutil.rmtree(repo_copy.evidence_dir / "rtx5080")
    add_attempt(repo_copy, "rtx5080", "broken-env", runs=[
        {"flag_set": "default", "init": {"outcome": "error", "cause": ENV_CAUSE}},
        {"flag_set": "cpuoff", "init": {"outcome": "error", "cause": {
            "kind": "server", "reason": "traceback in server code: vllm_omni/engine/x.py:7"}}},
        {"flag_set": "int8", "init": {"outcome": "timeout"}},
    ])
    v = verdicts(repo_copy)["rtx5080"]
    assert (v.verdict, v.blocker, v.blockers, v.failed_init) == ("not-measured", None, (), ())
    assert [(n.flag_set, n.phase, n.cause) for n in v.not_measured] == [
        ("default", "init", "environment: import error: No module named 'vllm'"),
        ("cpuoff", "init", "server: traceback in server code: vllm_omni/engine/x.py:7"),
        ("int8", "init", "timed out: not the card's answer")]
    report = render_report(repo_copy)
    verdict = report[report.index("**RTX 5080 (16 GB)"):report.index("## What failed outside")]
    assert verdict.startswith("**RTX 5080 (16 GB): not-measured.**")
    assert "blocked at init" not in verdict and "cannot initialize" not in verdict
    section = report[report.index("## What failed outside the card — RTX 5080"):]
    assert "| `broken-env` | default | init | 1 | environment: import error: No module named 'vllm' |" \
        in section


def test_failures_outside_the_card_beside_card_ooms_leave_the_init_blocker(repo_copy):
    add_attempt(repo_copy, "rtx5080", "broken-env", runs=[
        {"flag_set": "fp8", "init": {"outcome": "error", "cause": ENV_CAUSE}}])
    v = verdicts(repo_copy)["rtx5080"]
    assert (v.verdict, v.blocker) == ("not-built", "init")
    assert [(n.attempt, n.flag_set) for n in v.not_measured] == [("broken-env", "fp8")]
    # The committed OOMs still block each flag set at init; the new error adds no blocker.
    assert v.failed_init == ("default", "cpuoff", "cpuoff-layerwise", "fp8", "fp8-expandable",
                             "int8")


def test_a_request_that_failed_outside_the_card_is_no_cell():
    def record(outcome, cause=None):
        return RequestRecord(flag_set="cpuoff", fixture="edit-compose-four", seed=1,
                             outcome=outcome, structure="unchecked", wall_s=1.0, cause=cause,
                             **agreeing(outcome, "unchecked"))

    assert cells_from_requests([record("error", ENV_CAUSE)]) == {}
    assert cells_from_requests([record("error")]) == {}  # unclassified: measured nothing
    [cell] = cells_from_requests([record("error", ENV_CAUSE), record("oom")])["cpuoff"]
    assert (cell.outcome, cell.seeds) == ("oom", [1])
