"""Hostile input, round 4 (issue 53): capacity evidence that lies about its own trials is named by
`validate` with its file, record and rule, and nothing is rendered from it."""

from __future__ import annotations

import json

import pytest

from omniprobe.evidence.validate import load_project

ATTEMPT = "evidence/h200-diffusers/2026-12-01T205522Z-h200-diffusers-capacity"


def _edit(project, name: str, change) -> None:
    path = project.root / ATTEMPT / name
    data = json.loads(path.read_text())
    key = "capacity" if name == "capacity.json" else "capacity_trials"
    data[key] = change(data[key])
    path.write_text(json.dumps(data, indent=2) + "\n")


def _band(searches, profile, refs):
    search = next(s for s in searches if s["profile"] == profile)
    return next(b for b in search["bands"] if b["reference_count"] == refs)


def _moved_band(searches):
    """The committed group-leaf 4-reference band moved down to where a 12 GB card would fit."""
    _band(searches, "group-leaf", 4).update(fits_at_mib=8192, fails_at_mib=7936)
    return searches


def _seven_references(searches):
    band = dict(_band(searches, "group-leaf", 4), reference_count=7)
    next(s for s in searches if s["profile"] == "group-leaf")["bands"].append(band)
    return searches


def _failed_init(searches):
    searches[0]["init_outcome"] = "init-oom"
    return searches


def _flipped_at_a(trials):
    band_a = {(t["profile"], t["reference_count"]): t["limit_mib"] for t in trials
              if t["outcome"] == "fit"}
    first = next(t for t in trials if t["outcome"] == "fit"
                 and t["limit_mib"] == band_a[(t["profile"], t["reference_count"])])
    first.update(outcome="oom", error="CUDA out of memory")
    return trials


CASES = [
    ("a band's A moved below its failures", "capacity.json", _moved_band,
     "$.capacity[0].bands[4]", "fits_at_mib 8192: a counted trial at"),
    ("a band's A below its own B", "capacity.json",
     lambda s: [_band(s, "group-leaf", 4).update(fits_at_mib=8192) or s][0],
     "capacity.json", "must lie above fails_at_mib"),
    ("a band for a count no fixture has", "capacity.json", _seven_references,
     "$.capacity[0].bands[5].fixture", "has 4 reference(s), the band 7"),
    ("bands under a failed build", "capacity.json", _failed_init,
     "$.capacity[0].bands", "bands under a search whose build ended init-oom"),
    ("two searches of one profile", "capacity.json", lambda s: [*s, s[0]],
     "$.capacity[5].profile", "a second search of profile 'group-leaf'"),
    ("bands kept after their trials went", "capacity-trials.json", lambda t: [],
     "$.capacity[0].bands[0]", "no counted trial fit there"),
    ("every trial twice", "capacity-trials.json", lambda t: [*t, *t],
     "$.capacity_trials[", "the same trial twice"),
    ("a trial off the grid", "capacity-trials.json",
     lambda t: [dict(t[0], limit_mib=t[0]["limit_mib"] + 7), *t[1:]],
     "$.capacity_trials[0].limit_mib", "is not on the search's grid"),
    ("a peak of 10^30 MiB", "capacity-trials.json",
     lambda t: [dict(t[0], peak_mib=1e30), *t[1:]],
     "$.capacity_trials[0].peak_mib", "a reserved peak of"),
    ("a trial of a profile with no search", "capacity-trials.json",
     lambda t: [dict(t[0], profile="group-block"), *t[1:]],
     "$.capacity_trials[0].profile", "which no search in capacity.json holds"),
    ("a trial's outcome flipped at A", "capacity-trials.json", _flipped_at_a,
     "$.capacity[", "ended oom"),
]


@pytest.mark.parametrize(("case", "file", "change", "where", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_capacity_evidence_that_contradicts_itself_is_named(repo_copy, case, file, change, where,
                                                            words):
    _edit(repo_copy, file, change)
    _, problems = load_project(repo_copy)
    named = [str(p) for p in problems]
    assert any(ATTEMPT in p and where in p and words in p for p in named), named


def _carried(change) -> tuple[bytes, bytes]:
    from .conftest import REPO

    here = (REPO / ATTEMPT / "capacity.json").read_bytes()
    data = json.loads(here)
    data["capacity"] = change(data["capacity"])
    return here, json.dumps(data).encode()


def _added_band(searches):
    search = next(s for s in searches if s["profile"] == "group-leaf")
    search["bands"].append(dict(search["bands"][-1], reference_count=5))
    search["logs"] = [*search.get("logs", []), {"path": "h200-diffusers/x/runner.log",
                                                "sha256": "0" * 64, "bytes": 1}]
    return searches


def _removed_band(searches):
    next(s for s in searches if s["profile"] == "group-leaf")["bands"].pop(2)
    return searches


def _changed_grid(searches):
    searches[0]["search"]["resolution_mib"] = 512
    return searches


def _changed_settings(searches):
    searches[0]["settings"]["use_kv_cache"] = False
    return searches


@pytest.mark.parametrize(("case", "change", "verdict"), [
    ("a resume's new band and log", _added_band, "adds"),
    ("a new profile's search", lambda s: [*s, dict(s[0], profile="group-block")], "adds"),
    ("a committed band moved", _moved_band, "content differs: a record changed or went"),
    ("a committed band removed", _removed_band, "content differs: a record changed or went"),
    ("the committed grid changed", _changed_grid, "content differs: a record changed or went"),
    ("the committed settings changed", _changed_settings,
     "content differs: a record changed or went"),
])
def test_an_archive_adds_to_a_committed_search_and_never_rewrites_it(case, change, verdict):
    from omniprobe.evidence.archive import file_change

    assert file_change("capacity.json", *_carried(change)) == verdict, case


@pytest.mark.parametrize(("hostile", "shown"), [
    ("<b>bold</b> offload", "&lt;b&gt;bold&lt;/b&gt; offload"),
    ("a | cell and \u202e reversed", "a \\| cell and [U+202E] reversed"),
])
def test_a_profile_description_reaches_the_report_as_text_never_markup(repo_copy, hostile,
                                                                       shown):
    from .rendered import render_details

    text = repo_copy.hosts_file.read_text()
    old = ('description = "leaf-level group offload with CUDA streams '
           '(diffusers.hooks.apply_group_offloading)"')
    assert old in text
    repo_copy.hosts_file.write_text(text.replace(old, f"description = {json.dumps(hostile)}"))
    details = render_details(repo_copy)
    assert f"| `group-leaf`: {shown} |" in details
    assert hostile not in details


# --- a file an attempt's kind does not hold ---------------------------------------------------

V5_SETTINGS = "tests/data/migrations/v5/profile-settings.json"


def _stray(project, name: str) -> bytes:
    """`name` placed in the capacity attempt: a legacy profile-settings.json (format 5) or a
    current file of another kind's."""
    from .conftest import REPO

    source = (REPO / V5_SETTINGS if name == "profile-settings.json"
              else REPO / "evidence/diffusers-tiny-cpu/2026-12-01T094615Z-diffusers-tiny-cpu-offline"
              / name)
    data = source.read_bytes()
    (project.root / ATTEMPT / name).write_bytes(data)
    return data


@pytest.mark.parametrize("name", ["profile-settings.json", "offline.json", "offline-requests.json",
                                  "environment.json"])
def test_a_file_a_capacity_attempt_does_not_hold_is_refused(repo_copy, monkeypatch, capsys, name):
    from omniprobe.cli import main
    from omniprobe.errors import InputError

    if name == "environment.json":
        (repo_copy.root / ATTEMPT / name).write_text('{"format_version": 7, "environment": {}}')
    else:
        _stray(repo_copy, name)
    before = {p.name: p.read_bytes() for p in (repo_copy.root / ATTEMPT).iterdir()}
    _, problems = load_project(repo_copy)
    said = (f"{repo_copy.root / ATTEMPT / name}: an attempt of kind 'capacity' holds "
            f"capacity.json and capacity-trials.json beside attempt.json: {name} is no file of "
            "its kind")
    assert any(str(p).startswith(said) for p in problems), problems
    # `evidence upgrade` refuses it too, and writes nothing (no offline.json folded in there).
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["evidence", "upgrade"]) == InputError.exit_code
    assert name in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (repo_copy.root / ATTEMPT).iterdir()} == before


# --- the grid's provenance, from the recorded command ------------------------------------------

def _command(project, change) -> None:
    path = project.root / ATTEMPT / "attempt.json"
    data = json.loads(path.read_text())
    prov = data["attempt"]["provenance"]
    prov["command"] = change(prov["command"])
    path.write_text(json.dumps(data, indent=2) + "\n")


def _without_grid_flags(command):
    out, skip = [], False
    for token in command:
        if skip:
            skip = False
        elif token in ("--floor-mib", "--ceiling-mib"):
            skip = True
        else:
            out.append(token)
    return out


def _chosen(searches, by: str):
    for search in searches:
        search["search"]["chosen_by"] = by
    return searches


GRID_CASES = [
    # (case, capacity.json change, attempt.json command change, where, words)
    ("a grid said to be omniprobe's when the command line gave it",
     lambda s: _chosen(s, "omniprobe"), None, "$.capacity[0].search",
     "chosen_by 'omniprobe', while the attempt's command line (omniprobe probe-capacity --host "
     "h200-diffusers"),
    ("a grid said to be the command line's when it gave none", None, _without_grid_flags,
     "$.capacity[4].search", "names no grid flag (--floor-mib, --ceiling-mib, --resolution-mib, "
                             "--repeats): expected 'omniprobe'"),
    ("a grid flag given as --resolution-mib=300",
     lambda s: _chosen(s, "omniprobe"),
     lambda c: [*_without_grid_flags(c), "--resolution-mib=300"], "$.capacity[1].search",
     "names a grid flag"),
    ("a grid flag given as a prefix argparse takes",
     lambda s: _chosen(s, "omniprobe"), lambda c: [*_without_grid_flags(c), "--floor", "1000"],
     "$.capacity[2].search", "expected 'command line'"),
    ("the grid changed on resume, a second grid in one attempt",
     lambda s: [s[0], *[dict(x, search=dict(x["search"], floor_mib=1000, resolution_mib=300))
                        for x in s[1:]]], None,
     "$.capacity[1].search", "a second grid in one attempt (search floor_mib: 4096 -> 1000; "
                             "search resolution_mib: 256 -> 300 from $[0]'s)"),
]


@pytest.mark.parametrize(("case", "searches", "command", "where", "words"), GRID_CASES,
                         ids=[c[0] for c in GRID_CASES])
def test_a_grids_provenance_is_the_recorded_command_lines(repo_copy, case, searches, command,
                                                          where, words):
    if searches is not None:
        _edit(repo_copy, "capacity.json", searches)
    if command is not None:
        _command(repo_copy, command)
    _, problems = load_project(repo_copy)
    said = f"{repo_copy.root / ATTEMPT / 'capacity.json'}: {where}: "
    named = [str(p) for p in problems]
    assert any(p.startswith(said) and words in p for p in named), named


@pytest.mark.parametrize(("command", "chooser"), [
    (["omniprobe", "probe-capacity", "--host", "h"], "omniprobe"),
    (["omniprobe", "probe-capacity", "--floor-mib", "1024"], "command line"),  # the default, given
    (["omniprobe", "probe-capacity", "--ceiling-mib=40960"], "command line"),
    (["omniprobe", "probe-capacity", "--res", "300"], "command line"),
    (["omniprobe", "probe-capacity", "--repeats", "0"], "command line"),
    (["omniprobe", "probe-capacity", "--request-timeout", "300", "--fresh"], "omniprobe"),
    (["omniprobe", "probe-capacity", "--profile", "floor-mib"], "omniprobe"),
])
def test_who_chose_the_grid_is_read_off_the_command(command, chooser):
    from omniprobe.evidence.models.capacity import grid_chooser

    assert grid_chooser(command) == chooser


def test_the_grid_flags_are_the_options_flags():
    from omniprobe.evidence.models.capacity import GRID_FLAGS
    from omniprobe.harness.common.options import CEILING, FLOOR, REPEATS, RESOLUTION

    assert tuple(o.flag for o in (FLOOR, CEILING, RESOLUTION, REPEATS)) == GRID_FLAGS


# --- resumes under changed inputs --------------------------------------------------------------

def _store(project):
    """The committed capacity attempt, as the resume rule reads it."""
    from omniprobe.evidence.load import load_attempt

    attempt, problems = load_attempt(project.root / ATTEMPT)
    assert problems == []
    return attempt


def _entry(project, name: str, **edits):
    from types import SimpleNamespace

    from omniprobe.config.hosts import load_hosts

    profile = load_hosts(project.hosts_file).diffusers_profiles[name].model_dump(mode="json")
    return SimpleNamespace(name=name, kwargs={"profile": {**profile, **edits}})


def _mid_search(searches):
    """group-leaf's search as a run left it mid-search: its first bands only."""
    search = next(s for s in searches if s["profile"] == "group-leaf")
    search["bands"] = search["bands"][:2]
    return searches


def _killed_before_its_search(searches):
    """A run killed before it recorded group-leaf's search: its trials only."""
    return [s for s in searches if s["profile"] != "group-leaf"]


RESUMES = [
    # (case, capacity.json change, profile, its edits now, the grid now, what is named)
    ("a profile edited between runs", None, "group-leaf", {"use_kv_cache": False}, {},
     "group-leaf: use_kv_cache: True -> False"),
    ("a profile edited mid-search", _mid_search, "group-leaf", {"steps": 4}, {},
     "group-leaf: steps: 2 -> 4"),
    ("a profile edited after a run killed before its search was recorded",
     _killed_before_its_search, "group-leaf", {"use_kv_cache": False}, {},
     "group-leaf: trials recorded with no search on record"),
    ("a profile renamed in the evidence",
     lambda s: [dict(x, profile="group-block") if x["profile"] == "group-leaf" else x
                for x in s], "group-block", {}, {}, "group-block: offload: 'group-leaf' -> "
                                                     "'group-block'"),
    ("the grid changed on resume", None, "group-leaf", {},
     {"floor_mib": 1000, "resolution_mib": 300},
     "group-leaf: search floor_mib: 4096 -> 1000"),
    ("the grid changed on resume, mid-search", _mid_search, "group-leaf", {},
     {"floor_mib": 1000, "resolution_mib": 300}, "group-leaf: search resolution_mib: 256 -> 300"),
    ("the grid changed on resume for a profile not searched yet", None, "group-block", {},
     {"floor_mib": 1000, "resolution_mib": 300},
     "group-block: search floor_mib: 4096 -> 1000 (the attempt's grid)"),
    ("the search rule changed on resume", None, "group-leaf-nokv", {}, {"rule": 99},
     "group-leaf-nokv: search rule: 1 -> 99"),
]


@pytest.mark.parametrize(("case", "change", "profile", "edits", "grid", "named"), RESUMES,
                         ids=[c[0] for c in RESUMES])
def test_a_resume_under_changed_inputs_is_refused_before_any_runner(repo_copy, case, change,
                                                                    profile, edits, grid, named):
    from omniprobe.evidence.attempts import SettingsChanged
    from omniprobe.harness.offline.capacity_session import attempt_grid, refuse_changed_settings

    if change is not None:
        _edit(repo_copy, "capacity.json", change)
    store = _store(repo_copy)
    before = {p.name: p.read_bytes() for p in (repo_copy.root / ATTEMPT).iterdir()}
    now = attempt_grid(store, store.capacity[0].search.model_copy(update=grid))
    with pytest.raises(SettingsChanged) as refused:
        refuse_changed_settings(store, [_entry(repo_copy, profile, **edits)], now)
    text = str(refused.value)
    assert f"  {named}" in text and "--fresh" in text, text
    assert {p.name: p.read_bytes() for p in (repo_copy.root / ATTEMPT).iterdir()} == before


@pytest.mark.parametrize("profile", ["group-leaf", "group-block"])
def test_a_resume_under_the_same_inputs_runs_and_keeps_who_chose_the_grid(repo_copy, profile):
    from omniprobe.harness.offline.capacity_session import attempt_grid, refuse_changed_settings

    store = _store(repo_copy)
    # Resumed without the grid flags the attempt was made with, on the same grid: the grid is
    # still the one its command line gave.
    now = attempt_grid(store, store.capacity[0].search.model_copy(update={"chosen_by":
                                                                          "omniprobe"}))
    assert now == store.capacity[0].search and now.chosen_by == "command line"
    refuse_changed_settings(store, [_entry(repo_copy, profile)], now)
