"""The Diffusers engine's configuration: hosts.toml's [diffusers_profiles] and a host's
[hosts.<name>.diffusers] table, and the committed model folders under models/ that random weights
are built from: a manifest (model.json, model_manifest.py: the pipeline and each component's
library and class) and one config per component (each value with its source)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from omniprobe.config.inside_path import InsidePath
from omniprobe.config.model_manifest import (
    COMPONENT_NAME,
    MANIFEST_FILE,
    ModelManifest,
    class_problem,
    manifest_problems,
)
from omniprobe.config.strict import STRICT
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem, problems_from_validation
from omniprobe.safe_io import outside, parse_json, read_text
from omniprobe_engine.knobs import BY_NAME, GROUP_OFFLOADS, KNOBS, REQUIRED, Knob

# The offload value before streams were a setting of their own: it reads as its level with streams.
MIGRATED_OFFLOADS = {"group-leaf-stream": {"offload": "group-leaf", "use_stream": True}}
# Text encoder classes (a committed config's "class") whose linear layers torchao's int8
# weight-only quantize_ replaces, as the engine quantises them.
INT8_TEXT_ENCODERS = ("transformers.Qwen3VLForConditionalGeneration",)
KNOB_ORDER = {knob.name: i for i, knob in enumerate(KNOBS)}
# Keys a profile may set for capacity runs in place of fixtures.json's [sampling].
SAMPLING_KEYS = tuple(knob.name for knob in KNOBS if knob.sampling)


class _Input(BaseModel):
    model_config = STRICT


class _Profile(_Input):
    """How the Diffusers engine builds and runs the pipeline: one row of a Diffusers host's matrix.
    Its settings are the knob table's (omniprobe_engine/knobs.py), one field per knob."""

    description: str
    base: str | None = Field(
        default=None, exclude=True,
        description="A profile this one is the settings of, with its own on top (resolved as "
                    "hosts.toml loads: with_bases); not recorded, the resolved settings are.")

    @model_validator(mode="before")
    @classmethod
    def _migrate_offload(cls, data):
        """A profile written before streams were a setting: its offload value becomes the level,
        and its streams use_stream (an explicit use_stream that contradicts it is refused)."""
        if not isinstance(data, dict) or data.get("offload") not in MIGRATED_OFFLOADS:
            return data
        migrated = MIGRATED_OFFLOADS[data["offload"]]
        if data.get("use_stream", migrated["use_stream"]) != migrated["use_stream"]:
            raise ValueError(f"offload {data['offload']!r} means use_stream = true; "
                             f"use offload = {migrated['offload']!r} with use_stream = false")
        return {**data, **migrated}

    @model_validator(mode="after")
    def _seeds_once(self):
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: each seed once")
        problems = offload_setting_problems(self.offload, self.use_stream,
                                            self.low_cpu_mem_usage, self.record_stream,
                                            self.pinned_weights)
        if self.kv_placement != "gpu" and not self.use_kv_cache:
            problems.append(f"kv_placement = {self.kv_placement!r} needs use_kv_cache = true: "
                            "without the cache there is nothing to place")
        if self.release_kv_before_decode and not self.use_kv_cache:
            problems.append("release_kv_before_decode = true needs use_kv_cache = true: without "
                            "the cache there is nothing to release")
        if problems:
            raise ValueError("; ".join(problems))
        unknown = set(self.chosen_by_omniprobe) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"chosen_by_omniprobe names unknown keys {sorted(unknown)}")
        return self

    @property
    def offload_label(self) -> str:
        """The offload mode with its stream settings, as the report names it."""
        if self.offload not in GROUP_OFFLOADS:
            return self.offload
        if not self.use_stream:
            return f"{self.offload} without streams"
        extra = [k for k in ("low_cpu_mem_usage", "record_stream") if getattr(self, k)]
        extra += ["weights pinned packed"] if self.pinned_weights == "packed" else []
        return f"{self.offload} with streams" + "".join(f", {k}" for k in extra)

    @property
    def overrides_sampling(self) -> bool:
        return any(getattr(self, key) is not None for key in SAMPLING_KEYS)

    def settings(self, names: tuple[str, ...]) -> tuple:
        """The values of the named knobs, in that order: a key profiles are grouped by."""
        return tuple(getattr(self, name) for name in names)


def _knob_field(knob: Knob) -> tuple[Any, Any]:
    """A knob as a strict pydantic field: its type (its choices, a list's bounded items, null
    where it may be), its default and its bounds."""
    if knob.value is list:
        annotation: Any = list[Annotated[int, Field(**knob.item_bounds)]]
    elif knob.choices:
        annotation = Literal[knob.choices]
    else:
        annotation = knob.value
    if knob.nullable:
        annotation = annotation | None
    default = ... if knob.default is REQUIRED else knob.default
    return annotation, Field(default, description=knob.description, **knob.bounds)


DiffusersProfile = create_model(
    "DiffusersProfile", __base__=_Profile, __module__=__name__, __doc__=_Profile.__doc__,
    **{knob.name: _knob_field(knob) for knob in KNOBS},
    chosen_by_omniprobe=(list[str], Field(
        default=[], description="The keys of this profile the seed report does not state.")),
    seed_says=(str | None, Field(default=None, description="What the seed states of it, quoted.")))


# A profile's words about itself: they change nothing the engine builds or runs.
PROSE_KEYS = ("description", "chosen_by_omniprobe", "seed_says")


def _resolved(settings: dict) -> dict:
    """A profile's settings as today's model reads them (an old offload value migrated, a
    setting added since at its default); as recorded where they no longer validate."""
    try:
        return DiffusersProfile.model_validate(settings).model_dump(mode="json")
    except ValidationError:
        return dict(settings)


def setting_changes(before: dict, after: dict) -> dict[str, tuple]:
    """Each setting that differs between two profiles' settings (recorded or hosts.toml's), by
    name, as (before, after), both read as today's model reads them; their words aside."""
    before, after = _resolved(before), _resolved(after)
    return {key: (before.get(key, "(unset)"), after.get(key, "(unset)"))
            for key in sorted(set(before) | set(after))
            if key not in PROSE_KEYS and before.get(key) != after.get(key)}


def profile_differences(recorded: dict, current: dict) -> list[str]:
    """Each setting of a profile that differs between an attempt's record of it and hosts.toml
    now, as `key: recorded -> now`."""
    return [f"{key}: {was!r} -> {now!r}"
            for key, (was, now) in setting_changes(recorded, current).items()]


def offload_setting_problems(offload: str, use_stream: bool, low_cpu_mem_usage: bool,
                             record_stream: bool, pinned_weights: str = "blocks") -> list[str]:
    """What is wrong with a profile's stream settings for its offload mode (apply_group_offloading
    reads them only at group offload, low_cpu_mem_usage and record_stream only with streams, and
    keeps the page-locked copies pinned_weights packs only without low_cpu_mem_usage)."""
    problems = []
    packed = pinned_weights == "packed"
    if offload not in GROUP_OFFLOADS:
        set_ = [k for k, v in (("use_stream", use_stream), ("low_cpu_mem_usage", low_cpu_mem_usage),
                               ("record_stream", record_stream), ("pinned_weights", packed)) if v]
        if set_:
            problems.append(f"{', '.join(set_)}: offload {offload!r} ignores it; only group "
                            f"offload ({', '.join(GROUP_OFFLOADS)}) takes stream settings")
        return problems
    if record_stream and not use_stream:
        problems.append("record_stream = true needs use_stream = true (it records tensors on "
                        "the offload stream)")
    if low_cpu_mem_usage and not use_stream:
        problems.append("low_cpu_mem_usage = true needs use_stream = true: without streams "
                        "group offload pins nothing, so the setting is ignored")
    if packed and (low_cpu_mem_usage or not use_stream):
        problems.append('pinned_weights = "packed" needs use_stream = true and '
                        "low_cpu_mem_usage = false: only then does group offload keep "
                        "page-locked copies to pack")
    return problems


class _ProfileDefaults(_Input):
    """[diffusers_profile_defaults]: what a profile that does not state it takes. Its sampling
    keys (the knob table's) are merged into each profile as it is loaded (a profile records them
    as before); the condition size is read from here where it is used, so a profile records only
    its own."""

    @model_validator(mode="after")
    def _chosen_known(self):
        unknown = set(self.chosen_by_omniprobe) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"chosen_by_omniprobe names unknown keys {sorted(unknown)}")
        return self


DiffusersProfileDefaults = create_model(
    "DiffusersProfileDefaults", __base__=_ProfileDefaults, __module__=__name__,
    __doc__=_ProfileDefaults.__doc__,
    output_resolution=(int, Field(description="The side condition images are resized to (area "
                                              "output_resolution²) for a profile that states "
                                              "none.", **BY_NAME["output_resolution"].bounds)),
    **{knob.name: _knob_field(knob) for knob in KNOBS if knob.sampling},
    chosen_by_omniprobe=(list[str], Field(
        default=[], description="The keys here the seed report does not state; a profile that "
                                "takes one records it in its own chosen_by_omniprobe.")))


def with_bases(profiles: dict) -> dict:
    """Each profile that names a `base` as that profile's settings (its own base resolved first)
    with its own on top. What a profile says of itself is never inherited: its description and
    seed_says are its own; its chosen_by_omniprobe is the base's, less the keys it sets itself,
    plus its own, in the knob table's order. ValueError naming the profile for a base that is no
    profile, or a circle of bases."""
    resolved: dict = {}

    def resolve(name: str, chain: tuple[str, ...]) -> object:
        """`name` resolved; `chain`: the profiles whose bases led here, `name` last."""
        table = profiles[name]
        if name in resolved or not isinstance(table, dict) or "base" not in table:
            return resolved.setdefault(name, table)
        base = table["base"]
        if not isinstance(base, str) or base not in profiles:
            raise ValueError(f"[diffusers_profiles.{name}] key 'base': {base!r} is not a profile "
                             f"of [diffusers_profiles]")
        if base in chain:
            circle = (*chain[chain.index(base):], base)
            raise ValueError(f"[diffusers_profiles.{name}] key 'base': a circle of bases, "
                             f"{' -> '.join(circle)}")
        inherited = resolve(base, (*chain, base))
        if not isinstance(inherited, dict):
            return resolved.setdefault(name, table)  # the base's own table says what is wrong
        chosen = [k for k in inherited.get("chosen_by_omniprobe", []) if k not in table]
        chosen += [k for k in table.get("chosen_by_omniprobe", []) if k not in chosen]
        settings = {k: v for k, v in inherited.items() if k in KNOB_ORDER}
        merged = {**settings, **table}
        if chosen:
            merged["chosen_by_omniprobe"] = sorted(chosen, key=lambda k: KNOB_ORDER.get(k, len(KNOB_ORDER)))
        return resolved.setdefault(name, merged)

    for name in profiles:
        resolve(name, (name,))
    return resolved


def with_defaults(profile: dict, defaults: dict) -> dict:
    """A profile's table with the sampling keys it does not state taken from the defaults table,
    each marked chosen by omniprobe where the defaults mark it so."""
    if not isinstance(profile, dict):  # the model says what is wrong with it
        return profile
    taken = [key for key in SAMPLING_KEYS if key not in profile and key in defaults]
    own = profile.get("chosen_by_omniprobe", [])
    if not taken or not isinstance(own, list):
        return profile
    chosen = [key for key in defaults.get("chosen_by_omniprobe", []) if key in taken]
    merged = {**profile, **{key: defaults[key] for key in taken}}
    if chosen:
        merged["chosen_by_omniprobe"] = [*own, *chosen]
    return merged


class DiffusersHost(_Input):
    """[hosts.<name>.diffusers]: where a Diffusers host's weights come from."""

    weights: Literal["snapshot", "random"] = Field(
        description="snapshot: the pinned snapshot, loaded offline (real hosts); random: every "
                    "component built from the committed configs with random weights (capacity "
                    "only, never output structure).")
    configs: InsidePath | None = Field(
        default=None, pattern=r"^models/",
        description="Random weights: the folder under models/ holding the component configs.")
    init_seed: int = Field(default=0, ge=0, lt=2**32,
                           description="Random weights: the seed of the random init.")
    runner_env: Literal["diffusers", "own"] = Field(
        default="diffusers",
        description="The Python the Diffusers runner runs on: diffusers, the Diffusers env's "
                    "([diffusers_env], built by `omniprobe env build --host NAME --env diffusers`; "
                    "{python} of offline_command); own: the Python running omniprobe, as the "
                    "host's python_provider says.")

    @model_validator(mode="after")
    def _configs_for_random(self) -> DiffusersHost:
        if (self.weights == "random") != (self.configs is not None):
            raise ValueError("'configs' is given exactly when weights = 'random'")
        return self


class ExpectedParameters(_Input):
    value: float = Field(gt=0, description="Billions of parameters.")
    tolerance: float = Field(gt=0, lt=1, description="Relative.")
    source: str


class ComponentConfig(_Input):
    """One committed component config of a model folder (models/<model>/<size>/<component>.json)."""

    component: str = Field(pattern=COMPONENT_NAME,
                           description="The pipeline's keyword for it (the file's name).")
    class_: str = Field(alias="class", description="The class the config builds, "
                                                   "'diffusers.<Class>' or "
                                                   "'transformers.<Class>', a note after a "
                                                   "space; classes without weights (a tokenizer, "
                                                   "a processor) the model's adapter makes.")
    confirmed: bool = Field(
        description="Whether something public confirms these values are the released "
                    "checkpoint's; false: the report says so.")
    note: str
    config: dict
    sources: dict[str, str] = Field(description="Every key of config, with where its value "
                                                "comes from.")
    expected_parameters_b: ExpectedParameters | None = Field(
        default=None, description="A parameter count the built component must match.")

    model_config = ConfigDict(**STRICT, populate_by_name=True)

    @field_validator("class_")
    @classmethod
    def _a_class(cls, value: str) -> str:
        why = class_problem(*_library_class(value))
        if why is not None:
            raise ValueError(why)
        return value

    @property
    def library_class(self) -> tuple[str, str]:
        """(library, class), as the manifest names it: the class without its note."""
        return _library_class(self.class_)

    @model_validator(mode="after")
    def _every_value_sourced(self) -> ComponentConfig:
        missing = sorted(set(self.config) - set(self.sources))
        extra = sorted(set(self.sources) - set(self.config))
        if missing or extra:
            raise ValueError(f"sources must name every config key once: missing {missing}, "
                             f"not in config {extra}")
        # A processor is made from its image processor's settings (the adapter reads them).
        if (self.library_class[1].endswith("Processor")
                and not isinstance(self.config.get("image_processor"), dict)):
            raise ValueError(f"{'.'.join(self.library_class)} is a processor: its config needs its "
                             "image processor's settings, an 'image_processor' table")
        return self


def _library_class(text: str) -> tuple[str, str]:
    """'diffusers.X (a note)' as ('diffusers', 'X'): the class a component config names."""
    library, _, name = text.split(" ")[0].partition(".")
    return library, name


class ModelConfigs(_Input):
    """A model folder: its manifest and component configs, with the sha256 of each component
    file's bytes."""

    folder: str
    manifest: ModelManifest
    components: dict[str, ComponentConfig]
    digests: dict[str, str]

    def engine_components(self) -> dict[str, dict]:
        """What the engine builds from: each component's class and config, by name, sorted (the
        runner's weights.components)."""
        return {name: {"class": c.class_, "config": c.config}
                for name, c in sorted(self.components.items())}

    @property
    def unconfirmed(self) -> tuple[str, ...]:
        return tuple(name for name, c in self.components.items() if not c.confirmed)


def _read_model(path: Path, model: type[BaseModel]) -> tuple[BaseModel | None, str, list[Problem]]:
    """One file of a model folder as `model`: (it or None, its text, its problems)."""
    text = read_text(path)
    data = parse_json(path, text)
    try:
        return model.model_validate_json(json.dumps(data), strict=True), text, []
    except ValidationError as exc:
        return None, text, problems_from_validation(path, exc)


def load_model_configs(root: Path, folder: str) -> ModelConfigs:
    """The model folder `folder` (relative to the project root): its manifest and one config per
    component, each file inside the project (a symlink out of it is refused). InputError naming
    each file and field that is wrong: a folder without configs or manifest, a component the
    manifest names without its config or the other way round, a class the two name differently,
    a pipeline that takes other components than the manifest's."""
    base = root / folder
    paths = sorted(base.glob("*.json")) if base.is_dir() else []
    if not paths:
        raise InputError([Problem(str(base), "", "missing: a random-weight model needs its "
                                                 f"manifest ({MANIFEST_FILE}) and component "
                                                 "configs (<component>.json) there")])
    real_root = root.resolve()
    escaped = [Problem(str(path), "", f"resolves to {found}, outside the project {root}: a "
                                      "model's configs are committed files of the project")
               for path in [base, *paths] if (found := outside(path, real_root)) is not None]
    if escaped:
        raise InputError(escaped)
    problems: list[Problem] = []
    components: dict[str, ComponentConfig] = {}
    digests: dict[str, str] = {}
    manifest_path = base / MANIFEST_FILE
    for path in paths:
        if path == manifest_path:
            continue
        component, text, found = _read_model(path, ComponentConfig)
        problems += found
        if component is None:
            continue
        if component.component != path.stem:
            problems.append(Problem(str(path), "$.component",
                                    f"expected {path.stem!r} (the file's name), got "
                                    f"{component.component!r}"))
            continue
        components[path.stem], digests[path.stem] = component, sha256_bytes(text.encode())
    if not manifest_path.is_file():
        problems.append(Problem(str(manifest_path), "", "missing: a model folder names its "
                                                        "pipeline and each component's library "
                                                        "and class there"))
        raise InputError(problems)
    manifest, _, found = _read_model(manifest_path, ModelManifest)
    problems += found
    if manifest is not None:
        problems += manifest_problems(
            manifest, {name: c.library_class for name, c in components.items()}, base,
            manifest_path)
    if problems:
        raise InputError(problems)
    return ModelConfigs(folder=folder, manifest=manifest, components=components, digests=digests)


def pipeline_problems(profiles: dict[str, DiffusersProfile], configs: ModelConfigs,
                      hosts_file: str, host_name: str) -> list[Problem]:
    """Each profile whose pipeline is not the one the host's model folder is built into: its
    components would go to a pipeline that does not take them."""
    manifest = configs.manifest
    return [Problem(hosts_file, f"[diffusers_profiles.{name}] key 'pipeline'",
                    f"{profile.pipeline!r}, but host {host_name!r} builds {manifest.model} "
                    f"([hosts.{host_name}.diffusers] key 'configs' = {configs.folder!r}), whose "
                    f"{MANIFEST_FILE} names {manifest.pipeline!r}: a profile of this host names "
                    "that pipeline")
            for name, profile in profiles.items() if profile.pipeline != manifest.pipeline]


def int8_text_encoder_problems(profiles: dict[str, DiffusersProfile], configs: ModelConfigs,
                               hosts_file: str) -> list[Problem]:
    """Each profile that asks an int8 text encoder of a model whose text encoder class cannot
    take it (INT8_TEXT_ENCODERS), named by its hosts.toml key and the config's class."""
    component = configs.components.get("text_encoder")
    found = component.class_ if component is not None else None
    return [Problem(hosts_file, f"[diffusers_profiles.{name}] key 'quantize_text_encoder'",
                    f"{configs.folder}/text_encoder.json builds {found!r}, which torchao's int8 "
                    f"weight-only quantization is not known to take; expected one of "
                    f"{', '.join(INT8_TEXT_ENCODERS)}, or no quantize_text_encoder")
            for name, profile in profiles.items()
            if profile.quantize_text_encoder is not None and found not in INT8_TEXT_ENCODERS]
