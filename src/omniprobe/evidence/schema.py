"""JSON Schema for every file format, generated from the pydantic models."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from pydantic import TypeAdapter

from omniprobe.atomic import write_text_atomic
from omniprobe.config.diffusers import ComponentConfig
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.model_manifest import ModelManifest
from omniprobe.config.report_settings import ReportSettings
from omniprobe.config.sim_config import SimConfig
from omniprobe.evidence.files import FILE_MODELS
from omniprobe.evidence.models.archive import ArchiveManifest, UnpackJournal


def all_schemas() -> dict[str, dict]:
    """File name of each schema -> the schema; evidence files are named after the file they check."""
    schemas = {
        f"evidence.{name.removesuffix('.json')}.schema.json": TypeAdapter(model).json_schema()
        for name, model in FILE_MODELS.items()
    }
    schemas["evidence-archive.manifest.schema.json"] = ArchiveManifest.model_json_schema()
    schemas["evidence-archive.journal.schema.json"] = UnpackJournal.model_json_schema()
    schemas["fixtures.schema.json"] = FixtureSuite.model_json_schema()
    schemas["hosts.schema.json"] = HostsConfig.model_json_schema()
    schemas["model.schema.json"] = ModelManifest.model_json_schema()
    schemas["model-component.schema.json"] = ComponentConfig.model_json_schema(by_alias=True)
    schemas["report.schema.json"] = ReportSettings.model_json_schema()
    schemas["sim.schema.json"] = SimConfig.model_json_schema()
    return schemas


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


@functools.cache
def _rendered() -> tuple[tuple[str, str], ...]:
    """(file name, text) of every schema: the models are fixed for the life of the process, and
    generating them costs more than validating the whole evidence tree."""
    return tuple((name, render(schema)) for name, schema in all_schemas().items())


def write_schemas(folder: Path) -> list[Path]:
    written = []
    wanted = dict(_rendered())
    for name, text in wanted.items():
        written.append(write_text_atomic(folder / name, text))
    for stale in folder.glob("*.schema.json"):
        if stale.name not in wanted:
            stale.unlink()
    return written


def stale_schemas(folder: Path) -> list[str]:
    """Names of committed schema files that differ from the models (or are missing or extra)."""
    wanted = dict(_rendered())
    stale = [name for name, text in wanted.items()
             if not (folder / name).is_file() or (folder / name).read_text() != text]
    stale += [p.name for p in folder.glob("*.schema.json") if p.name not in wanted]
    return sorted(stale)
