"""Cells derived from request records, as the verdict rules read them."""

from __future__ import annotations

from omniprobe.analysis.summaries import cells_from_requests
from omniprobe.evidence.models import FailureCause, OomSignature, RequestRecord
from omniprobe.evidence.quantities import Range


def rec(flag_set, fixture, seed, outcome="ok", quality="unchecked", wall=1.0, peak=None, oom=None):
    return RequestRecord(flag_set=flag_set, fixture=fixture, seed=seed, outcome=outcome,
                         quality=quality, wall_s=wall, server_peak_mb=peak, oom=oom)


def test_one_cell_per_fixture_and_flag_set_in_request_order():
    cells = cells_from_requests([
        rec("cpuoff", "sim-pair", 1), rec("fp8", "sim-pair", 1), rec("cpuoff", "sim-single", 1),
        rec("cpuoff", "sim-pair", 2)])
    assert {k: [c.fixture for c in v] for k, v in cells.items()} == {
        "cpuoff": ["sim-pair", "sim-single"], "fp8": ["sim-pair"]}
    assert cells["cpuoff"][0].seeds == [1, 2]


def test_worst_outcome_wins_and_ranges_cover_successes_only():
    oom = OomSignature(phase="request", requested="1.50 GiB")
    [cell] = cells_from_requests([
        rec("cpuoff", "sim-four", 1, wall=40.0, peak=23000),
        rec("cpuoff", "sim-four", 2, outcome="oom", wall=3.0, oom=oom),
        rec("cpuoff", "sim-four", 3, wall=44.0, peak=23500)])["cpuoff"]
    assert cell.outcome == "oom" and cell.oom == oom
    assert cell.wall_s == Range(min=40.0, max=44.0)
    assert cell.server_peak_mb == Range(min=23000, max=23500)


def test_quality_is_sound_only_when_every_image_is():
    def cell(*qualities):
        records = [rec("fp8", "sim-pair", i, quality=q) for i, q in enumerate(qualities)]
        return cells_from_requests(records)["fp8"][0].quality

    assert cell("sound", "sound") == "sound"
    assert cell("sound", "broken") == "broken"
    assert cell("sound", "unchecked") == "unchecked"
    crashed = rec("x", "f", 1, outcome="error", quality="sound").model_copy(
        update={"cause": FailureCause(kind="card", reason="crash in model code")})
    [only] = cells_from_requests([crashed])["x"]
    assert only.quality == "unchecked" and only.wall_s is None
