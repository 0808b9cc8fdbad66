import pytest

from omniprobe.analysis.estimates import judge, quantization_base, transparency_check, within
from omniprobe.config.hosts import load_hosts
from omniprobe.evidence.models.outputs import StructureObservation
from omniprobe.evidence.quantities import Range


@pytest.mark.parametrize(
    ("derived", "stated", "agrees"),
    [
        ((0.18, 0.41), (0.25, 0.3), False),
        ((0.26, 0.29), (0.25, 0.3), True),
        ((0.254, 0.296), (0.25, 0.3), True),  # inside at the estimate's own precision
        ((1.99, 1.99), (6, 6), False),
        ((6.2, 6.4), (6, 6), True),  # "~6 GiB": 6.2 rounds to 6
    ],
)
def test_within_the_estimate_at_its_precision(derived, stated, agrees):
    assert within(Range(min=derived[0], max=derived[1]), Range(min=stated[0], max=stated[1])) is agrees


def test_the_base_of_a_quantized_flag_set(repo):
    hosts = load_hosts(repo.hosts_file)
    assert quantization_base(hosts, "fp8", "fp8") == "cpuoff"
    assert quantization_base(hosts, "fp8-expandable", "fp8") == "cpuoff-expandable"
    assert quantization_base(hosts, "int8", "fp8") is None
    assert quantization_base(hosts, "cpuoff", "fp8") is None


@pytest.mark.parametrize(
    ("transparent", "alpha_mean", "agrees", "at_most"),
    [
        ((0.965, 0.97), 115, False, 0.549),
        ((0.965, 0.97), 5, True, 0.98),
    ],
)
def test_a_transparent_fraction_against_the_alpha_mean(transparent, alpha_mean, agrees, at_most):
    o = StructureObservation(scope="s", structure="broken", opaque_fraction=Range(min=0.008, max=0.035),
                             transparent_fraction=Range(min=transparent[0], max=transparent[1]),
                             alpha_mean=Range(min=alpha_mean, max=alpha_mean))
    check = transparency_check(o, 255)
    assert (check.agrees, check.derived.max) == (agrees, at_most)
    assert (check.not_opaque.min, check.not_opaque.max) == (0.965, 0.992)


@pytest.mark.parametrize(
    ("derived", "stated", "spread", "judgement"),
    [
        ((0.18, 0.41), (0.25, 0.3), 0.0, "consistent"),  # the measurements bracket it
        ((0.26, 0.29), (0.25, 0.3), 0.0, "consistent"),  # inside it
        ((0.18, 0.2), (0.25, 0.3), 0.1, "not confirmed"),  # outside, by less than the spread
        ((0.18, 0.2), (0.25, 0.3), 0.0, "disagrees"),  # outside, by more than the spread
        ((0.5, 0.6), (0.25, 0.3), 0.25, "not confirmed"),
        ((0.5, 0.6), (0.25, 0.3), 0.1, "disagrees"),
    ],
)
def test_an_estimate_disagrees_only_beyond_the_measurements_spread(derived, stated, spread, judgement):
    assert judge(Range(min=derived[0], max=derived[1]), Range(min=stated[0], max=stated[1]),
                 spread) == judgement


@pytest.mark.parametrize(
    ("derived", "stated", "spread", "judgement"),
    [
        # The seed's own case: 1→2 reference deltas of 0.18–0.41 GiB bracket its ~0.25–0.3 GiB,
        # but the same cells' peaks spread 1.34 GiB: a check that could not fail confirms nothing.
        ((0.18, 0.41), (0.25, 0.3), 1.34, "not confirmed"),
        ((0.18, 0.41), (0.25, 0.3), 0.41, "not confirmed"),  # at the spread: still noise
        # Beyond the estimate by more than the spread refutes it, noise or not.
        ((0.18, 0.41), (2.5, 3.0), 1.34, "disagrees"),
    ],
)
def test_differences_within_the_cells_own_spread_confirm_nothing(derived, stated, spread,
                                                                  judgement):
    assert judge(Range(min=derived[0], max=derived[1]), Range(min=stated[0], max=stated[1]),
                 spread, below_spread=derived[1] <= spread) == judgement
