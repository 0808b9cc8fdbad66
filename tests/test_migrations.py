import json
from pathlib import Path

import pytest

from omniprobe import cli
from omniprobe.errors import InputError
from omniprobe.evidence.files import FILE_MODELS, parse_file, write_section
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.migrations import (
    FORMAT_VERSION,
    UnknownFormatVersion,
    content_key,
    content_path,
    fold_settings,
    offline_runs,
    update_to_2,
    update_to_3,
    update_to_4,
    update_to_5,
    update_to_6,
    update_to_7,
    upgrade,
    version_of,
)

PROBE = "evidence/sim/2026-11-30T095416Z-sim-probe"
MATRIX = "evidence/rtx3090/seed-3090-1-serve-matrix"

VERSIONS = [
    ([], 1),
    ([{"seed": 1}], 1),
    ({"id": "a"}, 1),
    ({"format_version": 1, "requests": []}, 1),
    ({"format_version": 2, "requests": []}, 2),
    ({"format_version": 3, "requests": []}, 3),
    ({"format_version": 4, "requests": []}, 4),
]


@pytest.mark.parametrize(("data", "version"), VERSIONS)
def test_version_of(data, version):
    assert version_of(data) == version


UNKNOWN = [8, 0, -1, "2", 2.0, True, None]


@pytest.mark.parametrize("found", UNKNOWN, ids=repr)
def test_an_unknown_version_is_refused_by_name(found):
    with pytest.raises(UnknownFormatVersion) as err:
        version_of({"format_version": found, "requests": []})
    assert f"format version {found!r} is not one" in str(err.value)
    assert "it knows 1, 2, 3, 4, 5, 6, 7;" in str(err.value)


KEYS = [
    ("attempt.json", "attempt"),
    ("requests.json", "requests"),
    ("offline-requests.json", "offline_requests"),
    ("code-read.json", "code_read"),
]


@pytest.mark.parametrize(("file_name", "key"), KEYS)
def test_content_key(file_name, key):
    assert content_key(file_name) == key


PATHS = [
    ("requests.json", "$", "$.requests"),
    ("requests.json", "$[2].seed", "$.requests[2].seed"),
    ("attempt.json", "$.provenance.host", "$.attempt.provenance.host"),
    ("baseline.json", "$.walls[0].fixture", "$.baseline.walls[0].fixture"),
]


@pytest.mark.parametrize(("file_name", "path", "expected"), PATHS)
def test_content_path(file_name, path, expected):
    assert content_path(file_name, path) == expected


UPDATES_TO_2 = [
    ("requests.json", [], {"format_version": 2, "requests": []}),
    ("runs.json", [{"flag_set": "a"}], {"format_version": 2, "runs": [{"flag_set": "a"}]}),
    ("attempt.json", {"id": "x"}, {"format_version": 2, "attempt": {"id": "x"}}),
    ("offline-requests.json", [], {"format_version": 2, "offline_requests": []}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_2)
def test_update_to_2(file_name, old, new):
    assert update_to_2(file_name, old) == new


SEED = "shared/seed/000_c587d909495397fe.txt"
NAMED = {"name": "000_c587d909495397fe.txt", "sha256": None}
UPDATES_TO_3 = [
    # A transcribed attempt's source path becomes the document's name; v2 recorded no digest.
    ("attempt.json",
     {"format_version": 2, "attempt": {"id": "x", "provenance": {
         "kind": "transcribed", "source": SEED, "section": "intro"}}},
     {"format_version": 3, "attempt": {"id": "x", "provenance": {
         "kind": "transcribed", "source": NAMED, "section": "intro"}}}),
    ("attempt.json",
     {"format_version": 2, "attempt": {"provenance": {"kind": "transcribed", "source": "seed"}}},
     {"format_version": 3, "attempt": {"provenance": {
         "kind": "transcribed", "source": {"name": "seed", "sha256": None}}}}),
    # Measured and simulated attempts, and every other file, change only their version.
    ("attempt.json",
     {"format_version": 2, "attempt": {"provenance": {"kind": "measured", "host": "h"}}},
     {"format_version": 3, "attempt": {"provenance": {"kind": "measured", "host": "h"}}}),
    ("requests.json", {"format_version": 2, "requests": [{"source": SEED}]},
     {"format_version": 3, "requests": [{"source": SEED}]}),
    # Malformed content is left for validation to name.
    ("attempt.json", {"format_version": 2, "attempt": []},
     {"format_version": 3, "attempt": []}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_3)
def test_update_to_3(file_name, old, new):
    assert update_to_3(file_name, old) == new


UPDATES_TO_4 = [
    # An output's structure verdict (and its note) is `structure`, no longer `quality`.
    ("requests.json",
     {"format_version": 3, "requests": [{"seed": 1, "quality": "sound", "quality_note": "n"}]},
     {"format_version": 4, "requests": [{"seed": 1, "structure": "sound", "structure_note": "n"}]}),
    ("offline.json", {"format_version": 3, "offline": [{"quality": "broken"}]},
     {"format_version": 4, "offline": [{"structure": "broken"}]}),
    ("psnr.json", {"format_version": 3, "psnr": [{"quality": "sound", "comparator": "rgba"}]},
     {"format_version": 4, "psnr": [{"structure": "sound", "comparator": "rgba"}]}),
    # runs.json carries it in each run's cells; a run without cells is left as it is.
    ("runs.json",
     {"format_version": 3, "runs": [{"flag_set": "a", "cells": [{"quality": "unchecked"}]},
                                    {"flag_set": "b"}]},
     {"format_version": 4, "runs": [{"flag_set": "a", "cells": [{"structure": "unchecked"}]},
                                    {"flag_set": "b"}]}),
    # A file with no structure verdict, or one that already says `structure`, keeps its keys.
    ("figures.json", {"format_version": 3, "figures": [{"quality": "x"}]},
     {"format_version": 4, "figures": [{"quality": "x"}]}),
    ("requests.json", {"format_version": 3, "requests": [{"quality": "a", "structure": "b"}]},
     {"format_version": 4, "requests": [{"quality": "a", "structure": "b"}]}),
    # Malformed content is left for validation to name.
    ("requests.json", {"format_version": 3, "requests": {}},
     {"format_version": 4, "requests": {}}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_4)
def test_update_to_4(file_name, old, new):
    assert update_to_4(file_name, old) == new


UPDATES_TO_5 = [
    # A Diffusers request says its engine: it names its profile; any other keeps its kwarg set.
    ("offline-requests.json",
     {"format_version": 4, "offline_requests": [{"kwarg_set": "group-leaf", "engine": "diffusers"},
                                                {"kwarg_set": "offline-fp8v"},
                                                {"kwarg_set": "k", "engine": "omni"}]},
     {"format_version": 5, "offline_requests": [{"profile": "group-leaf", "engine": "diffusers"},
                                                {"kwarg_set": "offline-fp8v"},
                                                {"kwarg_set": "k", "engine": "omni"}]}),
    # A cell holds no engine: only the Diffusers engine records a build, or an emulated host RAM.
    ("offline.json",
     {"format_version": 4, "offline": [{"kwarg_set": "a", "build": {"build_s": 1}},
                                       {"kwarg_set": "b", "host_ram": [{"cap_mib": 1}]},
                                       {"kwarg_set": "c", "host_ram": []},
                                       {"kwarg_set": "d"}]},
     {"format_version": 5, "offline": [{"profile": "a", "build": {"build_s": 1}},
                                       {"profile": "b", "host_ram": [{"cap_mib": 1}]},
                                       {"kwarg_set": "c", "host_ram": []},
                                       {"kwarg_set": "d"}]}),
    # Keys keep their order; a row that names both keeps both, for validation to name.
    ("offline-requests.json",
     {"format_version": 4, "offline_requests": [{"fixture": "f", "kwarg_set": "a", "seed": 1,
                                                 "engine": "diffusers", "profile": "a"}]},
     {"format_version": 5, "offline_requests": [{"fixture": "f", "kwarg_set": "a", "seed": 1,
                                                 "engine": "diffusers", "profile": "a"}]}),
    ("requests.json", {"format_version": 4, "requests": [{"kwarg_set": "x"}]},
     {"format_version": 5, "requests": [{"kwarg_set": "x"}]}),
    ("offline.json", {"format_version": 4, "offline": {}},
     {"format_version": 5, "offline": {}}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_5)
def test_update_to_5(file_name, old, new):
    assert update_to_5(file_name, old) == new


@pytest.mark.parametrize("name", ["offline.json", "offline-requests.json"])
def test_a_real_version_4_diffusers_file_names_every_profile_after_migrating(name):
    """The committed emulated 5080's files before the bump (v4/): every row names its profile
    (the killed builds' cells by their host RAM), and nothing else changes."""
    data = json.loads((OLD / "v4" / name).read_text())
    loaded = parse_file(OLD / "v4" / name)
    assert loaded and all(r.profile is not None and r.kwarg_set is None for r in loaded)
    assert version_of(data) == 4
    upgraded = update_to_5(name, data)
    assert json.dumps(upgraded[content_key(name)]) == json.dumps(data[content_key(name)]).replace(
        '"kwarg_set"', '"profile"')


def test_upgrade_runs_the_migrations_from_the_version_found():
    assert upgrade("psnr.json", [{"a": 1}]) == ({"format_version": 7, "psnr": [{"a": 1}]}, 1)
    current = {"format_version": FORMAT_VERSION, "psnr": []}
    assert upgrade("psnr.json", current) == (current, FORMAT_VERSION)


def test_every_file_schema_requires_the_current_version():
    for name, model in FILE_MODELS.items():
        schema = model.model_json_schema()
        assert schema["properties"]["format_version"]["const"] == FORMAT_VERSION, name
        assert set(schema["required"]) == {"format_version", content_key(name)}, name


@pytest.mark.parametrize("name", ["attempt.json", "runs.json", "requests.json"])
def test_a_version_1_file_loads_as_the_committed_version(repo, tmp_path, name):
    committed = repo.root / PROBE / name
    old = tmp_path / name
    old.write_text(json.dumps(json.loads(committed.read_text())[content_key(name)]))
    assert parse_file(old) == parse_file(committed)


def test_the_writer_writes_the_current_version_first(repo, tmp_path):
    runs = parse_file(repo.root / PROBE / "runs.json")
    write_section(tmp_path, "runs.json", runs)
    text = (tmp_path / "runs.json").read_text()
    assert text.startswith(f'{{\n  "format_version": {FORMAT_VERSION},\n  "runs": [\n')
    assert text == (repo.root / PROBE / "runs.json").read_text()


def test_a_newer_file_is_refused_naming_file_field_and_versions(repo_copy):
    path = repo_copy.root / PROBE / "requests.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(InputError) as err:
        parse_file(path)
    [problem] = err.value.problems
    assert (problem.file, problem.path) == (str(path), "$.format_version")
    assert f"format version {FORMAT_VERSION + 1}" in problem.message
    assert "knows 1, 2, 3, 4" in problem.message


def test_a_bad_field_in_a_version_1_file_says_it_was_migrated(repo_copy):
    path = repo_copy.root / MATRIX / "runs.json"
    runs = json.loads(path.read_text())["runs"]
    runs[0]["flag_set"] = 7
    path.write_text(json.dumps(runs))
    _, problems = load_attempt(path.parent)
    [problem] = problems
    assert problem.path == "$.runs[0].flag_set"
    assert f"(a format version 1 file, path as in version {FORMAT_VERSION})" in problem.message


def test_validate_names_a_newer_attempt_file_and_leaves_it(repo_copy, monkeypatch, capsys):
    path = repo_copy.root / MATRIX / "attempt.json"
    newer = {**json.loads(path.read_text()), "format_version": 9}
    path.write_text(json.dumps(newer))
    before = path.read_bytes()
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["validate"]) == 1
    err = capsys.readouterr().err
    assert f"{path}: $.format_version: format version 9 is not one" in err
    assert "Traceback" not in err and path.read_bytes() == before


def test_a_version_2_transcribed_attempt_loads_naming_its_document(repo, tmp_path):
    committed = json.loads((repo.root / MATRIX / "attempt.json").read_text())
    committed["format_version"] = 2
    committed["attempt"]["provenance"]["source"] = SEED
    old = tmp_path / "attempt.json"
    old.write_text(json.dumps(committed))
    source = parse_file(old).provenance.source
    assert (source.name, source.sha256) == ("000_c587d909495397fe.txt", None)
    assert source.cite() == "000_c587d909495397fe.txt (sha256 not recorded)"


def test_every_committed_evidence_file_is_at_the_current_version(repo):
    files = sorted(repo.evidence_dir.rglob("*.json"))
    assert files
    for path in files:
        assert json.loads(path.read_text())["format_version"] == FORMAT_VERSION, path


# Real files as omniprobe committed them before each bump (tests/data/migrations/vN, taken from
# the history of evidence/rtx3090/seed-3090-2-measured-pair: version 1 at 2e4ae55^, version 2 at
# 8e1e13f^; version 3 from several attempts at 2346ebe). Their content has moved on since, so
# each is held to what its migrations do.
OLD = Path(__file__).parent / "data" / "migrations"
REAL_OLD_FILES = [(1, "attempt.json"), (1, "runs.json"), (1, "figures.json"), (2, "attempt.json"),
                  (3, "runs.json"), (3, "requests.json"), (3, "offline-requests.json"),
                  (3, "offline.json"), (3, "psnr.json"), (3, "structure.json")]


@pytest.mark.parametrize(("version", "name"), REAL_OLD_FILES)
def test_a_real_file_of_each_older_version_migrates(version, name):
    path = OLD / f"v{version}" / name
    data = json.loads(path.read_text())
    upgraded, found = upgrade(name, data)
    assert (found, version_of(upgraded)) == (version, FORMAT_VERSION)
    loaded = parse_file(path)  # validated as the current format
    if name == "attempt.json":  # update_to_3: the document by name, its digest unrecorded
        source = loaded.provenance.source
        assert (source.name, source.sha256) == ("000_c587d909495397fe.txt", None)
        return
    # update_to_2 puts a bare list under its key; update_to_4 renames quality to structure.
    content = data if version == 1 else data[content_key(name)]
    renamed = json.dumps(content).replace('"quality"', '"structure"').replace(
        '"quality_note"', '"structure_note"')
    if name == "offline-requests.json":  # update_to_5: the tiny Diffusers host's, by profile
        assert {r["engine"] for r in content} == {"diffusers"}
        renamed = renamed.replace('"kwarg_set"', '"profile"')
    if name == "offline.json":  # update_to_6: its rows are runs, one per kwarg set
        renamed = json.dumps(offline_runs(json.loads(renamed)))
    assert json.dumps(upgraded[content_key(name)]) == renamed
    assert ('"structure"' in renamed) == (name != "figures.json")


EMULATED = "evidence/sim-emulated/2026-12-01T094906Z-sim-emulated-12288mib-probe/requests.json"


def test_evidence_upgrade_rewrites_an_older_file_as_the_current_writer_would(
        repo_copy, monkeypatch, capsys):
    # The real version 3 file is this attempt's requests.json before the bump.
    path = repo_copy.root / EMULATED
    current = path.read_text()
    path.write_text((OLD / "v3" / "requests.json").read_text())
    others = {p: p.read_bytes() for p in repo_copy.evidence_dir.rglob("*.json") if p != path}
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["evidence", "upgrade", "--check"]) == 1
    out, err = capsys.readouterr()
    assert f"{path}: format version 3" in out and "1 file(s) older" in err
    assert cli.main(["evidence", "upgrade"]) == 0
    assert f"{path}: format version 3 -> {FORMAT_VERSION}" in capsys.readouterr().out
    assert path.read_text() == current
    assert {p: p.read_bytes() for p in others} == others
    assert cli.main(["evidence", "upgrade", "--check"]) == 0


def test_evidence_upgrade_refuses_before_writing_when_any_file_is_bad(
        repo_copy, monkeypatch, capsys):
    path = repo_copy.root / EMULATED
    old = (OLD / "v3" / "requests.json").read_text()
    path.write_text(old)
    bad = repo_copy.root / MATRIX / "runs.json"
    runs = json.loads(bad.read_text())
    runs["runs"][0]["flag_set"] = 7
    bad.write_text(json.dumps(runs))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["evidence", "upgrade"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: $.runs[0].flag_set" in err and "Traceback" not in err
    assert path.read_text() == old


LOG = {"path": "a/runner.log", "sha256": "0" * 64, "bytes": 1}
LINE = {"sampler": "NVML", "state": "sampled", "target_hz": 10, "samples": 1}
UPDATES_TO_6 = [
    # One run per profile: the init failure row is its init, the copies of the logs and
    # timelines one lifetime each, the profile renamed.
    ("offline.json",
     {"format_version": 5, "offline": [
         {"profile": "cpuoff", "outcome": "init-error", "structure": "unchecked", "init_s": 3.0,
          "note": "n", "cause": {"kind": "host", "reason": "r"}, "logs": [LOG],
          "timelines": [LINE], "host_ram": [{"cap_mib": 1}], "build": {"build_s": 1}}]},
     {"format_version": 6, "offline": [
         {"profile": "model-cpu", "engine": "diffusers",
          "init": {"outcome": "error", "time_s": 3.0, "note": "n",
                   "cause": {"kind": "host", "reason": "r"}},
          "cells": [], "lifetimes": [{"log": LOG, "timeline": LINE, "host_ram": {"cap_mib": 1}}],
          "build": {"build_s": 1}}]}),
    # Cells keep their own fields, in the order they ran; a kwarg set's run is Omni's, ready by
    # its cells' init_s; a runner without a timeline is a lifetime with only its log.
    ("offline.json",
     {"format_version": 5, "offline": [
         {"kwarg_set": "k", "fixture": "f", "outcome": "ok", "structure": "sound",
          "init_s": 1.5, "logs": [LOG], "timelines": []},
         {"kwarg_set": "cpuoff-expandable", "fixture": "f", "outcome": "oom",
          "structure": "unchecked"},
         {"kwarg_set": "k", "fixture": "g", "outcome": "oom", "structure": "unchecked",
          "init_s": 1.5, "logs": [LOG], "timelines": []}]},
     {"format_version": 6, "offline": [
         {"kwarg_set": "k", "engine": "omni", "init": {"outcome": "ready", "time_s": 1.5},
          "cells": [{"fixture": "f", "outcome": "ok", "structure": "sound"},
                    {"fixture": "g", "outcome": "oom", "structure": "unchecked"}],
          "lifetimes": [{"log": LOG}]},
         {"kwarg_set": "cpuoff-expandable", "engine": "omni",
          "cells": [{"fixture": "f", "outcome": "oom", "structure": "unchecked"}],
          "lifetimes": []}]}),
    # A transcribed row without a fixture that is no init failure is a cell of its own.
    ("offline.json",
     {"format_version": 5, "offline": [{"kwarg_set": "k", "outcome": "ok", "structure": "broken"}]},
     {"format_version": 6, "offline": [
         {"kwarg_set": "k", "engine": "omni",
          "cells": [{"outcome": "ok", "structure": "broken"}], "lifetimes": []}]}),
    # Every file that names a Diffusers profile renames it; a flag set keeps its name.
    ("offline-requests.json",
     {"format_version": 5, "offline_requests": [{"profile": "cpuoff-expandable"},
                                                {"kwarg_set": "cpuoff"}]},
     {"format_version": 6, "offline_requests": [{"profile": "model-cpu-expandable"},
                                                {"kwarg_set": "cpuoff"}]}),
    ("capacity.json", {"format_version": 5, "capacity": [{"profile": "cpuoff"}]},
     {"format_version": 6, "capacity": [{"profile": "model-cpu"}]}),
    ("runs.json", {"format_version": 5, "runs": [{"flag_set": "cpuoff", "profile": "cpuoff"}]},
     {"format_version": 6, "runs": [{"flag_set": "cpuoff", "profile": "cpuoff"}]}),
    # Malformed content is left for validation to name.
    ("offline.json", {"format_version": 5, "offline": [7]},
     {"format_version": 6, "offline": [7]}),
    ("offline.json", {"format_version": 5, "offline": {}},
     {"format_version": 6, "offline": {}}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_6)
def test_update_to_6(file_name, old, new):
    assert update_to_6(file_name, old) == new


UPDATES_TO_7 = [
    # The Diffusers env's old name, where each file holds it.
    ("environment.json", {"format_version": 6, "environment": {"env": "baseline", "venv": "v"}},
     {"format_version": 7, "environment": {"env": "diffusers", "venv": "v"}}),
    ("attempt.json", {"format_version": 6, "attempt": {"id": "a", "environment": {
        "env": "baseline", "digest": "d"}}},
     {"format_version": 7, "attempt": {"id": "a", "environment": {
         "env": "diffusers", "digest": "d"}}}),
    # The probe env, no env, no environment, or another file: only the version changes.
    ("environment.json", {"format_version": 6, "environment": {"env": "probe"}},
     {"format_version": 7, "environment": {"env": "probe"}}),
    ("attempt.json", {"format_version": 6, "attempt": {"id": "a", "environment": {"env": None}}},
     {"format_version": 7, "attempt": {"id": "a", "environment": {"env": None}}}),
    ("attempt.json", {"format_version": 6, "attempt": {"id": "a"}},
     {"format_version": 7, "attempt": {"id": "a"}}),
    ("requests.json", {"format_version": 6, "requests": [{"env": "baseline"}]},
     {"format_version": 7, "requests": [{"env": "baseline"}]}),
    # Malformed content is left for validation to name.
    ("attempt.json", {"format_version": 6, "attempt": ["baseline"]},
     {"format_version": 7, "attempt": ["baseline"]}),
    ("environment.json", {"format_version": 6, "environment": "baseline"},
     {"format_version": 7, "environment": "baseline"}),
]


@pytest.mark.parametrize(("file_name", "old", "new"), UPDATES_TO_7)
def test_update_to_7(file_name, old, new):
    assert update_to_7(file_name, old) == new


FOLDS = [
    # A profile's settings go on its run; one whose run recorded nothing else is a run of its own.
    ({"format_version": 6, "offline": [{"profile": "a", "engine": "diffusers", "cells": []}]},
     {"format_version": 6, "profile_settings": [{"profile": "a", "settings": {"x": 1}},
                                                {"profile": "b", "settings": {"y": 2}}]},
     {"format_version": 6, "offline": [
         {"profile": "a", "engine": "diffusers", "cells": [], "settings": {"x": 1}},
         {"profile": "b", "engine": "diffusers", "settings": {"y": 2}}]}),
    # Malformed settings are left as they are, for validation to name.
    ({"format_version": 6, "offline": []}, {"format_version": 6, "profile_settings": {}},
     {"format_version": 6, "offline": []}),
]


@pytest.mark.parametrize(("offline", "settings", "folded"), FOLDS)
def test_fold_settings(offline, settings, folded):
    assert fold_settings(offline, settings) == folded


V5_ATTEMPT = ("rtx3090-on-h200-diffusers",
              "2026-12-02T005736Z-rtx3090-on-h200-diffusers-24576mib-offline")


def _v5_attempt(root: Path) -> Path:
    """The real version 5 attempt (tests/data/migrations/v5: this attempt before the bump), with
    its profile-settings.json, in place of the committed one."""
    folder = root / "evidence" / V5_ATTEMPT[0] / V5_ATTEMPT[1]
    for path in (OLD / "v5").iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def test_a_real_version_5_attempt_loads_with_its_settings_folded_into_its_runs(repo, repo_copy):
    folder = _v5_attempt(repo_copy.root)
    assert (folder / "profile-settings.json").is_file()
    old, problems = load_attempt(folder)
    committed, _ = load_attempt(repo.root / "evidence" / V5_ATTEMPT[0] / V5_ATTEMPT[1])
    assert problems == [] and old.offline == committed.offline
    seed, int8 = old.offline
    assert (seed.profile, seed.init.outcome, len(seed.cells), len(seed.lifetimes)) == (
        "seed-baseline", "ready", 1, 1)
    assert seed.settings is not None and seed.build is not None
    # Its settings were recorded as it began; it never reached offline.json: settings only.
    assert (int8.profile, int8.ran, int8.cells, int8.settings is not None) == (
        "int8-leaf-nostream", False, [], True)


def test_evidence_upgrade_folds_a_version_5_attempts_settings_and_removes_the_file(
        repo, repo_copy, monkeypatch, capsys):
    folder = _v5_attempt(repo_copy.root)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["evidence", "upgrade"]) == 0
    assert f"{folder / 'profile-settings.json'}: format version 5 -> 7" in capsys.readouterr().out
    assert not (folder / "profile-settings.json").exists()
    committed = repo.root / "evidence" / V5_ATTEMPT[0] / V5_ATTEMPT[1]
    for name in ("offline.json", "offline-requests.json", "attempt.json"):
        assert (folder / name).read_text() == (committed / name).read_text(), name


def test_a_current_profile_settings_file_is_refused_by_name(repo_copy):
    folder = repo_copy.root / "evidence" / V5_ATTEMPT[0] / V5_ATTEMPT[1]
    path = folder / "profile-settings.json"
    path.write_text(json.dumps({"format_version": 6, "profile_settings": []}))
    _, problems = load_attempt(folder)
    [problem] = problems
    assert (problem.file, problem.path) == (str(path), "$.format_version")
    assert "lives in offline.json" in problem.message
