import pytest

from omniprobe.analysis.diffusers_capacity import KvMeasure, kv_per_reference
from omniprobe.analysis.kv_compare import cross_ratio, kv_by_size
from omniprobe.evidence.quantities import Range

KIB_512 = 524288


def kv(refs, tokens, text, res=1024, profile="p"):
    return KvMeasure(profile, f"f{refs}", refs, res, tokens * KIB_512, tokens, text)


@pytest.mark.parametrize(("measured", "stated", "ratio"), [
    # Diffusers' 2.03 GiB per 1024² reference against the seed's ~0.25–0.3 GiB: 6.8–8.1×, where
    # a ratio to one end alone would say 6.8× or 8.1×.
    ((2.03, 2.03), (0.25, 0.3), (6.77, 8.12)),
    ((512, 512), (64, 64), (8.0, 8.0)),  # per prefix token
    ((2.03, 2.03), (2.8, 2.8), (0.72, 0.72)),  # below the helper system's retention figure
    ((0.26, 0.29), (0.25, 0.3), None),  # overlapping: no ratio to state
])
def test_a_ratio_across_engines_spans_both_ranges(measured, stated, ratio):
    found = cross_ratio(Range(min=measured[0], max=measured[1]), Range(min=stated[0], max=stated[1]))
    if ratio is None:
        assert found.overlaps and found.ratio is None
    else:
        assert (round(found.ratio.min, 2), round(found.ratio.max, 2)) == ratio


def test_the_cache_by_condition_size_takes_each_request_against_its_own_prompt():
    # Prompts of 31, 20 and 57 tokens: against the 0-reference prompt the share would read
    # 4,143–4,160 tokens; against each request's own prompt it is 4,149 at both counts.
    measures = [kv(0, 31, 31), kv(1, 4169, 20), kv(4, 16653, 57),
                kv(0, 31, 31, res=512), kv(2, 2079, 31, res=512)]
    sizes = {s.output_resolution: s for s in kv_by_size(measures, kv_per_reference(measures))}
    assert sizes[1024].requests == 3 and sizes[1024].bytes_per_token == Range(min=KIB_512,
                                                                               max=KIB_512)
    assert sizes[1024].tokens_per_reference == Range(min=4149, max=4149)
    assert sizes[512].tokens_per_reference == Range(min=1024, max=1024)
    # Records that do not count their prompt's tokens give the per-token figure and no share.
    old = kv_by_size([kv(0, 31, None), kv(1, 4174, None)], [])
    assert old[0].tokens_per_reference is None and old[0].bytes_per_reference is None
