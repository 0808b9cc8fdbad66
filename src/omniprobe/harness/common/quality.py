"""PSNR of an attempt's outputs against a baseline attempt's images, and the determinism groups.

`omniprobe quality --attempt ID --baseline DIR` takes the attempt's ok requests (requests.json),
opens each output image (RequestRecord.artifact: an absolute path, or one relative to the
artifacts folder) and compares it with the baseline image of the same fixture and seed, found
under DIR by the hosts.toml [quality] baseline_layout pattern. One PsnrRow per request goes to
the attempt's psnr.json. The outputs of one fixture and seed under different flag sets are
grouped by pixel hash into determinism.json. Every input is checked before anything is written,
and both files go through the attempt store, which holds the attempt's lock while it writes.

Outputs made from stand-in inputs (fixtures.json `stands_in_for`) get no PSNR row: the baseline
ran the original inputs, so a comparison would set two different pictures side by side. Each is
refused by name; they still join the determinism groups, which compare flag sets with each other.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from omniprobe.classify.imaging import Comparator, Pixels, load_pixels, measure, pixels_sha256, psnr
from omniprobe.config.fixtures import Fixture, FixtureSuite
from omniprobe.config.project import Project
from omniprobe.config.report_settings import QualitySettings, StructureChecks
from omniprobe.digests import sha256_file
from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation
from omniprobe.evidence.attempts import open_attempt
from omniprobe.evidence.files import ATTEMPT_FILE
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.migrations import content_path
from omniprobe.evidence.models.outputs import DeterminismGroup, PsnrRow
from omniprobe.evidence.models.requests import RequestRecord
from omniprobe.evidence.quantities import Range
from omniprobe.evidence.validate import load_valid_project
from omniprobe.safe_io import confine

RequestKey = tuple[str, int]  # (fixture, seed): one request


class RandomWeights(Refusal):
    """A PSNR asked of images made with random weights."""


@dataclass(frozen=True)
class Output:
    """One ok request of the attempt and where its image lies."""

    index: int
    record: RequestRecord
    path: Path


@dataclass(frozen=True)
class QualityResult:
    attempt: LoadedAttempt
    rows: list[PsnrRow]
    groups: list[DeterminismGroup]
    written: list[Path]
    refused: list[Problem] = field(default_factory=list)


def resolve_artifact(artifact: str, artifacts_dir: Path, *, file: str | Path = "requests.json",
                     field: str = "artifact") -> Path:
    """An evidence record's artifact, inside the artifacts folder (InputError naming the record
    otherwise)."""
    return confine(artifacts_dir, artifact, file=file, field=field)


def attempt_outputs(attempt: LoadedAttempt, artifacts_dir: Path) -> list[Output]:
    """The attempt's ok requests with their images; InputError lists every one that lacks it."""
    file = str(attempt.path / "requests.json")
    at = functools.partial(content_path, "requests.json")
    outputs: list[Output] = []
    problems: list[Problem] = []
    for i, record in enumerate(attempt.requests):  # one per cell: validate refuses repeats
        if record.outcome != "ok":
            continue
        if record.artifact is None:
            problems.append(Problem(file, at(f"$[{i}].artifact"),
                                    "an ok request has no artifact; its image cannot be compared"))
            continue
        try:
            path = resolve_artifact(record.artifact, artifacts_dir, file=file,
                                    field=at(f"$[{i}].artifact"))
        except InputError as exc:
            problems += exc.problems
            continue
        if not path.is_file():
            problems.append(Problem(file, at(f"$[{i}].artifact"), f"image not found at {path}"))
        outputs.append(Output(i, record, path))
    if not outputs and not problems:
        problems.append(Problem(file, "", f"attempt {attempt.id!r} has no ok requests to compare"))
    if problems:
        raise InputError(problems)
    return outputs


def standin_refusals(attempt: LoadedAttempt, outputs: list[Output],
                     fixtures: FixtureSuite) -> list[Problem]:
    """One refusal per output made from stand-in inputs, naming it and what it stands in for."""
    file = str(attempt.path / "requests.json")
    refused = []
    for out in outputs:
        if out.record.inputs != "stand-in":
            continue
        fixture = fixtures.get(out.record.fixture)
        refused.append(Problem(file, content_path("requests.json", f"$[{out.index}].inputs"), (
            f"{out.record.flag_set} {fixture.id} seed {out.record.seed}: no PSNR against the "
            f"baseline: {fixture.id!r} is a stand-in for {fixture.stands_in_for!r}, and the "
            "baseline ran the original inputs")))
    return refused


def baseline_path(baseline_dir: Path, layout: str, fixture: Fixture, seed: int) -> Path:
    """The baseline image's path, inside the baseline folder whatever a fixture's source name
    holds (InputError naming the layout otherwise)."""
    return confine(baseline_dir, layout.format(fixture=fixture.id, source_name=fixture.source_name,
                                               seed=seed),
                   file="baseline_layout", field=f"fixture {fixture.id!r} seed {seed}")


def baseline_paths(outputs: list[Output], baseline_dir: Path, layout: str,
                   fixtures: FixtureSuite) -> dict[RequestKey, Path]:
    """The baseline image of every fixture and seed the outputs need; InputError names each
    expected path that is missing."""
    paths: dict[RequestKey, Path] = {}
    problems: list[Problem] = []
    for out in outputs:
        key = (out.record.fixture, out.record.seed)
        if key in paths:
            continue
        try:
            paths[key] = path = baseline_path(baseline_dir, layout, fixtures.get(key[0]), key[1])
        except InputError as exc:
            problems += exc.problems
            continue
        if not path.is_file():
            problems.append(Problem(str(path), "", f"baseline image for fixture {key[0]!r} seed "
                                    f"{key[1]} not found (layout {layout!r} under {baseline_dir})"))
    if problems:
        raise InputError(problems)
    return paths


def psnr_row(record: RequestRecord, output: Pixels, baseline: Pixels, checks: StructureChecks,
             comparator: Comparator, convert_modes: bool, baseline_attempt: str) -> PsnrRow:
    """One request's PSNR against its baseline image, with its output's structure verdict."""
    result = psnr(baseline, output, comparator, convert_modes=convert_modes)
    metrics = measure(output, checks)
    note = None
    if metrics.verdict == "broken":
        # The report's lesson: a collapsed output still yields a PSNR; it is not a usable one.
        note = f"output structurally broken ({'; '.join(metrics.reasons)}); not a usable comparison"
    return PsnrRow(
        flag_set=record.flag_set,
        fixture=record.fixture,
        seeds=[record.seed],
        psnr_db=None if result.db is None else Range(min=result.db, max=result.db),
        identical=result.identical,
        comparator=comparator,
        baseline_attempt=baseline_attempt,
        structure=metrics.verdict,
        note=note,
    )


def pixel_hashes(outputs: list[Output],
                 computed: Mapping[int, str]) -> dict[RequestKey, dict[str, str]]:
    """Flag set -> pixel hash for each fixture and seed.

    A cell uses the hashes recorded in requests.json when every one of its requests has one;
    otherwise it uses hashes computed here for all of them, so one cell never mixes the two.
    """
    cells: dict[RequestKey, list[Output]] = defaultdict(list)
    for out in outputs:
        cells[(out.record.fixture, out.record.seed)].append(out)
    hashes: dict[RequestKey, dict[str, str]] = {}
    for key, outs in cells.items():
        recorded = all(o.record.pixels_sha256 for o in outs)
        hashes[key] = {o.record.flag_set: o.record.pixels_sha256 if recorded else computed[o.index]
                       for o in outs}
    return hashes


def determinism_groups(hashes: Mapping[RequestKey, Mapping[str, str]]) -> list[DeterminismGroup]:
    """Groups of flag sets whose outputs for one fixture and seed are pixel-identical.

    Per fixture and seed compared under two or more flag sets: when all agree, one identical
    group; otherwise one group of all of them with identical=false (sha256_prefix: the first
    listed flag set's hash), then one identical group per hash that two or more flag sets share.
    """
    groups = []
    for (fixture, seed), by_flag_set in sorted(hashes.items()):
        if len(by_flag_set) < 2:
            continue
        members: dict[str, list[str]] = defaultdict(list)
        for flag_set, digest in by_flag_set.items():
            members[digest].append(flag_set)
        flag_sets = list(by_flag_set)
        if len(members) > 1:
            groups.append(DeterminismGroup(fixture=fixture, seed=seed, flag_sets=flag_sets,
                                           sha256_prefix=by_flag_set[flag_sets[0]],
                                           compared="pixels", identical=False))
        groups.extend(DeterminismGroup(fixture=fixture, seed=seed, flag_sets=same,
                                       sha256_prefix=digest, compared="pixels", identical=True)
                      for digest, same in members.items() if len(same) > 1)
    return groups


def latest_attempt_with_outputs(attempts: list[LoadedAttempt]) -> LoadedAttempt:
    """The most recently started measured or simulated attempt that has an ok request with an
    image artifact."""
    candidates = [a for a in attempts if a.meta.provenance.kind != "transcribed"
                  and any(r.outcome == "ok" and r.artifact for r in a.requests)]
    if not candidates:
        raise InputError([Problem("evidence", "", "no attempt has ok requests with image "
                                                  "artifacts; pass --attempt ID")])
    # timestamp(): naive and aware start times compare without a TypeError.
    return max(candidates, key=lambda a: (a.meta.provenance.started_at.timestamp(), a.id))


def _with_layout(cfg: QualitySettings, layout: str | None) -> QualitySettings:
    if layout is None:
        return cfg
    try:
        return QualitySettings.model_validate({**cfg.model_dump(), "baseline_layout": layout})
    except ValidationError as exc:
        raise InputError(problems_from_validation("--layout", exc)) from None


def require_recorded_images(attempt, outputs) -> None:
    """Every image compared is the one its record hashed: a file laid over an artifact path (by
    hand, or by an archive from elsewhere) is refused, naming it, before any PSNR is written."""
    problems = []
    for out in outputs:
        want = out.record.output_sha256
        if want is not None and sha256_file(out.path) != want:
            problems.append(Problem(str(out.path), "", f"its sha256 is not the {want[:12]}... "
                                    f"its record in {attempt.id} holds: not the image the probe "
                                    "wrote, so nothing is compared with it"))
    if problems:
        raise InputError(problems)


def run_quality(project: Project, baseline_dir: Path, *, attempt_id: str | None = None,
                layout: str | None = None, comparator: Comparator | None = None,
                baseline_attempt: str | None = None) -> QualityResult:
    """Compute PSNR rows and determinism groups for one attempt and write them as evidence."""
    loaded = load_valid_project(project)
    evidence = loaded.evidence
    try:
        attempt = (evidence.attempt(attempt_id) if attempt_id
                   else latest_attempt_with_outputs(evidence.attempts))
    except KeyError as exc:
        raise InputError([Problem(str(project.evidence_dir), "", exc.args[0])]) from None
    cfg = _with_layout(loaded.hosts.quality, layout)
    comparator = comparator or cfg.comparator
    baseline_attempt = baseline_attempt or attempt.meta.baseline
    if baseline_attempt is None:
        raise InputError([Problem(str(attempt.path / ATTEMPT_FILE),
                                  content_path(ATTEMPT_FILE, "$.baseline"),
                                  "the attempt names no baseline attempt; "
                                  "pass --baseline-attempt ID")])
    if baseline_attempt not in {a.id for a in evidence.attempts}:
        raise InputError([Problem("--baseline-attempt", "",
                                  f"baseline attempt {baseline_attempt!r} is not under evidence/")])
    # Random weights count for capacity only: their pictures compare with nothing.
    for role, which in (("baseline attempt", evidence.attempt(baseline_attempt)),
                        ("attempt", attempt)):
        if which.meta.weights == "random":
            raise RandomWeights(f"{role} {which.id!r} was made with random weights: its images "
                                "mean nothing, so no PSNR is taken against or from them")
    if not baseline_dir.is_dir():
        raise InputError([Problem(str(baseline_dir), "", "baseline folder not found")])

    outputs = attempt_outputs(attempt, project.artifacts_dir)
    require_recorded_images(attempt, outputs)
    refused = standin_refusals(attempt, outputs, loaded.fixtures)
    originals = [o for o in outputs if o.record.inputs == "original"]
    if not originals:
        raise InputError(refused)
    baselines = baseline_paths(originals, baseline_dir, cfg.baseline_layout, loaded.fixtures)
    baseline_pixels = {key: load_pixels(path) for key, path in baselines.items()}
    rows, computed = [], {}
    for out in outputs:
        pixels = load_pixels(out.path)
        computed[out.index] = pixels_sha256(pixels)
        if out.record.inputs == "original":
            baseline = baseline_pixels[(out.record.fixture, out.record.seed)]
            rows.append(psnr_row(out.record, pixels, baseline, loaded.hosts.structure, comparator,
                                 cfg.convert_modes, baseline_attempt))
    groups = determinism_groups(pixel_hashes(outputs, computed))
    store = open_attempt(project, attempt.path)
    try:
        written = store.put_quality(rows, groups)
    finally:
        store.close()
    return QualityResult(attempt, rows, groups, written, refused)

