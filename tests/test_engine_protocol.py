"""The runner's protocol, declared once (omniprobe_engine/protocol.py): what the runner writes is
what the harness validates, and every figure an engine measures reaches the evidence or is
dropped by a named decision."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from omniprobe.config.fixtures import load_fixtures
from omniprobe.evidence.models.capacity import CapacityTrial
from omniprobe.evidence.models.offline import OfflineRequest
from omniprobe.harness.offline.capacity import trial_record
from omniprobe.harness.offline.runner_events import (
    MODELS,
    Measured,
    RunnerProtocolError,
    validated_event,
)
from omniprobe_engine import protocol
from omniprobe_engine import runner as offline_runner
from omniprobe_engine.protocol import (
    MEASURES,
    TRIAL_CARRIES,
    TRIAL_DROPS,
    RequestSpec,
    SearchCount,
    SearchSpec,
)

from .conftest import REPO

# Every figure measured, each a value its field admits.
ALL_MEASURED = {name: (1 << 20 if name.endswith("_bytes") else 7 if "tokens" in name
                       or "layers" in name else 512.5) for name in MEASURES}


class Measuring:
    """A Diffusers-like engine: survives failures, measures every figure, fits at 4096 MiB."""

    peak_source, survives_failure = "torch-reserved", True

    def __init__(self, extra: dict | None = None):
        self.limit, self.recovered, self.extra = None, 0, extra or {}

    def set_pool_limit(self, limit_mib):
        self.limit = limit_mib

    def generate(self, request):
        self.last = {"peak_mib": 4000.0, **ALL_MEASURED, **self.extra}
        if self.limit is not None and self.limit < 4096:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
        Path(request["output"]).write_bytes(b"")
        return self.last

    def recover(self):
        self.recovered += 1


def _request(tmp_path: Path, i: int = 0, references: int = 0) -> RequestSpec:
    return RequestSpec(id=f"r{i}", fixture="f", seed=2301, prompt="p", width=64, height=48,
                       reference_paths=[str(tmp_path / f"ref{n}.png") for n in range(references)],
                       num_inference_steps=2, true_cfg_scale=4.0, output=str(tmp_path / "o.png"))


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_figure_is_carried_or_dropped_by_name_on_each_path():
    assert set(TRIAL_CARRIES) | set(TRIAL_DROPS) == set(MEASURES)
    assert not set(TRIAL_CARRIES) & set(TRIAL_DROPS)
    assert all(reason.strip() for reason in TRIAL_DROPS.values())
    # Where each figure is kept: a request keeps every one, a trial those it carries.
    assert set(MEASURES) <= set(OfflineRequest.model_fields)
    assert set(TRIAL_CARRIES) <= set(CapacityTrial.model_fields)
    assert not set(TRIAL_DROPS) & set(CapacityTrial.model_fields)
    assert set(Measured.model_fields) == set(MEASURES)


@pytest.mark.parametrize("kind", sorted(protocol.EVENTS))
def test_the_harness_validates_each_event_field_for_field_as_the_protocol_declares_it(kind):
    declared = {f.name for f in dataclasses.fields(protocol.EVENTS[kind])}
    assert set(MODELS[kind].model_fields) == declared


def test_what_the_runner_writes_of_a_search_the_harness_reads_and_records_every_carried_figure(
        tmp_path):
    spec = SearchSpec(floor_mib=1024, ceiling_mib=8192, resolution_mib=1024, repeats=1,
                      counts=[SearchCount(reference_count=0, request=_request(tmp_path))])
    engine = Measuring()
    results = tmp_path / "results.jsonl"
    assert offline_runner.run_search(lambda: engine, spec, offline_runner.Results(str(results))) == 0
    events = [validated_event(e, results) for e in _events(results)]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "init" and kinds[-2:] == ["band", "done"] and "trial" in kinds
    fixture = next(f for f in load_fixtures(REPO / "fixtures" / "fixtures.json").fixtures
                   if f.id == "sim-t2i")
    trials = [trial_record("p", fixture, {**e, "fixture": fixture.id}, 0, ())
              for e in events if e["event"] == "trial"]
    fit = next(t for t in trials if t.outcome == "fit")
    oom = next(t for t in trials if t.outcome == "oom")
    for name in TRIAL_CARRIES:  # a failed trial keeps what it measured up to its failure too
        assert getattr(fit, name) == ALL_MEASURED[name] == getattr(oom, name), name
    assert engine.recovered == sum(t.outcome != "fit" for t in trials)
    band = events[-2]
    assert (band["reference_count"], band["fits_at_mib"], band["fails_at_mib"]) == (0, 4096, 3072)


def test_what_the_runner_writes_of_requests_the_harness_reads_with_every_figure(tmp_path):
    results = tmp_path / "results.jsonl"
    assert offline_runner.run(lambda: Measuring(), [_request(tmp_path, i) for i in range(2)],
                              offline_runner.Results(str(results))) == 0
    events = [validated_event(e, results) for e in _events(results)]
    assert [e["event"] for e in events] == ["init", "request", "request", "done"]
    assert events[1]["measured"] == ALL_MEASURED and events[1]["peak_mib"] == 4000.0
    assert _events(results)[1]["event"] == "request"  # first: where a log reader looks for it


def test_a_figure_the_protocol_does_not_declare_is_refused_on_both_sides(tmp_path):
    """An engine that measures something new must declare it in protocol.Measures and decide,
    per path, whether it is carried: the runner will not write it, nor the harness take it."""
    results = tmp_path / "results.jsonl"
    with pytest.raises(TypeError, match="new_figure_mib"):
        offline_runner.run(lambda: Measuring({"new_figure_mib": 1.0}), [_request(tmp_path)],
                           offline_runner.Results(str(results)))
    line = {"event": "request", "id": "r0", "fixture": "f", "seed": 1, "outcome": "ok",
            "wall_s": 0.1, "measured": {"new_figure_mib": 1.0}}
    with pytest.raises(RunnerProtocolError, match=r"field 'measured\.new_figure_mib'"):
        validated_event(line, results)


@pytest.mark.parametrize(("data", "words"), [
    ({"id": "x", "seed": 1}, "lacks fixture, prompt"),
    ({**dataclasses.asdict(RequestSpec("x", "f", 1, "p", 8, 8, [], 1, 1.0, "o.png")),
      "references": []}, "has references, which RequestSpec lacks"),
    ([1], "expected a JSON object (RequestSpec), got list"),
])
def test_a_spec_not_as_declared_is_named_by_what_it_lacks_or_adds(data, words):
    with pytest.raises(protocol.SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RequestSpec.of(data)


def test_a_search_spec_round_trips_through_json(tmp_path):
    spec = SearchSpec(1024, 8192, 256, 2, [
        SearchCount(0, _request(tmp_path), protocol.KnownBand(2048, 1792)),
        SearchCount(1, _request(tmp_path, 1, 1), None, [protocol.RecordedTrial(4096, "fit")])])
    assert SearchSpec.of(json.loads(json.dumps(protocol.as_json(spec)))) == spec


def test_pinned_blocks_cached_from_earlier_requests_are_given_back_once_the_gpu_is_idle():
    """A request's page-locked figure must not hold what ran before it: torch keeps freed pinned
    blocks cached, so before each request the engine synchronizes, then gives them back."""
    from types import SimpleNamespace

    from omniprobe_engine.diffusers_build import release_pinned_cache

    calls = []
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: calls.append("synchronize")),
                            _C=SimpleNamespace(_host_emptyCache=lambda: calls.append("empty")))
    release_pinned_cache(torch)
    assert calls == ["synchronize", "empty"]
