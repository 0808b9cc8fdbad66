"""A model folder's manifest, models/<model>/<size>/model.json, in the spirit of diffusers'
model_index.json: the pipeline class the folder's component configs are built into and each
component's library and class; the rules a class name meets without importing its library; and
the manifest held to the configs beside it and to its pipeline's own components (its adapter's)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from omniprobe.config.strict import STRICT
from omniprobe.errors import Problem
from omniprobe_engine.adapters import adapter_for
from omniprobe_engine.knobs import BY_NAME

# A component's name, as a pipeline's __init__ takes it and its config file is named.
COMPONENT_NAME = r"^[a-z][a-z0-9_]*$"
# A model folder's manifest, beside its component configs (diffusers' model_index.json's part).
MANIFEST_FILE = "model.json"
# The libraries a component's class comes from, as model_index.json's (library, class) pairs name
# them; a class name is CamelCase (a module or a function of the library is lower case).
LIBRARIES = ("diffusers", "transformers")
CLASS_NAME = r"^[A-Z][A-Za-z0-9]*$"


def class_problem(library: str, name: str) -> str | None:
    """What is wrong with `library.name` as a component's class, by the names alone (nothing is
    imported): a library of LIBRARIES, a CamelCase class, and not a pipeline's class."""
    if library not in LIBRARIES:
        return (f"library {library!r}: expected one of {', '.join(LIBRARIES)}, as "
                "model_index.json names a component's library")
    if not re.match(CLASS_NAME, name):
        return (f"{library}.{name} is no class name (a class is CamelCase; a module or a "
                f"function of {library} is lower case): expected a model or configuration "
                "class, or a tokenizer or processor class")
    if name.endswith("Pipeline"):
        return (f"{library}.{name} is a pipeline class, not a component's: the folder's pipeline "
                f"is its {MANIFEST_FILE}'s 'pipeline'")
    return None


class ModelManifest(BaseModel):
    """models/<model>/<size>/model.json: what the folder's component configs are built into, in
    the spirit of diffusers' model_index.json: the pipeline class and each component's library and
    class. A host whose configs are this folder runs only profiles naming this pipeline."""

    model_config = STRICT

    model: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$",
                       description="The model's name and size, as the report names it.")
    pipeline: str = Field(pattern=BY_NAME["pipeline"].bounds["pattern"],
                          description="The diffusers pipeline class the components are built "
                                      "into (a profile's `pipeline`).")
    components: dict[Annotated[str, Field(pattern=COMPONENT_NAME)], tuple[str, str]] = Field(
        min_length=1,
        description="Each component the pipeline takes beside its scheduler, by its keyword: "
                    "[library, class], as model_index.json has them; each has its config, "
                    "<component>.json, beside this file.")
    note: str = Field(description="Where the folder's values come from, in a sentence.")

    @field_validator("components")
    @classmethod
    def _classes_named(cls, components: dict[str, tuple[str, str]]):
        problems = [f"{name}: {why}" for name, (library, class_) in components.items()
                    if (why := class_problem(library, class_)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
        return components


def manifest_problems(manifest: ModelManifest, classes: dict[str, tuple[str, str]],
                      base: Path, manifest_path: Path) -> list[Problem]:
    """The manifest against the component files beside it (`classes`: each one's library and
    class, by component) and its pipeline's own components (its adapter's): the same
    components, each of the same class."""
    problems = []
    named, files = set(manifest.components), set(classes)
    for name in sorted(named - files):
        problems.append(Problem(str(base / f"{name}.json"), "",
                                f"missing: {manifest_path.name} names component {name!r}, which "
                                "needs its config here"))
    for name in sorted(files - named):
        problems.append(Problem(str(manifest_path), "$.components",
                                f"no component {name!r}, though {name}.json is beside it: name "
                                "it here, or remove the file"))
    for name in sorted(named & files):
        if classes[name] != tuple(manifest.components[name]):
            found = ".".join(classes[name])
            problems.append(Problem(str(manifest_path), f"$.components.{name}",
                                    f"{'.'.join(manifest.components[name])}, but {name}.json "
                                    f"builds {found}; name one class in both"))
    try:
        takes = set(adapter_for(manifest.pipeline).components)
    except KeyError as exc:
        return [*problems, Problem(str(manifest_path), "$.pipeline", str(exc.args[0]))]
    if takes != named:
        differ = [f"{what} {sorted(names)}" for what, names in
                  (("missing", takes - named), ("not taken", named - takes)) if names]
        problems.append(Problem(str(manifest_path), "$.components",
                                f"{manifest.pipeline} takes {', '.join(sorted(takes))} beside "
                                f"its scheduler; {', '.join(differ)}"))
    return problems
