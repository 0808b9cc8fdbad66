"""Cells derived from request records, as the verdict rules read them."""

from __future__ import annotations

import pytest

from omniprobe.analysis.summaries import cells_from_requests
from omniprobe.evidence.models.common import FailureCause, OomSignature
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.quantities import Range

from .conftest import agreeing

CARD = FailureCause(kind="card", reason="crash in model code")


def rec(flag_set, fixture, seed, outcome="ok", structure="unchecked", wall=1.0, peak=None, oom=None,
        cause=None):
    return RequestRecord(flag_set=flag_set, fixture=fixture, seed=seed, outcome=outcome,
                         structure=structure, wall_s=wall, server_peak_mb=peak, cause=cause,
                         **agreeing(outcome, structure, **({"oom": oom} if oom else {})))


def test_one_cell_per_fixture_and_flag_set_in_request_order():
    cells = cells_from_requests([
        rec("cpuoff", "sim-pair", 1), rec("fp8", "sim-pair", 1), rec("cpuoff", "sim-single", 1),
        rec("cpuoff", "sim-pair", 2)])
    assert {k: [c.fixture for c in v] for k, v in cells.items()} == {
        "cpuoff": ["sim-pair", "sim-single"], "fp8": ["sim-pair"]}
    assert cells["cpuoff"][0].seeds == [1, 2]


OOM = OomSignature(phase="request", requested="1.50 GiB")


@pytest.mark.parametrize(("records", "outcome", "seeds", "wall", "peak"), [
    # every seed ok: its figures span every seed
    ([(1, "ok", 40.0, 23000), (2, "ok", 44.0, 23500)], "ok", [1, 2],
     Range(min=40.0, max=44.0), Range(min=23000, max=23500)),
    # one seed ok, the rest OOM (issue 24): the cell says OOM and quotes no ok seed's wall
    ([(2301, "ok", 30.0, 20000), (2302, "oom", 3.0, None), (2303, "oom", 3.0, None),
      (2304, "oom", 3.0, None)], "oom", [2301, 2302, 2303, 2304], None, None),
    # the worst outcome wins; an error among ok seeds quotes no figures either
    ([(1, "ok", 40.0, 23000), (2, "error", 1.0, None), (3, "ok", 44.0, None)], "error",
     [1, 2, 3], None, None),
    ([(1, "oom", 3.0, None)], "oom", [1], None, None),
])
def test_a_cell_takes_its_seeds_and_its_figures_from_the_same_records(records, outcome, seeds,
                                                                       wall, peak):
    [cell] = cells_from_requests([
        rec("cpuoff", "sim-four", seed, outcome=o, wall=w, peak=p,
            oom=OOM if o == "oom" else None, cause=CARD if o == "error" else None)
        for seed, o, w, p in records])["cpuoff"]
    assert (cell.outcome, cell.seeds, cell.wall_s, cell.server_peak_mb) == (outcome, seeds, wall,
                                                                            peak)
    assert cell.oom == (OOM if outcome == "oom" else None)


def test_structure_is_sound_only_when_every_image_is():
    def cell(*structures):
        records = [rec("fp8", "sim-pair", i, structure=q) for i, q in enumerate(structures)]
        return cells_from_requests(records)["fp8"][0].structure

    assert cell("sound", "sound") == "sound"
    assert cell("sound", "broken") == "broken"
    assert cell("sound", "unchecked") == "unchecked"
    crashed = rec("x", "f", 1, outcome="error", cause=CARD)
    [only] = cells_from_requests([crashed])["x"]
    assert only.structure == "unchecked" and only.wall_s is None
