"""The Diffusers adapters as classes (issue 47): each family's capabilities, the refusals that fall
out of them, the defaults a family inherits, and the registry that finds them; all without torch
(the adapters import it only inside what builds or records)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from omniprobe_engine.adapters import adapter_for, known_pipelines, registry
from omniprobe_engine.adapters.base import OFFLOADS, DiffusersAdapter
from omniprobe_engine.adapters.flux2klein import Flux2KleinAdapter, Flux2KleinKVAdapter
from omniprobe_engine.adapters.qwenimage21 import QwenImage21Adapter
from omniprobe_engine.diffusers_engine import DiffusersEngine, profile_refusal

QWEN, KLEIN, KLEIN_KV = "QwenImage21Pipeline", "Flux2KleinPipeline", "Flux2KleinKVPipeline"
KLEIN_NO_CACHE = "use_kv_cache = true: Flux2KleinPipeline has no conditioning KV cache"
KLEIN_NO_SIZE = ("output_resolution: Flux2KleinPipeline sizes condition images itself (up to "
                 "1024² pixels), it takes no output_resolution")


class Untouchable:
    """A pipeline that fails any use: what is handed it must be left alone."""

    def __getattr__(self, name):
        raise AssertionError(f"pipe.{name} was used")

    def __setattr__(self, name, value):
        raise AssertionError(f"pipe.{name} was set")


def test_every_family_is_found_once_by_its_pipelines():
    assert known_pipelines() == (KLEIN_KV, KLEIN, QWEN)
    assert type(adapter_for(QWEN)) is QwenImage21Adapter
    assert type(adapter_for(KLEIN)) is Flux2KleinAdapter
    assert type(adapter_for(KLEIN_KV)) is Flux2KleinKVAdapter
    assert adapter_for(QWEN) is adapter_for(QWEN)  # one instance a process


def test_a_pipeline_no_adapter_serves_is_a_key_error_naming_those_that_are_served():
    with pytest.raises(KeyError) as caught:
        adapter_for("NoSuchPipeline")
    assert caught.value.args[0] == ("no Diffusers adapter serves pipeline 'NoSuchPipeline' "
                                    f"(adapters exist for {KLEIN_KV}, {KLEIN}, {QWEN})")


@pytest.mark.parametrize(("pipeline", "cache", "cache_always", "frees_it", "guidance",
                          "resolution"), [
    (QWEN, True, False, False, True, True),
    (KLEIN, False, False, False, True, False),
    # the KV release: a cache always kept with references, freed before its decode, no guidance
    (KLEIN_KV, True, True, True, False, False),
])
def test_each_family_states_its_capabilities(pipeline, cache, cache_always, frees_it, guidance,
                                             resolution):
    adapter = adapter_for(pipeline)
    assert (adapter.keeps_conditioning_cache, not adapter.cache_optional,
            adapter.frees_cache_before_decode, adapter.takes_guidance,
            adapter.takes_output_resolution) == (cache, cache_always, frees_it, guidance,
                                                 resolution)
    assert (adapter.placements, adapter.scheduler) == (OFFLOADS, "FlowMatchEulerDiscreteScheduler")


def full(pipeline: str, **settings) -> dict:
    """A profile as the engine gets it: every knob a profile must state, stated."""
    return {"pipeline": pipeline, "offload": "none", "use_kv_cache": False, **settings}


class OnDeviceOnly(DiffusersAdapter):
    pipelines = ("OnDevicePipeline",)
    placements = ("none",)


@pytest.mark.parametrize(("adapter", "settings", "expected"), [
    (adapter_for(KLEIN), {"use_kv_cache": True}, KLEIN_NO_CACHE),
    (adapter_for(KLEIN), {"use_kv_cache": False}, None),
    (adapter_for(QWEN), {"use_kv_cache": True}, None),
    (adapter_for(KLEIN), {"output_resolution": 512}, KLEIN_NO_SIZE),
    (adapter_for(KLEIN), {"output_resolution": None}, None),
    (adapter_for(QWEN), {"output_resolution": 512}, None),
    (adapter_for(KLEIN), {"use_kv_cache": True, "output_resolution": 512}, KLEIN_NO_CACHE),
    (adapter_for(QWEN), {"offload": "group-block"}, None),
    (adapter_for(KLEIN_KV), {"use_kv_cache": True}, None),
    (adapter_for(KLEIN_KV), {"use_kv_cache": True, "kv_placement": "host-pinned-packed"}, None),
    (adapter_for(KLEIN_KV), {"use_kv_cache": False},
     "use_kv_cache = false: Flux2KleinKVPipeline always keeps its conditioning KV cache"),
    (adapter_for(KLEIN_KV), {"use_kv_cache": True, "release_kv_before_decode": True},
     "release_kv_before_decode = true: Flux2KleinKVPipeline frees its conditioning cache before "
     "the decode itself"),
    (adapter_for(QWEN), {"use_kv_cache": True, "release_kv_before_decode": True}, None),
    (adapter_for(KLEIN_KV), {"use_kv_cache": True, "true_cfg_scale": 4.0},
     "true_cfg_scale = 4.0: Flux2KleinKVPipeline runs no classifier-free guidance"),
    (adapter_for(KLEIN_KV), {"use_kv_cache": True, "true_cfg_scale": 1.0}, None),
    (adapter_for(KLEIN), {"true_cfg_scale": 4.0}, None),
    (OnDeviceOnly(), {"offload": "model-cpu"}, "offload 'model-cpu': OnDevicePipeline allows only none"),
    (OnDeviceOnly(), {}, None),
    # The base's defaults: neither a cache nor a condition size.
    (DiffusersAdapter(), {"use_kv_cache": True},
     "use_kv_cache = true: SomePipeline has no conditioning KV cache"),
    (DiffusersAdapter(), {"output_resolution": 1024},
     "output_resolution: SomePipeline sizes condition images itself, it takes no output_resolution"),
])
def test_a_refusal_falls_out_of_the_capabilities(adapter, settings, expected):
    pipeline = adapter.pipelines[0] if adapter.pipelines else "SomePipeline"
    assert adapter.refusal(full(pipeline, **settings)) == expected


@pytest.mark.parametrize(("profile", "cuda", "expected"), [
    (full(KLEIN, use_kv_cache=True), False, KLEIN_NO_CACHE),
    (full(QWEN, use_kv_cache=True, output_resolution=512), False, None),
    # The engine's own checks come first, in its words.
    (full(KLEIN, use_kv_cache=True, offload="disk"), True,
     "offload 'disk': expected one of none, model-cpu, group-leaf, group-block"),
    (full(QWEN, use_kv_cache=True, kv_placement="host-pinned"), False,
     "kv_placement 'host-pinned' needs a CUDA device to pin memory; this machine has none"),
    (full(QWEN, use_kv_cache=True, kv_placement="host-pinned-packed"), False,
     "kv_placement 'host-pinned-packed' needs a CUDA device to pin memory; this machine has "
     "none"),
    (full(QWEN, use_kv_cache=True, kv_placement="host-pinned-packed"), True, None),
    (full(QWEN, use_kv_cache=True, kv_placement="host-pageable"), False, None),
    (full(KLEIN, use_kv_cache=True, offload="model-cpu"), False,
     "offload 'model-cpu' needs a CUDA device; this machine has none"),
])
def test_the_engine_refuses_in_its_words_then_the_adapters(profile, cuda, expected):
    assert profile_refusal(profile, cuda) == expected


@pytest.mark.parametrize(("pipeline", "profile", "expected"), [
    (QWEN, {"use_kv_cache": True}, {"true_cfg_scale": 4.0, "use_kv_cache": True,
                                    "output_resolution": 512}),
    (QWEN, {"use_kv_cache": False}, {"true_cfg_scale": 4.0, "use_kv_cache": False,
                                     "output_resolution": 512}),
    # klein sizes its condition images itself, and stacks a quarter, half and three quarters of
    # its text encoder's layers.
    (KLEIN, {}, {"guidance_scale": 4.0, "text_encoder_out_layers": (2, 4, 6)}),
    # the KV release takes no guidance (a true_cfg_scale but 1.0 is refused before any run)
    (KLEIN_KV, {"use_kv_cache": True}, {"text_encoder_out_layers": (2, 4, 6)}),
])
def test_each_family_adds_its_call_arguments(pipeline, profile, expected):
    pipe = SimpleNamespace(text_encoder=SimpleNamespace(config=SimpleNamespace(num_hidden_layers=8)))
    assert adapter_for(pipeline).call_arguments(
        pipe, full(pipeline, **profile), {"true_cfg_scale": 4.0},
        {"output_resolution": 512}) == expected


@pytest.mark.parametrize(("adapter", "words"), [
    (DiffusersAdapter(), "component 'processor' (SomeProcessor): DiffusersAdapter makes no "
                         "component without weights"),
    (adapter_for(KLEIN), "component 'processor' (SomeProcessor): Flux2KleinPipeline's adapter "
                         "makes only its tokenizer"),
    (adapter_for(QWEN), "component 'tokenizer' (SomeProcessor): QwenImage21Pipeline's adapter "
                        "makes only its processor"),
    (adapter_for(KLEIN_KV), "component 'processor' (SomeProcessor): Flux2KleinKVPipeline's "
                            "adapter makes only its tokenizer"),
])
def test_a_component_the_adapter_does_not_make_is_refused_naming_it(adapter, words):
    name = "tokenizer" if isinstance(adapter, QwenImage21Adapter) else "processor"
    with pytest.raises(ValueError) as caught:
        adapter.unweighted(name, "SomeProcessor", {})
    assert str(caught.value) == words


@pytest.mark.parametrize("adapter", [DiffusersAdapter(), adapter_for(KLEIN)])
def test_by_default_a_request_records_nothing_and_a_failure_leaves_nothing_to_undo(adapter):
    pipe = Untouchable()
    recorder = adapter.recorder(pipe)
    assert recorder.take() == {} and recorder.take() == {}
    assert adapter.recover(pipe) is None  # and pipe untouched


def test_the_engine_recovers_generally_then_as_the_adapter_does():
    steps = []

    class Pipe:
        def maybe_free_model_hooks(self):
            steps.append("hooks freed")

    class Undoing(DiffusersAdapter):
        def recover(self, pipe):
            steps.append(("adapter", pipe))

    engine = object.__new__(DiffusersEngine)  # no torch: a CPU engine's recovery needs none
    pipe = Pipe()
    engine.profile, engine.pipe, engine.device, engine.adapter, engine.resident_mib = (
        {"offload": "model-cpu"}, pipe, "cpu", Undoing(), None)
    engine.torch = None
    assert engine.recover() is None  # the CPU has no device memory to hold against the build's
    # The family's own state first, so the engine's steps release what it let go.
    assert steps == [("adapter", pipe), "hooks freed"]


def test_qwen_image_clears_its_vaes_feature_cache_after_a_failure():
    cleared = []
    pipe = SimpleNamespace(vae=SimpleNamespace(clear_cache=lambda: cleared.append(True)))
    adapter_for(QWEN).recover(pipe)
    assert cleared == [True]
    adapter_for(QWEN).recover(SimpleNamespace(vae=object()))  # a VAE without the cache: nothing


@pytest.mark.parametrize(("held", "dirty"), [
    ((1000.0, 1100.0), None),
    ((1128.0, 1200.0), None),  # at the tolerance: clean
    ((1129.0, 1200.0), "torch holds 1,129 MiB allocated, 129 MiB over the 1,000 MiB the build "
                       "left (tolerance 128 MiB)"),
    ((3549.0, 4000.0), "torch holds 3,549 MiB allocated, 2,549 MiB over the 1,000 MiB"),
])
def test_the_engine_is_clean_only_within_the_tolerance_of_what_the_build_left(
        monkeypatch, held, dirty):
    from omniprobe_engine import diffusers_engine

    monkeypatch.setattr(diffusers_engine, "held_mib", lambda torch, device: held)
    engine = object.__new__(DiffusersEngine)
    engine.torch, engine.device, engine.resident_mib = None, "cuda", 1000.0
    found = engine.dirty()
    assert found is None if dirty is None else found.startswith(dirty)


class Served(DiffusersAdapter):
    pipelines = ("APipeline", "BPipeline")


class AlsoServed(DiffusersAdapter):
    pipelines = ("CPipeline", "BPipeline")


def test_the_registry_maps_each_pipeline_to_one_instance_of_its_adapter():
    found = registry([Served, OnDeviceOnly])
    assert sorted(found) == ["APipeline", "BPipeline", "OnDevicePipeline"]
    assert found["APipeline"] is found["BPipeline"] and isinstance(found["APipeline"], Served)


def test_two_adapters_claiming_one_pipeline_is_an_import_error_naming_both():
    with pytest.raises(ImportError) as caught:
        registry([Served, AlsoServed])
    assert str(caught.value) == ("pipeline 'BPipeline' is served by two adapters: "
                                 f"{__name__}.Served and {__name__}.AlsoServed")
