"""The model-specific part of the Diffusers engine: one small adapter per model family, each a
module of this package that names the pipelines it serves (`PIPELINES`). The engine builds any
pipeline from its committed configs; an adapter adds only what a family's pipeline needs beyond
them: the components with no weights it makes itself (a synthetic tokenizer or processor), the
call's own arguments, and the recorder of what the pipeline keeps between its steps.

An adapter module defines
    PIPELINES: tuple[str, ...]        the diffusers pipeline classes it serves, by name
    SCHEDULER: str                    the diffusers scheduler class the pipeline is built with
    unweighted(name, class_name, config)  a component without weights (processor, tokenizer)
    refusal(profile) -> str | None    why it cannot run a profile (a setting its pipeline lacks)
    call_arguments(pipe, profile, request, sizing) -> dict  the call's model-specific arguments
    recorder(pipe)                    an object whose take() returns what a request measured

Like the engine it stands alone (the runner loads it in the probe's Python, beside itself, with
the standard library only at import time), so the harness may also import it to ask which
pipelines exist before anything runs.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

_SHARED = {"synthetic_tokenizer"}  # helpers of the adapters, no adapter themselves


@functools.cache
def _adapters() -> dict[str, ModuleType]:
    """Every adapter of this package by the pipeline names it serves (scanned once a process, so
    a new family is one new module). Callers read it and change nothing."""
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in _SHARED or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for pipeline in module.PIPELINES:
            if pipeline in found:
                raise ImportError(f"pipeline {pipeline!r} is served by two adapters: "
                                  f"{found[pipeline].__name__} and {module.__name__}")
            found[pipeline] = module
    return found


def known_pipelines() -> tuple[str, ...]:
    return tuple(sorted(_adapters()))


def adapter_for(pipeline: str) -> ModuleType:
    """The adapter of `pipeline`; KeyError naming the pipelines there are adapters for."""
    adapters = _adapters()
    if pipeline not in adapters:
        raise KeyError(f"no Diffusers adapter serves pipeline {pipeline!r} (adapters exist for "
                       f"{', '.join(sorted(adapters))})")
    return adapters[pipeline]
