"""fixtures/fixtures.json: the request fixtures, with what the source leaves unstated kept unknown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from omniprobe.config.sources import SourceDocument
from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixtureNotRunnable(Refusal):
    """A fixture lacks facts the source never stated; running it would mean inventing them."""


class ReferenceImage(_Input):
    name: str
    file: str = Field(description="Path of the image, relative to the fixtures file.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Derivation(_Input):
    """How a fixture was made from another, as the source records it."""

    fixture: str
    removed_references: list[str]
    edits: str


class Fixture(_Input):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    kind: Literal["edit", "t2i"]
    reference_count: int = Field(ge=0)
    source_name: str = Field(description="What the source calls this fixture.")
    prompt: str | None = Field(default=None, description="null: not stated by the source.")
    width: int | None = Field(default=None, gt=0, description="null: not stated by the source.")
    height: int | None = Field(default=None, gt=0, description="null: not stated by the source.")
    references: list[ReferenceImage] | None = Field(
        default=None, description="The bound reference images; null: not stated by the source."
    )
    known_reference_names: list[str] = Field(
        default=[], description="Reference names the source mentions, where the full binding is unknown."
    )
    derived_from: Derivation | None = None
    simulated: bool = Field(
        default=False, description="Made up for the sim host; runs only on simulated hosts."
    )
    note: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Fixture:
        if self.kind == "t2i" and self.reference_count != 0:
            raise ValueError("a t2i fixture has reference_count 0")
        if self.kind == "edit" and self.reference_count < 1:
            raise ValueError("an edit fixture has at least one reference")
        if self.references is not None and len(self.references) != self.reference_count:
            raise ValueError(
                f"{len(self.references)} references bound but reference_count is "
                f"{self.reference_count}"
            )
        return self

    def missing_fields(self) -> list[str]:
        missing = [f for f in ("prompt", "width", "height") if getattr(self, f) is None]
        if self.kind == "edit" and self.references is None:
            missing.append("references")
        return missing

    @property
    def runnable(self) -> bool:
        return not self.missing_fields()

    def require_runnable(self) -> Fixture:
        missing = self.missing_fields()
        if missing:
            raise FixtureNotRunnable(
                f"fixture {self.id!r} cannot run: its source does not state "
                f"{', '.join(missing)}; record them in fixtures/fixtures.json first"
            )
        return self


class Sampling(_Input):
    seeds: list[int] = Field(min_length=1)
    num_inference_steps: int = Field(gt=0)
    true_cfg_scale: float
    negative_prompt: Literal[False] = Field(description="The report sends no negative prompt.")


class FixtureSuite(_Input):
    source: SourceDocument = Field(description="The document these facts come from.")
    section: str = Field(description="Where in it.")
    note: str | None = Field(default=None, description="What the source leaves out.")
    reference_suite: str
    prompt_set: str
    generator: str = Field(description="What rendered the prompts and bindings.")
    sampling: Sampling
    fixtures: list[Fixture]

    @model_validator(mode="after")
    def _unique_and_derivations_known(self) -> FixtureSuite:
        ids = [f.id for f in self.fixtures]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate fixture ids: {', '.join(dupes)}")
        for f in self.fixtures:
            if f.derived_from and f.derived_from.fixture not in ids:
                raise ValueError(f"{f.id} is derived from unknown fixture {f.derived_from.fixture!r}")
        return self

    def get(self, fixture_id: str) -> Fixture:
        for f in self.fixtures:
            if f.id == fixture_id:
                return f
        raise KeyError(f"unknown fixture {fixture_id!r}; fixtures: {', '.join(self.ids)}")

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.fixtures]


def load_fixtures(path: str | Path) -> FixtureSuite:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(path), "", "file not found")]) from None
    except json.JSONDecodeError as exc:
        raise InputError([Problem(str(path), f"line {exc.lineno} column {exc.colno}",
                                  f"not valid JSON: {exc.msg}")]) from None
    try:
        return FixtureSuite.model_validate(data)
    except ValidationError as exc:
        raise InputError(problems_from_validation(path, exc)) from None
