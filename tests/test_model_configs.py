"""Model folders checked for sense (issue 53, model configs; issue 50, the model a folder
describes): a folder's manifest (model.json) against its component configs and its pipeline's
components, each class by its name, a processor's settings, files that stay in the project, and a
host whose profiles name another pipeline than its folder's. Each refusal is an input error before
any attempt (exit 2), never a profile's init failure. No torch: the names decide; the Diffusers
tier holds the names to the libraries (tests/test_full_size_models.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.model_manifest import MANIFEST_FILE
from omniprobe.errors import InputError

from .conftest import REPO, in_process, make_project

KLEIN = "models/flux2-klein/tiny"
QWEN = "models/qwen-image-2.1/tiny"
KLEIN_HOST = "diffusers-klein-tiny-cpu"


@pytest.mark.parametrize("folder", sorted(
    str(p.parent.relative_to(REPO)) for p in REPO.glob(f"models/*/*/{MANIFEST_FILE}")))
def test_every_committed_model_folder_loads_and_matches_its_manifest(folder):
    configs = load_model_configs(REPO, folder)
    assert set(configs.components) == set(configs.manifest.components)
    assert all(c.library_class == tuple(configs.manifest.components[name])
               for name, c in configs.components.items())


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _class(component: str, name: str):
    """The component file's class and the manifest's, both set to `name` (library.Class): only
    the name rules can refuse it."""
    def change(folder: Path) -> None:
        _edit(folder / f"{component}.json", lambda d: d.update({"class": name}))
        _edit(folder / MANIFEST_FILE, lambda d: d["components"].update(
            {component: name.split(".", 1) if "." in name else [name, ""]}))
    return change


def _extra_component(folder: Path) -> None:
    """A processor the pipeline does not take, named in both places."""
    shutil.copy(REPO / QWEN / "processor.json", folder / "processor.json")
    _edit(folder / MANIFEST_FILE, lambda d: d["components"].update(
        {"processor": ["transformers", "Qwen3VLProcessor"]}))


def _without_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()
    _edit(folder / MANIFEST_FILE, lambda d: d["components"].pop("tokenizer"))


def _symlink_out(folder: Path) -> None:
    outside = folder.parents[3] / "elsewhere.json"  # beside the project, not in it
    shutil.copy(folder / "vae.json", outside)
    (folder / "vae.json").unlink()
    (folder / "vae.json").symlink_to(outside)


CASES = [
    # (name, folder copied, change, file the problem names, words)
    ("a module as the class", KLEIN, _class("transformer", "diffusers.models"),
     "transformer.json", "diffusers.models is no class name"),
    ("a function as the class", KLEIN, _class("vae", "diffusers.load_image"),
     "vae.json", "a module or a function of diffusers is lower case"),
    ("a pipeline class as a component", KLEIN,
     _class("transformer", "diffusers.Flux2KleinPipeline"),
     "transformer.json", "is a pipeline class, not a component's"),
    ("a library that is neither", KLEIN, _class("transformer", "torch.Linear"),
     "transformer.json", "library 'torch': expected one of diffusers, transformers"),
    ("an extra component the pipeline does not take", KLEIN, _extra_component,
     MANIFEST_FILE, "not taken ['processor']"),
    ("a component the pipeline needs, missing in both", KLEIN, _without_tokenizer,
     MANIFEST_FILE, "Flux2KleinPipeline takes text_encoder, tokenizer, transformer, vae beside "
                    "its scheduler; missing ['tokenizer']"),
    ("a component the manifest names without its config", KLEIN,
     lambda f: (f / "tokenizer.json").unlink(),
     "tokenizer.json", "missing: model.json names component 'tokenizer'"),
    ("a config the manifest does not name", KLEIN,
     lambda f: _edit(f / MANIFEST_FILE, lambda d: d["components"].pop("vae")),
     MANIFEST_FILE, "no component 'vae', though vae.json is beside it"),
    ("two classes for one component", KLEIN,
     lambda f: _edit(f / MANIFEST_FILE, lambda d: d["components"].update(
         {"transformer": ["diffusers", "QwenImage21Transformer2DModel"]})),
     MANIFEST_FILE, "but transformer.json builds diffusers.Flux2Transformer2DModel"),
    ("no manifest", KLEIN, lambda f: (f / MANIFEST_FILE).unlink(),
     MANIFEST_FILE, "missing: a model folder names its pipeline"),
    ("a pipeline no adapter serves", KLEIN,
     lambda f: _edit(f / MANIFEST_FILE, lambda d: d.update({"pipeline": "Flux2Pipeline"})),
     MANIFEST_FILE, "no Diffusers adapter serves pipeline 'Flux2Pipeline'"),
    ("a processor without its image-processor settings", QWEN,
     lambda f: _edit(f / "processor.json", lambda d: (d["config"].pop("image_processor"),
                                                      d["sources"].pop("image_processor"))),
     "processor.json", "is a processor: its config needs its image processor's settings"),
    ("a config that is a symlink out of the project", KLEIN, _symlink_out,
     "vae.json", "outside the project"),
    ("a manifest of the wrong shape", KLEIN,
     lambda f: _edit(f / MANIFEST_FILE, lambda d: d.update({"extra": 1})),
     MANIFEST_FILE, "unknown key"),
]


@pytest.mark.parametrize(("name", "source", "change", "file", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_model_folder_without_sense_is_refused_naming_the_file_and_why(
        tmp_path, name, source, change, file, words):
    root = tmp_path / "project"
    folder = root / source
    shutil.copytree(REPO / source, folder)
    change(folder)
    with pytest.raises(InputError) as caught:
        load_model_configs(root, source)
    assert any(p.file.endswith(file) and words in p.message for p in caught.value.problems), \
        caught.value.problems


@pytest.fixture
def project(tmp_path, monkeypatch):
    proj = make_project(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    monkeypatch.delenv("OMNIPROBE_ARTIFACTS", raising=False)
    return proj


def _refused_before_any_attempt(project, words: list[str]) -> None:
    code, out = in_process(project, ["probe-offline", "--host", KLEIN_HOST])
    assert code == InputError.exit_code, out
    assert all(w in out for w in words), out
    assert "Traceback" not in out
    assert not (project.evidence_dir / KLEIN_HOST).exists()  # no attempt, no init failure


def test_a_profile_naming_a_model_whose_folder_lacks_a_component_is_refused_before_any_build(
        project):
    """The klein host's folder without its tokenizer: its pipeline cannot be built, and nothing
    is attempted or recorded."""
    _without_tokenizer(project.root / KLEIN)
    _refused_before_any_attempt(project, [f"{KLEIN}/{MANIFEST_FILE}",
                                          "missing ['tokenizer']"])


def test_a_profile_whose_pipeline_is_not_its_hosts_model_folders_is_refused_naming_both(
        project):
    """FLUX.2 klein's pipeline over Qwen-Image-2.1's configs (the issue's example)."""
    hosts = project.hosts_file.read_text()
    project.hosts_file.write_text(hosts.replace(f'configs = "{KLEIN}"', f'configs = "{QWEN}"'))
    _refused_before_any_attempt(project, [
        "[diffusers_profiles.klein-tiny-cpu] key 'pipeline'", "'Flux2KleinPipeline'",
        f"[hosts.{KLEIN_HOST}.diffusers] key 'configs' = '{QWEN}'", "'QwenImage21Pipeline'"])


@pytest.mark.parametrize(("change", "words"), [
    (lambda root: None, None),
    (lambda root: (root / "hosts.toml").write_text((root / "hosts.toml").read_text().replace(
        f'configs = "{KLEIN}"', f'configs = "{QWEN}"')),
     "[diffusers_profiles.klein-tiny-cpu] key 'pipeline'"),
    (lambda root: _without_tokenizer(root / KLEIN), "missing ['tokenizer']"),
])
def test_validate_names_a_hosts_model_folder_without_sense(repo_copy, change, words):
    """`omniprobe validate` reads each random-weight host's folder as probe-offline would."""
    from omniprobe.evidence.validate import load_project

    change(repo_copy.root)
    _, problems = load_project(repo_copy)
    if words is None:
        assert problems == []
    else:
        assert any(words in p.message or words in p.path for p in problems), problems


def test_a_component_class_that_is_a_module_is_an_input_error_not_an_init_failure(project):
    _class("transformer", "diffusers.models")(project.root / KLEIN)
    _refused_before_any_attempt(project, [f"{KLEIN}/transformer.json",
                                          "diffusers.models is no class name"])


# --- FLUX.2 [klein] 4B's H200 host ------------------------------------------------------------

KLEIN_PROFILES = ["klein-group-leaf", "klein-group-leaf-nostream", "klein-model-cpu",
                  "klein-group-leaf-tiled", "klein-group-leaf-packed"]
KLEIN_KV_PROFILES = ["klein-kv-group-leaf", "klein-kv-group-leaf-kv-host-packed",
                     "klein-kv-group-leaf-kv-host-pageable", "klein-kv-group-leaf-packed"]
KLEIN_9B = {"text_encoder": (8.2, 0.0061), "transformer": (9.0, 0.0556)}


@pytest.mark.parametrize(("host", "folder", "profiles", "pipeline", "cache", "published"), [
    ("h200-klein-diffusers", "models/flux2-klein/4b", KLEIN_PROFILES, "Flux2KleinPipeline",
     False, {"text_encoder": (4.0, 0.0125), "transformer": (4.0, 0.125)}),
    ("h100-klein9b-diffusers", "models/flux2-klein/9b", KLEIN_PROFILES, "Flux2KleinPipeline",
     False, KLEIN_9B),
    ("h100-klein9b-kv-diffusers", "models/flux2-klein-kv/9b", KLEIN_KV_PROFILES,
     "Flux2KleinKVPipeline", True, KLEIN_9B),
])
def test_each_klein_host_plans_its_profiles_from_its_own_folder(host, folder, profiles, pipeline,
                                                                cache, published):
    """What `probe-capacity --host <klein host>` would run, planned on the CPU: each profile
    through its pipeline (the KV release's with its cache, which it always keeps), built from
    the host's own folder, nothing refused, each published count held to the build."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.project import Project
    from omniprobe.harness.offline.matrix import offline_matrix

    cfg = load_hosts(REPO / "hosts.toml")
    entries, refused, configs = offline_matrix(cfg, Project(REPO), host, cfg.hosts[host], ())
    assert refused == [] and configs.folder == folder
    assert [e.name for e in entries] == profiles
    assert {e.kwargs["profile"]["pipeline"] for e in entries} == {pipeline}
    assert {e.kwargs["profile"]["use_kv_cache"] for e in entries} == {cache}
    assert entries[0].expected_parameters == published
    assert set(entries[0].kwargs["weights"]["components"]) == {"text_encoder", "tokenizer",
                                                                "transformer", "vae"}


@pytest.mark.parametrize("qwen_profile", ["group-leaf-kv-host-pinned",
                                          "group-leaf-kv-host-pageable", "group-leaf-release"])
def test_the_kv_settings_klein_cannot_take_are_refused_by_name(qwen_profile):
    """Qwen's KV profiles asked of klein's pipeline: refused naming the setting, before any
    runner starts (the harness asks the engine's profile_refusal, whose last word is this)."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe_engine.adapters import adapter_for

    cfg = load_hosts(REPO / "hosts.toml")
    profile = {**cfg.diffusers_profiles[qwen_profile].model_dump(mode="json"),
               "pipeline": "Flux2KleinPipeline"}
    why = adapter_for("Flux2KleinPipeline").refusal(profile)
    asked = {"group-leaf-kv-host-pinned": "kv_placement = 'host-pinned'",
             "group-leaf-kv-host-pageable": "kv_placement = 'host-pageable'",
             "group-leaf-release": "release_kv_before_decode = true"}[qwen_profile]
    assert why == f"use_kv_cache = true, {asked}: Flux2KleinPipeline has no conditioning KV cache"
