"""The model-specific part of the Diffusers engine: one small adapter per model family, each a
subclass of `base.DiffusersAdapter` in its own module of this package, naming the pipelines it
serves. The engine builds any pipeline from its committed configs; an adapter adds only what a
family's pipeline needs beyond them: the components with no weights it makes itself (a synthetic
tokenizer or processor), the call's own arguments, the recorder of what the pipeline keeps between
its steps, and what a failed request leaves that the engine's recovery does not undo. Its
capabilities (a conditioning cache, a condition size, the offload placements it allows) decide
which profiles it refuses; base.py holds every behaviour's default.

Like the engine it stands alone (the runner loads it in the probe's Python, beside itself, with
the standard library only at import time), so the harness may also import it to ask which
pipelines exist before anything runs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Iterable

from .base import DiffusersAdapter

_SHARED = {"base", "synthetic_tokenizer"}  # helpers of the adapters, no adapter themselves


def registry(adapters: Iterable[type[DiffusersAdapter]]) -> dict[str, DiffusersAdapter]:
    """One instance of each adapter class by the pipeline names it serves; ImportError naming
    both where two claim one pipeline."""
    found: dict[str, DiffusersAdapter] = {}
    for cls in adapters:
        adapter = cls()
        for pipeline in cls.pipelines:
            if pipeline in found:
                claimed = type(found[pipeline])
                raise ImportError(f"pipeline {pipeline!r} is served by two adapters: "
                                  f"{claimed.__module__}.{claimed.__qualname__} and "
                                  f"{cls.__module__}.{cls.__qualname__}")
            found[pipeline] = adapter
    return found


@functools.cache
def _adapters() -> dict[str, DiffusersAdapter]:
    """Every adapter this package defines (scanned once a process, so a new family is one new
    module). Callers read it and change nothing."""
    classes = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in _SHARED or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        classes += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, DiffusersAdapter) and cls.__module__ == module.__name__]
    return registry(classes)


def known_pipelines() -> tuple[str, ...]:
    return tuple(sorted(_adapters()))


def adapter_for(pipeline: str) -> DiffusersAdapter:
    """The adapter of `pipeline`; KeyError naming the pipelines there are adapters for."""
    adapters = _adapters()
    if pipeline not in adapters:
        raise KeyError(f"no Diffusers adapter serves pipeline {pipeline!r} (adapters exist for "
                       f"{', '.join(sorted(adapters))})")
    return adapters[pipeline]
