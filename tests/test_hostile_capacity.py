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
    said = (f"{repo_copy.root / ATTEMPT / name}: a capacity attempt holds capacity.json and "
            f"capacity-trials.json beside attempt.json: {name} is no file of its kind")
    assert any(str(p).startswith(said) for p in problems), problems
    # `evidence upgrade` refuses it too, and writes nothing (no offline.json folded in there).
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["evidence", "upgrade"]) == InputError.exit_code
    assert name in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (repo_copy.root / ATTEMPT).iterdir()} == before
