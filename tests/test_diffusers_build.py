"""The random build's host footprint is the load path's (issue 32), shown on the tiny model on the
CPU: components built one at a time in from_pretrained's order, each placed before the next; a
quantised component quantised unit by unit as it is filled; never more than the finished placement
plus one unit in the build dtype; and the host figures the engine records.

These need torch, diffusers and torchao (`nox -s tests-diffusers`); the plain suite skips them
where they are absent.
"""

from __future__ import annotations

import pytest

from omniprobe.config.diffusers import load_model_configs

from .conftest import REPO

torch = pytest.importorskip("torch", reason="needs torch: run `nox -s tests-diffusers`")
pytest.importorskip("diffusers", reason="needs diffusers: run `nox -s tests-diffusers`")
pytest.importorskip("torchao", reason="needs torchao: run `nox -s tests-diffusers`")

from omniprobe_engine import diffusers_build  # noqa: E402  (after the skips: it needs torch)

TINY = load_model_configs(REPO, "models/qwen-image-2.1/tiny").engine_components()
# The components with weights, in the order from_pretrained loads them: model_index.json's keys,
# which save_pretrained writes sorted (the processor has none; the adapter makes it).
LOAD_ORDER = ("text_encoder", "transformer", "vae")


def weight_bytes(module, *, recurse: bool = True) -> int:
    """Bytes of a module's parameters that exist (not on the meta device), each counted once."""
    seen = {id(p): p for p in module.parameters(recurse=recurse) if p.device.type != "meta"}
    return sum(diffusers_build.tensor_bytes(p) for p in seen.values())


def is_quantised(param) -> bool:
    return hasattr(param, "__tensor_flatten__")


class LiveBytes(diffusers_build.BuildObserver):
    """At each unit filled: the weight bytes the whole build holds, the unit's own in the build
    dtype, and whether every linear layer filled before it in a quantised component is already
    quantised; and the order of fills and placements."""

    def __init__(self, quantised: set[str]):
        self.quantised, self.done, self.events, self.steps = quantised, [], [], []
        self.linears: list = []
        self.pools: dict[str, int] = {}

    def pooled(self, component, pool):
        self.pools[component] = diffusers_build.tensor_bytes(pool)

    def filled(self, component, module, name, unit):
        live = sum(weight_bytes(m) for m in self.done) + weight_bytes(module)
        self.steps.append((component, name, live, weight_bytes(unit, recurse=False)))
        self.events.append(("filled", component))
        self.unquantised_before = [n for n, u in self.linears if not is_quantised(u.weight)]
        assert self.unquantised_before == [], (component, name, self.unquantised_before)
        if component in self.quantised and isinstance(unit, torch.nn.Linear):
            self.linears.append((f"{component}.{name}", unit))

    def placed(self, component, module):
        self.done.append(module)
        self.events.append(("placed", component))


def build(quantised: set[str]):
    observer, placed = LiveBytes(quantised), []
    parts = diffusers_build.build_streamed(
        TINY, torch.bfloat16, 0, init_device="cpu", quantised=quantised, keep_on="cpu",
        place=lambda name, module: placed.append(name), observer=observer)
    return parts, observer, placed


def test_the_components_are_built_in_from_pretrained_order_each_placed_before_the_next():
    parts, observer, placed = build(set())
    assert placed == list(LOAD_ORDER) == list(parts)
    collapsed = [e for i, e in enumerate(observer.events) if i == 0 or observer.events[i - 1] != e]
    assert collapsed == [event for name in LOAD_ORDER
                         for event in (("filled", name), ("placed", name))]
    assert all(p.device.type == "cpu" for m in parts.values() for p in m.parameters())


@pytest.mark.parametrize("quantised", [set(), {"transformer"}, {"transformer", "text_encoder"}],
                         ids=["bf16", "int8-dit", "int8-dit-and-text-encoder"])
def test_no_point_of_the_build_holds_more_than_the_finished_placement_plus_one_unit(quantised):
    parts, observer, _ = build(quantised)
    # Each unit's bytes once finished (quantised where the profile says), in the order filled.
    final = {(c, n): weight_bytes(parts[c].get_submodule(n), recurse=False)
             for c, n, *_ in observer.steps}
    placed_before = 0
    for component, name, live, unit_build_bytes in observer.steps:
        assert live <= placed_before + unit_build_bytes, (component, name)
        placed_before += final[component, name]
    # Beside it, each component's pool of random values, at most 64 Mi values (128 MiB in bf16).
    assert set(observer.pools) == set(LOAD_ORDER)
    assert max(observer.pools.values()) <= diffusers_build.POOL_ELEMENTS * 2
    for component in quantised:
        linears = [m for m in parts[component].modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(is_quantised(m.weight) for m in linears)
        # The bound can fail: a build that filled the whole component in bf16 before quantising
        # it (as the random build did before) held more at its last unit than the bound allows.
        mine = [(n, b) for c, n, _, b in observer.steps if c == component]
        held_whole = sum(b for _, b in mine)
        bound_last = sum(final[component, n] for n, _ in mine[:-1]) + mine[-1][1]
        assert held_whole > bound_last, component

def test_a_quantised_linear_holds_its_int8_bytes():
    linear = torch.nn.Linear(256, 128, bias=False).to(torch.bfloat16)
    bf16 = diffusers_build.tensor_bytes(linear.weight)
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(linear, Int8WeightOnlyConfig())
    int8 = diffusers_build.tensor_bytes(linear.weight)
    assert bf16 == 256 * 128 * 2
    assert 256 * 128 <= int8 < bf16  # the int8 values and their per-row scales


def one_reference_request(tmp_path, *, height: int = 96, width: int = 64,
                          steps: int = 1) -> dict:
    """A request of the tiny model with one condition image (a flat colour, written beside it)."""
    from PIL import Image

    reference = tmp_path / "ref.png"
    Image.new("RGB", (64, 96), (120, 30, 200)).save(reference)
    return {"prompt": "a red shop", "reference_paths": [str(reference)], "height": height,
            "width": width, "num_inference_steps": steps, "true_cfg_scale": 1.0, "seed": 1,
            "output": str(tmp_path / "out.png")}


def test_the_engine_records_the_build_path_and_its_three_host_figures(tmp_path):

    from omniprobe_engine.diffusers_engine import DiffusersEngine

    engine = DiffusersEngine("random", {
        "profile": {"pipeline": "QwenImage21Pipeline", "offload": "none", "use_kv_cache": True,
                    "quantize_dit": "int8-weight-only",
                    "quantize_text_encoder": "int8-weight-only", "output_resolution": 64},
        "weights": {"kind": "random", "seed": 0, "components": TINY}})
    facts = engine.facts()
    assert facts["build_path"] == "random-streamed"
    assert facts["build_host_peak_mib"] >= facts["steady_host_mib"] > 0
    # No CUDA: nothing can be pinned, and torch reports nothing to split pinned from pageable.
    assert facts["pinned_host_mib"] is None and facts["pageable_host_mib"] is None
    pipe = engine.pipe
    held = sum(weight_bytes(getattr(pipe, n)) for n in LOAD_ORDER)
    assert facts["host_weights_mib"] == round(held / 2**20, 1)
    for component in ("transformer", "text_encoder"):
        linears = [m for m in getattr(pipe, component).modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(is_quantised(m.weight) for m in linears), component
    assert not any(is_quantised(p) for p in pipe.vae.parameters())
    measured = engine.generate(one_reference_request(tmp_path))
    # Sampled beside the request: at least what it ended on, and about the lifetime peak at most
    # (the kernel's high-water mark trails the latest reading by a few pages).
    assert measured["host_peak_mib"] >= measured["host_end_mib"] > 0
    assert measured["host_peak_mib"] <= measured["max_rss_mib"] + 1
    assert measured["pinned_host_peak_mib"] is None


def test_a_unit_moves_alone_and_a_quantised_weight_keeps_its_int8_type():
    """What placement does to one unit on a GPU host (moved here to the meta device, as the CPU
    has no other): its own tensors move, quantised ones as their subclass; its children stay."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    parent = torch.nn.Sequential(torch.nn.Linear(64, 32).to(torch.bfloat16))
    quantize_(parent, Int8WeightOnlyConfig())
    unit = parent[0]
    unit.register_buffer("scale_hint", torch.ones(3))
    kind = type(unit.weight)
    diffusers_build._move_own(unit, "meta")
    assert type(unit.weight) is kind and is_quantised(unit.weight)
    assert {t.device.type for t in (unit.weight, unit.bias, unit.scale_hint)} == {"meta"}
    holder = torch.nn.Linear(4, 4)
    holder.child = torch.nn.Linear(4, 4)
    diffusers_build._move_own(holder, "meta")
    assert holder.weight.device.type == "meta" and holder.child.weight.device.type == "cpu"


@pytest.mark.parametrize(("profile", "expected"), [
    ({"offload": "group-leaf", "use_stream": True},
     {"offload_type": "leaf_level", "use_stream": True, "record_stream": False,
      "low_cpu_mem_usage": False}),
    ({"offload": "group-leaf", "use_stream": False},
     {"offload_type": "leaf_level", "use_stream": False, "record_stream": False,
      "low_cpu_mem_usage": False}),
    ({"offload": "group-leaf", "use_stream": True, "low_cpu_mem_usage": True,
      "record_stream": True},
     {"offload_type": "leaf_level", "use_stream": True, "record_stream": True,
      "low_cpu_mem_usage": True}),
    ({"offload": "group-block", "use_stream": True},
     {"offload_type": "block_level", "use_stream": True, "record_stream": False,
      "low_cpu_mem_usage": False, "num_blocks_per_group": 1}),
    ({"offload": "model-cpu"}, None),
    ({"offload": "none"}, None),
])
def test_group_offload_is_applied_per_component_with_the_profiles_stream_settings(
        monkeypatch, profile, expected):
    """The engine's placement of one component (the GPU's part, with apply_group_offloading
    recorded instead of run: the CPU has no device to onload to)."""
    import diffusers.hooks

    from omniprobe_engine.diffusers_engine import DiffusersEngine

    calls = []
    monkeypatch.setattr(diffusers.hooks, "apply_group_offloading",
                        lambda module, **kwargs: calls.append((module, kwargs)))
    engine = object.__new__(DiffusersEngine)
    engine.torch, engine.profile = torch, profile
    module = torch.nn.Linear(2, 2)
    engine._place_component("transformer", module)
    if expected is None:
        assert calls == []  # placed by the pipeline as a whole, or kept where it was built
        return
    [(placed, kwargs)] = calls
    assert placed is module
    assert (kwargs.pop("onload_device").type, kwargs.pop("offload_device").type) == ("cuda", "cpu")
    assert kwargs == expected


def test_the_host_sampler_keeps_the_highest_reading_and_ends_on_the_last(monkeypatch):
    import threading

    readings = iter([100.0, 180.0, 150.0, 120.0])
    more = threading.Event()
    last = [None]

    def rss():
        try:
            last[0] = next(readings)
        except StopIteration:
            more.set()  # every reading taken: the request may end
        return last[0]

    monkeypatch.setattr(diffusers_build, "rss_mib", rss)
    with diffusers_build.HostSampler(period_s=0.001) as sampler:
        assert more.wait(5)
    assert (sampler.peak_mib, sampler.end_mib) == (180.0, 120.0)


def test_the_vae_decodes_in_tiles_and_the_cache_is_freed_before_the_decode_when_asked(tmp_path):
    """Issue 49's first knobs on the tiny model: vae_tiling takes the tiled decode at 1248×832,
    and release_kv_before_decode frees the conditioning cache after the last step, its bytes
    counted first; the settings are what the profile says."""
    from PIL import Image

    from omniprobe_engine.diffusers_engine import DiffusersEngine

    engine = DiffusersEngine("random", {
        "profile": {"pipeline": "QwenImage21Pipeline", "offload": "none", "use_kv_cache": True,
                    "vae_tiling": True, "release_kv_before_decode": True,
                    "output_resolution": 64},
        "weights": {"kind": "random", "seed": 0, "components": TINY}})
    vae = engine.pipe.vae
    assert vae.use_tiling
    tiled, released = [], []
    decode, release = vae.tiled_decode, engine.kv.release
    caches = engine.kv.made

    def spied_decode(*args, **kwargs):
        tiled.append(True)
        # The cache is empty by the decode: every layer's K and V freed.
        released.append(all(layer.k is None and layer.v is None
                            for cache in made_before for layer in cache.layer_caches))
        return decode(*args, **kwargs)

    made_before: list = []

    def spied_release():
        made_before.extend(caches)
        release()

    vae.tiled_decode, engine.kv.release = spied_decode, spied_release
    measured = engine.generate(one_reference_request(tmp_path, height=832, width=1248, steps=2))
    assert tiled and made_before and released == [True] * len(released)
    assert measured["kv_cache_bytes"] > 0 and measured["kv_cache_layers"] > 0
    with Image.open(tmp_path / "out.png") as out:
        assert out.size == (1248, 832)


def test_tiling_a_vae_that_cannot_tile_is_refused_before_any_build():
    from omniprobe_engine.diffusers_engine import profile_refusal

    profile = {"pipeline": "QwenImage21Pipeline", "offload": "none", "use_kv_cache": True,
               "vae_tiling": True}
    assert profile_refusal(profile, False, TINY) is None  # AutoencoderKLQwenImage21 tiles
    cannot = {**TINY, "vae": {**TINY["vae"], "class": "transformers.CLIPTextModel"}}
    assert profile_refusal(profile, False, cannot) == (
        "vae_tiling = true: the VAE class transformers.CLIPTextModel has no enable_tiling")
    missing = {**TINY, "vae": {**TINY["vae"], "class": "diffusers.NoSuchVae"}}
    assert profile_refusal(profile, False, missing) == (
        "vae_tiling = true: class 'diffusers.NoSuchVae': the installed diffusers has no NoSuchVae")


def test_a_layer_cache_in_host_memory_stores_host_tensors_and_hands_compute_device_ones():
    """kv_host.host_placed with the compute device as a parameter (meta here, the GPU on a card):
    store leaves host tensors, get returns the compute device's, and the recorder counts them as
    held in host memory."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVLayerCache

    from omniprobe_engine.kv_host import host_placed

    layer = host_placed(QwenImage21KVLayerCache, pinned=False, compute_device="meta")()
    k, v = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4)
    layer.store(k, v)
    assert layer.k.device.type == layer.v.device.type == "cpu"
    assert layer.k.data_ptr() != k.data_ptr()  # a copy: the step's own tensor can go
    got_k, got_v = layer.get()
    assert got_k.device.type == got_v.device.type == "meta" and got_k.shape == k.shape
    with pytest.raises(RuntimeError, match="not been populated"):
        host_placed(QwenImage21KVLayerCache, pinned=False)().get()


def test_packed_layers_carve_their_k_and_v_out_of_shared_slabs():
    """pinned_slabs.Slabs: every layer's K and V in one slab where the rule says one holds them, each
    at an aligned offset, the values those stored; a tensor past the expected count gets its own
    slab. Pageable here (pinning needs CUDA); the GPU test pins them."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVLayerCache

    from omniprobe_engine.kv_host import host_placed
    from omniprobe_engine.pinned_slabs import ALIGN_BYTES, Slabs, aligned, packed_bytes

    layers, shape = 4, (1, 7, 2, 4)  # 112 bytes a bfloat16 tensor, 512 aligned
    slabs = Slabs(pinned=False, expected_tensors=2 * layers)
    cls = host_placed(QwenImage21KVLayerCache, pinned=False, compute_device="meta")
    caches = [cls(slabs) for _ in range(layers)]
    stored = [(torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16))
              for _ in caches]
    for cache, (k, v) in zip(caches, stored, strict=True):
        cache.store(k, v)
    assert aligned(7 * 2 * 4 * 2) == ALIGN_BYTES
    assert slabs.nbytes == packed_bytes(112, 2 * layers) == 4096  # 8 x 512 in one 4 KiB slab
    assert len(slabs.slabs) == 1
    base = slabs.slabs[0].data_ptr()
    for cache, (k, v) in zip(caches, stored, strict=True):
        for host, original in ((cache.k, k), (cache.v, v)):
            assert host.device.type == "cpu" and host.shape == original.shape
            assert host.dtype == original.dtype and torch.equal(host, original)
            assert host.untyped_storage().data_ptr() == base  # carved, not a block of its own
            assert (host.data_ptr() - base) % ALIGN_BYTES == 0
        assert cache.get()[0].device.type == "meta"
    caches[0].store(*stored[0])  # past the expected eight: K and V, a slab each
    assert len(slabs.slabs) == 3 and slabs.nbytes == 4096 + 2 * 512


@pytest.mark.parametrize("sizes, cap, slabs", [
    # twenty tensors of 1,000 bytes (1 KiB carved) under a 4 KiB cap: five 4 KiB slabs
    ([1000] * 20, 4096, [4096] * 5),
    # the same uncapped: the rule's 16 KiB they fill, then the 4 KiB left
    ([1000] * 20, None, [16384, 4096]),
    # a tensor over the cap takes its own block's size, and a later small one its hole
    ([10_000, 1000], 4096, [16384]),
])
def test_a_capped_slab_is_never_larger_but_for_a_tensor_larger_itself(sizes, cap, slabs):
    """pinned_weights' slabs are capped (MAX_SLAB_BYTES): group offload frees a group's pageable
    weights only once its copies are made, so an uncapped slab would be page-locked long before
    the weights it holds are freed."""
    from omniprobe_engine.pinned_slabs import Slabs, aligned

    carved = Slabs(pinned=False, expected_bytes=sum(aligned(n) for n in sizes),
                   max_slab_bytes=cap)
    for n in sizes:
        carved.empty_like(torch.empty(n, dtype=torch.uint8))
    assert [s.numel() for s in carved.slabs] == slabs


def test_the_tiny_model_runs_with_its_cache_in_host_memory_and_records_it_so(tmp_path,
                                                                            monkeypatch):
    """Each host placement draws the image the cache on the device draws, pixel for pixel: the
    same K and V, kept elsewhere. Packing pins on a GPU only; here its slabs are pageable."""
    from PIL import Image

    from omniprobe_engine import kv_host
    from omniprobe_engine.diffusers_engine import DiffusersEngine

    monkeypatch.setitem(kv_host.HOST_PLACEMENTS, "host-pinned-packed",
                        kv_host.HostMemory(pinned=False, packed=True))
    carved = []
    empty_like = kv_host.Slabs.empty_like
    monkeypatch.setattr(kv_host.Slabs, "empty_like",
                        lambda self, t: carved.append(t.shape) or empty_like(self, t))

    def engine(placement):
        return DiffusersEngine("random", {
            "profile": {"pipeline": "QwenImage21Pipeline", "offload": "none",
                        "use_kv_cache": True, "kv_placement": placement,
                        "output_resolution": 64},
            "weights": {"kind": "random", "seed": 0, "components": TINY}})

    request = one_reference_request(tmp_path, steps=2)
    host = engine("host-pageable").generate(request)
    assert host["kv_cache_host_bytes"] == host["kv_cache_bytes"] > 0
    packed = engine("host-pinned-packed").generate({**request,
                                                   "output": str(tmp_path / "packed.png")})
    assert packed["kv_cache_host_bytes"] == packed["kv_cache_bytes"] == host["kv_cache_bytes"]
    assert len(carved) == 2 * packed["kv_cache_layers"]  # every layer's K and V, and only packed
    on_device = engine("gpu").generate({**request, "output": str(tmp_path / "gpu.png")})
    assert on_device["kv_cache_host_bytes"] == 0
    assert on_device["kv_cache_bytes"] == host["kv_cache_bytes"]  # the same cache, elsewhere
    drawn = {name: Image.open(tmp_path / name).tobytes()
             for name in ("out.png", "packed.png", "gpu.png")}
    assert drawn["out.png"] == drawn["packed.png"] == drawn["gpu.png"]


def test_packed_pinning_carves_group_offloads_copies_out_of_slabs():
    """pinned_weights.packed_pinning around diffusers' own ModuleGroup: every page-locked copy it
    keeps (a stream, low_cpu_mem_usage off) is a carve of the slabs, at an aligned offset, with
    the weight's values; a torchao int8 weight's inner tensors are carved each; the slabs hold
    the module's carved bytes exactly here (five 512-byte carves: 2 KiB + 512); the class's own
    _to_cpu is back after. Pageable here (pinning needs CUDA); the GPU test pins them."""
    from diffusers.hooks.group_offloading import ModuleGroup
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from omniprobe_engine.pinned_slabs import ALIGN_BYTES
    from omniprobe_engine.pinned_weights import carved_bytes, packed_pinning, plain_tensors

    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                 torch.nn.Linear(16, 4, bias=False)).to(torch.bfloat16)
    original = ModuleGroup.__dict__["_to_cpu"]
    with packed_pinning(module, pinned=False) as slabs:
        group = ModuleGroup(modules=list(module), offload_device=torch.device("cpu"),
                            onload_device=torch.device("cpu"), offload_leader=module[0],
                            stream=object())  # any stream: the copies are made at init
    assert ModuleGroup.__dict__["_to_cpu"] is original
    assert slabs.nbytes == slabs.stored_bytes == carved_bytes(module) == 5 * ALIGN_BYTES
    assert [s.numel() for s in slabs.slabs] == [2048, 512]
    bases = {s.untyped_storage().data_ptr() for s in slabs.slabs}
    assert len(group.cpu_param_dict) == 5
    for param, copy in group.cpu_param_dict.items():
        assert torch.equal(copy, param.data) and copy.data_ptr() != param.data_ptr()
        assert copy.untyped_storage().data_ptr() in bases
        assert (copy.data_ptr() - copy.untyped_storage().data_ptr()) % ALIGN_BYTES == 0

    quantised = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    quantize_(quantised, Int8WeightOnlyConfig())
    weight = quantised[0].weight
    with packed_pinning(quantised, pinned=False) as slabs:
        group = ModuleGroup(modules=list(quantised), offload_device=torch.device("cpu"),
                            onload_device=torch.device("cpu"), offload_leader=quantised[0],
                            stream=object())
    [copy] = group.cpu_param_dict.values()
    assert type(copy) is type(weight) and torch.equal(copy.dequantize(), weight.dequantize())
    inner = plain_tensors(copy)
    assert len(inner) == len(plain_tensors(weight)) > 1  # its qdata, scale, ...
    assert {t.untyped_storage().data_ptr() for t in inner} <= {
        s.untyped_storage().data_ptr() for s in slabs.slabs}
    assert slabs.stored_bytes == carved_bytes(quantised)


KLEIN_KV_TINY = load_model_configs(REPO, "models/flux2-klein-kv/tiny").engine_components()


def test_klein_kv_keeps_its_reference_cache_where_placed_and_records_it(tmp_path, monkeypatch):
    """Flux2KleinKVPipeline at a tiny size (its adapter, flux2klein.py): the reference tokens'
    K and V, kept from step 0, give the same latents on the device, in pageable host memory and
    packed (its slabs pageable here: pinning needs CUDA), and latents that differ with the
    references, so the sameness says something. Each cache is counted as the pipeline clears
    it before its decode: reference tokens only, every layer, twice the bytes for twice the
    references, in host memory where placed there."""
    from PIL import Image

    from omniprobe_engine import kv_host
    from omniprobe_engine.diffusers_engine import DiffusersEngine

    monkeypatch.setitem(kv_host.HOST_PLACEMENTS, "host-pinned-packed",
                        kv_host.HostMemory(pinned=False, packed=True))
    reference = tmp_path / "ref.png"
    Image.new("RGB", (64, 96), (120, 30, 200)).save(reference)

    def latents_and_cache(placement: str, references: int):
        engine = DiffusersEngine("random", {
            "profile": {"pipeline": "Flux2KleinKVPipeline", "offload": "none", "dtype": "float32",
                        "use_kv_cache": True, "kv_placement": placement},
            "weights": {"kind": "random", "seed": 0, "components": KLEIN_KV_TINY}})
        out = engine.pipe(prompt="a red shop", image=[Image.open(reference)] * references or None,
                          height=96, width=64, num_inference_steps=2, output_type="latent",
                          generator=torch.Generator("cpu").manual_seed(1),
                          **engine.adapter.call_arguments(engine.pipe, engine.profile, {}, {}))
        return out.images, engine.kv.take()

    one, cache = latents_and_cache("gpu", 1)
    layers = cache["kv_cache_layers_total"]
    assert cache["kv_cache_layers"] == layers > 0 and cache["kv_cache_host_bytes"] == 0
    assert cache["prompt_text_tokens"] == 0 and cache["prefix_tokens"] > 0
    for placement in ("host-pageable", "host-pinned-packed"):
        latents, placed = latents_and_cache(placement, 1)
        assert torch.equal(latents, one)
        assert placed["kv_cache_host_bytes"] == placed["kv_cache_bytes"] == cache["kv_cache_bytes"]
    two, doubled = latents_and_cache("gpu", 2)
    assert not torch.equal(two, one)
    assert doubled["kv_cache_bytes"] == 2 * cache["kv_cache_bytes"]
    assert doubled["prefix_tokens"] == 2 * cache["prefix_tokens"]
    _, none = latents_and_cache("gpu", 0)
    assert none == {}  # no reference image: the pipeline makes no cache
