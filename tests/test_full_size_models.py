"""Every committed model folder held to the libraries (issue 50 item 2, issue 53 item 3): each
class is one of the library's model, tokenizer or processor classes, each adapter's components are
its pipeline's own, and each full-size component, built on the meta device as the engine builds it
(nothing is allocated), meets its published parameter count within the figure's rounding.

These need torch, transformers and diffusers: `nox -s tests-diffusers` installs them (pinned to
what the GPU machine has) and runs this file; the plain suite skips it where they are absent.
"""

from __future__ import annotations

import re

import pytest

from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.model_manifest import MANIFEST_FILE
from omniprobe_engine.adapters import adapter_for, known_pipelines

from .conftest import REPO

torch = pytest.importorskip("torch", reason="needs torch: run `nox -s tests-diffusers`")
diffusers = pytest.importorskip("diffusers", reason="needs diffusers: run `nox -s tests-diffusers`")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers: run `nox -s tests-diffusers`")

from omniprobe_engine.diffusers_build import (  # noqa: E402  (needs torch, skipped above)
    empty_components,
    parameter_counts,
    resolve_class,
)

FOLDERS = sorted(str(p.parent.relative_to(REPO)) for p in REPO.glob(f"models/*/*/{MANIFEST_FILE}"))
FULL = [f for f in FOLDERS if not f.endswith("/tiny")]
KLEIN_4B, KLEIN_9B = "models/flux2-klein/4b", "models/flux2-klein/9b"


def _kind(cls) -> str | None:
    """What a component class is, by the library's own base classes."""
    if issubclass(cls, (diffusers.ModelMixin, transformers.PreTrainedModel)):
        return "model"
    if issubclass(cls, transformers.PreTrainedTokenizerBase):
        return "tokenizer"
    if issubclass(cls, transformers.ProcessorMixin):
        return "processor"
    return None


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_component_class_is_a_model_tokenizer_or_processor_of_its_library(folder):
    configs = load_model_configs(REPO, folder)
    kinds = {name: _kind(resolve_class(c.class_)) for name, c in configs.components.items()}
    assert None not in kinds.values(), kinds
    assert getattr(diffusers, configs.manifest.pipeline).__name__ == configs.manifest.pipeline


@pytest.mark.parametrize("pipeline", known_pipelines())
def test_each_adapters_components_are_its_pipelines_own(pipeline):
    cls = getattr(diffusers, pipeline)
    modules, _ = cls._get_signature_keys(cls)
    assert set(adapter_for(pipeline).components) == set(modules) - {"scheduler"}


@pytest.mark.parametrize(("class_name", "words"), [
    ("diffusers.models", "is no class (a module or a function)"),
    ("diffusers.is_torch_available", "is no class (a module or a function)"),
    ("diffusers.Flux2KleinPipeline", "a pipeline class, not a component's"),
    ("diffusers.NoSuchModel", "the installed diffusers has no NoSuchModel"),
])
def test_the_engine_refuses_what_is_no_component_class_in_words(class_name, words):
    """What the names let through (a config edited after the harness read it) the engine
    refuses with a sentence, not a traceback from deep in the build."""
    with pytest.raises(ValueError, match=re.escape(words)):
        resolve_class(class_name)


def test_tied_embeddings_are_counted_once_as_from_pretrained_ties_them():
    """transformers 5.17 makes Qwen3ForCausalLM on the meta device with lm_head a second copy of
    its embedding; the build ties them, as loading a checkpoint does, so a tied model is not
    built (and filled) with a vocabulary-sized matrix it does not have."""
    [text_encoder] = empty_components({"text_encoder": load_model_configs(
        REPO, "models/flux2-klein/tiny").engine_components()["text_encoder"]}).values()
    assert text_encoder.lm_head.weight is text_encoder.model.embed_tokens.weight


@pytest.mark.parametrize("folder", FULL)
def test_each_full_size_component_meets_its_published_parameter_count(folder):
    configs = load_model_configs(REPO, folder)
    counts = parameter_counts(configs.engine_components())
    checked = {name: c.expected_parameters_b for name, c in configs.components.items()
               if c.expected_parameters_b is not None}
    assert checked, f"{folder}: no published count to hold it to"
    for name, expected in checked.items():
        built = counts[name] / 1e9
        assert abs(built - expected.value) <= expected.tolerance * expected.value, (
            f"{folder}/{name}.json: built {built:.3f} B, published {expected.value} B "
            f"within {expected.tolerance:.2%}")


def test_klein_4b_is_built_at_the_figures_its_sources_cross_check():
    """The converter's transformer, Qwen3-4B and the VAE defaults, counted: the transformer
    3.88 B ("4B"), Qwen3-4B 4.02 B with 3.63 B outside its embedding (its card: 4.0 B and 3.6 B),
    and the widths that tie them: the joint attention takes three stacked encoder states, the
    transformer's input the VAE's latents in 2x2 patches."""
    configs = load_model_configs(REPO, KLEIN_4B)
    counts = parameter_counts(configs.engine_components())
    assert {k: round(v / 1e9, 3) for k, v in counts.items()} == {
        "text_encoder": 4.022, "transformer": 3.876, "vae": 0.084}
    text = configs.components["text_encoder"].config
    embedding = text["vocab_size"] * text["hidden_size"]
    assert round((counts["text_encoder"] - embedding) / 1e9, 2) == 3.63
    transformer = configs.components["transformer"].config
    assert transformer["joint_attention_dim"] == 3 * text["hidden_size"] == 7680
    assert transformer["in_channels"] == resolve_class(
        configs.components["vae"].class_)().config.latent_channels * 4


def test_klein_9b_is_built_at_the_figures_its_sources_cross_check():
    """The converter's klein-9b transformer 9.08 B ("9B"), Qwen3-8B 8.19 B with 6.95 B outside
    its two (untied) embeddings, the card's 8.2 B and 6.95 B; the joint attention takes three
    stacked 4,096-wide encoder states. The spec page's 40 layers and 64 heads would build
    10.30 B, which the card refutes."""
    configs = load_model_configs(REPO, KLEIN_9B)
    counts = parameter_counts(configs.engine_components())
    assert {k: round(v / 1e9, 3) for k, v in counts.items()} == {
        "text_encoder": 8.191, "transformer": 9.079, "vae": 0.084}
    text = configs.components["text_encoder"].config
    embeddings = 2 * text["vocab_size"] * text["hidden_size"]
    assert round((counts["text_encoder"] - embeddings) / 1e9, 2) == 6.95
    assert configs.components["transformer"].config["joint_attention_dim"] == (
        3 * text["hidden_size"]) == 12288
    spec_page = {**text, "num_hidden_layers": 40, "num_attention_heads": 64}
    wrong = parameter_counts({"text_encoder": {
        "class": configs.components["text_encoder"].class_, "config": spec_page}}
    )["text_encoder"] / 1e9
    expected = configs.components["text_encoder"].expected_parameters_b
    assert abs(wrong - expected.value) > expected.tolerance * expected.value


@pytest.mark.parametrize(("folder", "profile"), [
    ("models/qwen-image-2.1/full", "group-leaf"), (KLEIN_4B, "klein-group-leaf")])
def test_leaf_offloads_page_locked_bytes_are_each_weight_rounded_up_to_a_power_of_two(
        repo, folder, profile):
    """What DETAILS says of the committed builds' page-locked figure: group offload with streams
    pins every bfloat16 weight as a block of its own, rounded up to a power of two, so the
    configs, counted on the meta device, give the pinned MiB the GPU machine measured (39.1 GiB
    for Qwen-Image-2.1, 21.9 for klein 4B), and their own aligned bytes the weights' MiB on the
    host: the ×1.30 and ×1.48 are torch's rounding, which packing leaves out."""
    from omniprobe.analysis.capacity_bands import newest_searches
    from omniprobe.analysis.card_answers import pinned_weights_mib
    from omniprobe.evidence.validate import load_valid_project
    from omniprobe_engine.pinned_slabs import aligned, power_of_two_ceil

    pinned, weights = pinned_weights_mib(newest_searches(load_valid_project(repo).evidence,
                                                         folder)[profile])
    built = empty_components({name: c for name, c in load_model_configs(
        REPO, folder).engine_components().items() if name not in ("tokenizer", "processor")})
    sizes = [t.numel() * 2 for module in built.values()
             for t in [*module.parameters(), *module.buffers()]]  # bfloat16
    assert sum(power_of_two_ceil(s) for s in sizes) / 2**20 == pytest.approx(pinned, rel=0.002)
    assert sum(aligned(s) for s in sizes) / 2**20 == pytest.approx(weights, rel=0.002)


def test_every_profile_planned_on_a_gpu_host_is_one_its_engine_would_build():
    """The GPU machine's preflight, asked here: each profile every GPU host plans (the card
    emulations' too), with that host's own components, passes the engine's refusals as the
    runner's `--versions` answers them on a machine with CUDA, so no device time goes to a plan
    the engine would refuse."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.project import Project
    from omniprobe.harness.offline.matrix import offline_matrix
    from omniprobe_engine.diffusers_engine import profile_refusal

    cfg = load_hosts(REPO / "hosts.toml")
    planned = 0
    for name, host in cfg.hosts.items():
        if host.diffusers is None or not host.has_gpu:
            continue
        entries, refused, _ = offline_matrix(cfg, Project(REPO), name, host, ())
        assert refused == [], name
        for entry in entries:
            profile = entry.kwargs["profile"]
            components = entry.kwargs["weights"]["components"]
            assert profile_refusal(profile, True, components) is None, (name, entry.name)
            planned += 1
    assert planned > 100  # every GPU host's profiles (134 today), not a few
