"""The attempt store owns the offline files: a run begun, replaced in place, its settings held
once; every write validated and atomic."""

import json

import pytest
from pydantic import ValidationError

from omniprobe.evidence.attempts import SettingsChanged, _load
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.models.common import replaced
from omniprobe.evidence.models.offline import OfflineCell, OfflineRun

ATTEMPT = ("evidence/rtx3090-on-h200-diffusers/"
           "2026-12-02T005736Z-rtx3090-on-h200-diffusers-24576mib-offline")


@pytest.fixture
def store(repo_copy):
    return _load(repo_copy, repo_copy.root / ATTEMPT)


def test_a_run_begun_again_under_other_settings_is_refused_and_nothing_written(store):
    path = store.folder / "offline.json"
    before = path.read_bytes()
    [seed] = [r for r in store.offline if r.profile == "seed-baseline"]
    assert store.begin_offline_run(replaced(seed, cells=[], lifetimes=[])) == seed
    changed = {**seed.settings, "steps": 99}
    with pytest.raises(SettingsChanged, match="'seed-baseline' under other settings"):
        store.begin_offline_run(OfflineRun(profile="seed-baseline", engine="diffusers",
                                           settings=changed))
    assert path.read_bytes() == before


def test_a_new_run_is_written_as_it_begins_and_replaced_in_its_place(store):
    names = [r.configuration for r in store.offline]
    begun = store.begin_offline_run(OfflineRun(profile="group-leaf", engine="diffusers",
                                               settings={"offload": "group-leaf"}))
    assert [r.configuration for r in store.offline] == [*names, "group-leaf"]
    cell = OfflineCell(fixture="standin-t2i", outcome="ok", structure="unchecked")
    store.put_offline_run(replaced(store.offline[0], cells=[cell]))
    loaded, problems = load_attempt(store.folder)
    assert problems == [] and loaded.offline == store.offline
    assert loaded.offline[0].cells == [cell] and loaded.offline[-1] == begun
    assert [r.configuration for r in loaded.offline] == [*names, "group-leaf"]


def test_a_run_names_its_configuration_by_its_engine(store):
    [seed] = [r for r in store.offline if r.profile == "seed-baseline"]
    with pytest.raises(ValidationError, match="a Diffusers run names its profile"):
        replaced(seed, engine="omni")
    with pytest.raises(ValidationError, match="names its profile"):
        OfflineRun(kwarg_set="k", engine="diffusers")
    with pytest.raises(ValidationError, match="only a Diffusers run records a build"):
        OfflineRun(kwarg_set="k", engine="omni", settings={"x": 1})
    with pytest.raises(ValidationError, match="exactly one of kwarg_set"):
        OfflineRun(kwarg_set="k", profile="p", engine="diffusers")


def test_a_record_is_held_only_once_written(store, monkeypatch):
    record = store.offline_requests[0]
    count = len(store.offline_requests)
    store.add_offline_request(record.model_copy(update={"seed": 7}))
    data = json.loads((store.folder / "offline-requests.json").read_text())
    assert len(data["offline_requests"]) == count + 1 == len(store.offline_requests)

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr("omniprobe.evidence.attempts.write_section", fail)
    with pytest.raises(OSError):
        store.add_offline_request(record)
    assert len(store.offline_requests) == count + 1


def test_an_omni_run_begun_is_written_only_once_it_records_something(store):
    before = (store.folder / "offline.json").read_bytes()
    begun = store.begin_offline_run(OfflineRun(kwarg_set="k", engine="omni"))
    assert begun.kwarg_set == "k" and store.offline_run("k") is None
    assert (store.folder / "offline.json").read_bytes() == before
