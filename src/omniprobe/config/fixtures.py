"""fixtures/fixtures.json: the request fixtures, with what the source leaves unstated kept unknown."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from PIL import Image
from pydantic import BaseModel, Field, ValidationError, model_validator

from omniprobe.config.inside_path import InsidePath
from omniprobe.config.names import Name
from omniprobe.config.sources import SourceDocument
from omniprobe.config.strict import STRICT
from omniprobe.digests import sha256_bytes
from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation
from omniprobe.limits import MAX_SEED
from omniprobe.safe_io import confine, load_json, read_bytes

# Where a request's inputs come from: the fixture's own, as its source states them (or as a user
# who holds them filled them in), or omniprobe's stand-ins for inputs the source does not state.
Inputs = Literal["original", "stand-in"]
ChosenField = Literal["prompt", "width", "height", "references"]


class _Input(BaseModel):
    # Strict when loaded (load_fixtures): no coercion of "2301" or true to an int; finite floats.
    model_config = STRICT


# Seeds as every generator of the stacks takes them (omniprobe.limits).
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
# Pixels per side: above any output the served model makes, below what would exhaust memory.
MAX_SIDE_PX = 4096
MAX_REFERENCE_BYTES = 64 * 1024**2  # a 4096x4096 RGBA PNG stored raw is 64 MiB
MAX_REFERENCE_PIXELS = MAX_SIDE_PX**2  # hosts.toml [probe] max_reference_pixels: its default


class FixtureNotRunnable(Refusal):
    """A fixture lacks facts the source never stated; running it would mean inventing them."""


class ReferenceImage(_Input):
    name: str
    file: InsidePath = Field(
        description="Path of the image, relative to the fixtures file, inside its folder.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$",
                        description="sha256 of the file's bytes: what the server is sent.")
    pixels_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the decoded pixels (omniprobe.classify.imaging.pixels_sha256), for "
                    "generated images whose PNG bytes may differ between encoder versions.")


class Derivation(_Input):
    """How a fixture was made from another, as the source records it."""

    fixture: str
    removed_references: list[str]
    edits: str


class Fixture(_Input):
    id: Name
    kind: Literal["edit", "t2i"]
    reference_count: int = Field(ge=0, le=64)
    source_name: str = Field(description="What the source calls this fixture.")
    prompt: str | None = Field(default=None, description="null: not stated by the source.")
    width: int | None = Field(default=None, gt=0, le=MAX_SIDE_PX,
                              description="null: not stated by the source.")
    height: int | None = Field(default=None, gt=0, le=MAX_SIDE_PX,
                               description="null: not stated by the source.")
    references: list[ReferenceImage] | None = Field(
        default=None, description="The bound reference images; null: not stated by the source."
    )
    known_reference_names: list[str] = Field(
        default=[], description="Reference names the source mentions, where the full binding is unknown."
    )
    derived_from: Derivation | None = None
    simulated: bool = Field(
        default=False, description="Made up for the sim host; runs there only, and only when named."
    )
    stands_in_for: str | None = Field(
        default=None, description="The seed fixture this stand-in runs in place of: same kind and "
                                  "reference count, with omniprobe's prompt and references.")
    chosen_by_omniprobe: list[ChosenField] = Field(
        default=[], description="Fields whose values omniprobe chose: the source does not state them.")
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
        if self.stands_in_for is not None:
            if self.simulated:
                raise ValueError("a stand-in runs on real hosts: it cannot be simulated")
            unmarked = [f for f in ("prompt", "references") if f not in self.chosen_by_omniprobe
                        and (f == "prompt" or self.kind == "edit")]
            if unmarked:
                raise ValueError(f"a stand-in's {' and '.join(unmarked)} are omniprobe's: list "
                                 "them in chosen_by_omniprobe")
        return self

    @property
    def inputs(self) -> Inputs:
        return "stand-in" if self.stands_in_for is not None else "original"

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
    seeds: list[Seed] = Field(min_length=1)

    @model_validator(mode="after")
    def _seeds_once(self) -> Sampling:
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:  # each seed is one request per cell: a repeat would be a second record
            raise ValueError(f"seeds must each appear once; repeated: {repeated}")
        return self
    num_inference_steps: int = Field(gt=0, le=1000)
    true_cfg_scale: float = Field(ge=0)
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
            if f.stands_in_for is not None:
                require_stand_in_matches(f, next((o for o in self.fixtures if o.id == f.stands_in_for),
                                         None))
        return self

    def standins_for(self, fixture_id: str) -> list[Fixture]:
        return [f for f in self.fixtures if f.stands_in_for == fixture_id]

    def default_fixtures(self) -> tuple[list[Fixture], list[str]]:
        """What a host serves when no fixture is named, and why each stand-in is among them.

        Each of the source's fixtures runs as stated where its inputs are known (a user filled
        them in); otherwise its stand-ins run in its place. Simulated fixtures run only when named.
        """
        chosen: list[Fixture] = []
        notes: list[str] = []
        for fixture in self.fixtures:
            if fixture.simulated or fixture.stands_in_for is not None:
                continue
            if fixture.runnable:
                chosen.append(fixture)
                continue
            standins = [s for s in self.standins_for(fixture.id) if s.runnable]
            missing = ", ".join(fixture.missing_fields())
            if standins:
                chosen.extend(standins)
                notes.append(f"{fixture.id}: its source does not state {missing}; stand-in "
                             f"{', '.join(s.id for s in standins)} runs in its place")
            else:
                notes.append(f"{fixture.id}: not run: its source does not state {missing}, and "
                             "it has no runnable stand-in")
        return chosen, notes

    def get(self, fixture_id: str) -> Fixture:
        for f in self.fixtures:
            if f.id == fixture_id:
                return f
        raise KeyError(f"unknown fixture {fixture_id!r}; fixtures: {', '.join(self.ids)}")

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.fixtures]


def require_stand_in_matches(standin: Fixture, original: Fixture | None) -> None:
    """A stand-in must match the fixture it stands in for wherever that fixture is stated, and
    mark as chosen what it is not; ValueError otherwise."""
    name = f"stand-in {standin.id!r}"
    if original is None:
        raise ValueError(f"{name} stands in for unknown fixture {standin.stands_in_for!r}")
    if original.simulated or original.stands_in_for is not None:
        raise ValueError(f"{name} stands in for {original.id!r}, which is itself made up")
    if (standin.kind, standin.reference_count) != (original.kind, original.reference_count):
        raise ValueError(f"{name} is a {standin.kind} with {standin.reference_count} references; "
                         f"{original.id!r} is a {original.kind} with {original.reference_count}")
    for field in ("width", "height"):
        stated = getattr(original, field)
        if stated is not None and getattr(standin, field) != stated:
            raise ValueError(f"{name} has {field} {getattr(standin, field)}; {original.id!r} "
                             f"states {stated}")
        if (stated is None) != (field in standin.chosen_by_omniprobe):
            raise ValueError(f"{name}: {field} is in chosen_by_omniprobe exactly when "
                             f"{original.id!r} does not state it")


def reference_file_problem(path: Path, data: bytes, sha256: str, max_pixels: int) -> str | None:
    """What makes a reference file unfit to send, or None: it must be a file of its own (one
    link: a hard link may be a file outside fixtures/), decode completely with Pillow, and hold
    at most `max_pixels` pixels (hosts.toml [probe] max_reference_pixels). `sha256`: the digest
    of `data`, as the caller checked it against the pin (hashing it again would only repeat it)."""
    links = path.stat().st_nlink
    if links != 1:
        return (f"{path.name}: has {links} hard links; a reference is a file of its own in "
                "fixtures/ (copy it there)")
    key = (sha256, max_pixels)
    if key not in _DECODED:
        _DECODED[key] = _image_problem(data, max_pixels)
    unfit = _DECODED[key]
    return None if unfit is None else f"{path.name}: {unfit}"


# What decoding gave, by (sha256, bound): a pure function of the bytes, so a process (validate,
# then the report; the tests) decodes each reference once, not once a check.
_DECODED: dict[tuple[str, int], str | None] = {}


def _image_problem(data: bytes, max_pixels: int) -> str | None:
    try:
        with warnings.catch_warnings():  # the size is checked here, against our own bound
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        with img:
            width, height = img.size  # from the header: nothing is decoded yet
            if width * height > max_pixels:
                return (f"{width}x{height} is {width * height} pixels, over the limit of "
                        f"{max_pixels} (hosts.toml [probe] max_reference_pixels)")
            img.load()
    except Image.UnidentifiedImageError:
        return "not an image Pillow can identify"
    except (OSError, Image.DecompressionBombError, SyntaxError, ValueError) as exc:
        return f"does not decode completely: {exc}"
    return None


def reference_problems(suite: FixtureSuite, fixtures_file: Path, max_pixels: int,
                       wanted: Callable[[Fixture], bool] | None = None) -> list[Problem]:
    """Every bound reference of the wanted fixtures whose file is missing, lies outside the
    fixtures folder, is not a decodable image of its own within `max_pixels`, or whose bytes do
    not match its pinned sha256."""
    problems = []
    base = fixtures_file.parent
    for i, fixture in enumerate(suite.fixtures):
        if wanted is not None and not wanted(fixture):
            continue
        for j, ref in enumerate(fixture.references or []):
            where = f"$.fixtures[{i}].references[{j}]"
            try:
                path = confine(base, ref.file, file=fixtures_file, field=f"{where}.file")
                data = read_bytes(path, max_bytes=MAX_REFERENCE_BYTES)
            except InputError as exc:
                problem = exc.problems[0]
                problems.append(problem if problem.file == str(fixtures_file) else Problem(
                    str(fixtures_file), f"{where}.file", f"{ref.file}: {problem.message}"))
                continue
            digest = sha256_bytes(data)
            if digest != ref.sha256:
                problems.append(Problem(str(fixtures_file), f"{where}.sha256",
                                        f"{ref.file}: sha256 differs from the pinned "
                                        f"{ref.sha256[:12]}… (the file's: {digest[:12]}…)"))
                continue
            unfit = reference_file_problem(path, data, digest, max_pixels)
            if unfit is not None:
                problems.append(Problem(str(fixtures_file), f"{where}.file", unfit))
    return problems


def load_fixtures(path: str | Path) -> FixtureSuite:
    path = Path(path)
    data = load_json(path)
    try:
        return FixtureSuite.model_validate(data, strict=True)
    except ValidationError as exc:
        raise InputError(problems_from_validation(path, exc)) from None
