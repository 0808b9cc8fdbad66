"""The Diffusers engine's host figures as evidence (issue 32): the build's peak, the steady
footprint with its pinned and pageable parts, and each request's sampled peak must agree with
themselves, or `validate` names them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omniprobe.evidence.models.offline import DiffusersBuild, OfflineRequest

BUILD = {"parameters_b": {"transformer": 7.1}, "build_s": 1.0}


@pytest.mark.parametrize(("figures", "error"), [
    ({"build_host_peak_mib": 20000.0, "steady_host_mib": 18000.0, "pinned_host_mib": 12000.0,
      "pageable_host_mib": 6000.0}, None),
    ({"steady_host_mib": 18000.0, "pinned_host_mib": 20000.0, "pageable_host_mib": 0.0}, None),
    ({"build_host_peak_mib": 17000.0, "steady_host_mib": 18000.0},
     "steady_host_mib 18000.0 is above build_host_peak_mib 17000.0"),
    ({"steady_host_mib": 18000.0, "pinned_host_mib": 12000.0, "pageable_host_mib": 18000.0},
     "pageable_host_mib 18000.0 is not steady_host_mib 18000.0 less pinned_host_mib 12000.0"),
])
def test_a_builds_host_figures_must_agree(figures, error):
    if error is None:
        DiffusersBuild.model_validate({**BUILD, **figures})
        return
    with pytest.raises(ValidationError, match=error):
        DiffusersBuild.model_validate({**BUILD, **figures})


REQUEST = {"kwarg_set": "group-leaf", "fixture": "standin-t2i", "inputs": "stand-in", "seed": 2301,
           "outcome": "error", "error": "RuntimeError: x", "structure": "unchecked", "wall_s": 1.0,
           "lifetime": 0}


@pytest.mark.parametrize(("figures", "error"), [
    ({"host_peak_mib": 21000.0, "host_end_mib": 20000.0}, None),
    ({"host_peak_mib": 21000.0, "host_end_mib": 21000.0}, None),
    ({"host_peak_mib": 20000.0, "host_end_mib": 21000.0},
     "host_end_mib 21000.0 is above host_peak_mib 20000.0"),
])
def test_a_requests_sampled_host_peak_holds_its_end(figures, error):
    if error is None:
        OfflineRequest.model_validate({**REQUEST, **figures})
        return
    with pytest.raises(ValidationError, match=error):
        OfflineRequest.model_validate({**REQUEST, **figures})
