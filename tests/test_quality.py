"""The structure gate, PSNR against a baseline, determinism groups, and `omniprobe quality`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omniprobe.analysis.verdicts import host_verdict
from omniprobe.classify.imaging import load_pixels, measure, pixels_sha256, to_pixels
from omniprobe.classify.structure_gate import gate_record, structure_of
from omniprobe.cli import main
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.project import Project
from omniprobe.config.report_settings import QualitySettings, StructureChecks
from omniprobe.digests import sha256_file
from omniprobe.errors import InputError
from omniprobe.evidence.files import write_section
from omniprobe.evidence.load import LoadedAttempt, load_attempt
from omniprobe.evidence.models.attempt import Attempt
from omniprobe.evidence.models.requests import ImageMetrics, RequestRecord
from omniprobe.evidence.validate import load_project, load_valid_project
from omniprobe.harness.common.quality import (
    Output,
    baseline_path,
    determinism_groups,
    latest_attempt_with_outputs,
    pixel_hashes,
)

from .conftest import agreeing, hosts_copy
from .evidence_scaffold import add_attempt
from .synthetic import broken_signature, natural, perturbed, save, textbook_psnr

ROOT = Path(__file__).resolve().parents[1]
CFG = StructureChecks()
FIXTURE = "edit-compose-pair"
WHITE = np.full((16, 16, 4), 255, np.uint8)


def metrics_of(array: np.ndarray) -> ImageMetrics:
    return measure(to_pixels(Image.fromarray(array), "x"), CFG)


def record(flag_set="cpuoff", seed=2301, outcome="ok", structure="unchecked", **extra):
    return RequestRecord(flag_set=flag_set, fixture=FIXTURE, seed=seed, outcome=outcome,
                         structure=structure, wall_s=36.7, **agreeing(outcome, structure, **extra))


def rtx5080_verdict(repo_copy: Project, request: RequestRecord):
    """The rtx5080's verdict by verdicts.py's rules: its committed evidence (every flag set
    fails init) plus one attempt in which `request` is the only request of a ready server."""
    folder = repo_copy.evidence_dir / "rtx5080" / "gate-check"
    if not folder.exists():
        add_attempt(repo_copy, "rtx5080", "gate-check",
                    runs=[{"flag_set": request.flag_set, "init": {"outcome": "ready"}}])
    write_section(folder, "requests.json", [request])
    loaded = load_valid_project(repo_copy)
    return host_verdict("rtx5080", loaded.hosts, loaded.fixtures, loaded.evidence)


# --- the gate ------------------------------------------------------------------------------


def test_the_gate_turns_an_ok_request_with_a_broken_image_into_a_structure_failure(repo_copy):
    # The report's trap: an fp8 run counted as working because it returned an image.
    counted_before = record(flag_set="fp8", structure="sound").model_copy(
        update={"fixture": "edit-compose-four"})
    before = rtx5080_verdict(repo_copy, counted_before)
    assert (before.verdict, before.served_by, before.highest_served_refs) == ("built", ("fp8",), 4)
    gated = gate_record(counted_before, metrics_of(broken_signature()))
    assert (gated.outcome, gated.structure) == ("ok", "broken")
    after = rtx5080_verdict(repo_copy, gated)
    assert (after.verdict, after.blocker, after.highest_served_refs) == ("not-built", "structure", 0)
    assert [(u.flag_set, u.structure) for u in after.capacity_unlocks] == [("fp8", "broken")]
    assert gated.image is not None and gated.image.opaque_fraction < 0.05
    assert counted_before.structure == counted_before.image.verdict == "sound"  # input untouched


@pytest.mark.parametrize(("image", "structure"), [(natural, "sound"), (broken_signature, "broken")])
def test_the_gate_sets_structure_from_the_image(image, structure):
    gated = gate_record(record(), metrics_of(image()))
    assert gated.structure == structure and gated.image.verdict == structure
    assert RequestRecord.model_validate_json(gated.model_dump_json()) == gated


def test_the_gate_refuses_a_request_that_returned_no_image():
    with pytest.raises(ValueError, match="outcome 'oom'; only an ok request"):
        gate_record(record(outcome="oom"), metrics_of(natural()))


@pytest.mark.parametrize(("metrics", "thresholds", "expected"), [
    (None, None, "unchecked"),
    (metrics_of(natural()), None, "sound"),
    (metrics_of(broken_signature()), None, "broken"),
    # Re-derived from the recorded figures under other thresholds:
    (metrics_of(broken_signature()), StructureChecks(min_opaque_fraction=0.01, min_rgb_std=0),
     "sound"),
    (metrics_of(broken_signature()), StructureChecks(min_opaque_fraction=0.01), "broken"),
    (metrics_of(WHITE), None, "broken"),
    (metrics_of(WHITE), StructureChecks(max_flat_fraction=1, min_rgb_std=0), "sound"),
    (metrics_of(WHITE), StructureChecks(max_flat_fraction=1), "broken"),  # near-flat too
])
def test_structure_of(metrics, thresholds, expected):
    assert structure_of(metrics, thresholds) == expected


# --- determinism groups ----------------------------------------------------------------------

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _groups(hashes):
    return [(g.fixture, g.seed, g.flag_sets, g.sha256_prefix, g.identical)
            for g in determinism_groups(hashes)]


@pytest.mark.parametrize(("hashes", "expected"), [
    ({(FIXTURE, 2301): {"cpuoff": A}}, []),
    ({(FIXTURE, 2301): {"cpuoff": A, "cpuoff-fp8v": A, "cpuoff-expandable": A}},
     [(FIXTURE, 2301, ["cpuoff", "cpuoff-fp8v", "cpuoff-expandable"], A, True)]),
    ({(FIXTURE, 2301): {"cpuoff": A, "fp8": B, "default": C}},
     [(FIXTURE, 2301, ["cpuoff", "fp8", "default"], A, False)]),
    ({(FIXTURE, 2302): {"fp8": B, "cpuoff": A, "cpuoff-fp8v": A},
      ("single-reference", 2301): {"cpuoff": C, "fp8": C}},
     [(FIXTURE, 2302, ["fp8", "cpuoff", "cpuoff-fp8v"], B, False),
      (FIXTURE, 2302, ["cpuoff", "cpuoff-fp8v"], A, True),
      ("single-reference", 2301, ["cpuoff", "fp8"], C, True)]),
])
def test_determinism_groups(hashes, expected):
    assert _groups(hashes) == expected


def test_recorded_pixel_hashes_are_used_only_when_a_whole_cell_has_them():
    outputs = [Output(0, record("cpuoff", pixels_sha256=A), Path("0.png")),
               Output(1, record("fp8", pixels_sha256=A), Path("1.png")),
               Output(2, record("cpuoff", seed=2302, pixels_sha256=A), Path("2.png")),
               Output(3, record("fp8", seed=2302), Path("3.png"))]
    computed = {0: B, 1: B, 2: B, 3: C}
    assert pixel_hashes(outputs, computed) == {(FIXTURE, 2301): {"cpuoff": A, "fp8": A},
                                               (FIXTURE, 2302): {"cpuoff": B, "fp8": C}}


@pytest.mark.parametrize(("layout", "expected"), [
    ("{fixture}/{seed}.png", "edit-compose-pair/2301.png"),
    ("{source_name}_{seed:05d}.png", "single_02301.png"),
    ("samples/{fixture}-s{seed}.webp", "samples/single-reference-s2301.webp"),
])
def test_baseline_layout(layout, expected):
    fixtures = load_fixtures(ROOT / "fixtures" / "fixtures.json")
    fixture = fixtures.get("single-reference" if "single" in expected else FIXTURE)
    assert baseline_path(Path("/base"), layout, fixture, 2301) == Path("/base") / expected


@pytest.mark.parametrize(("layout", "message"), [
    ("{fixture}.png", "must name {seed}"),
    ("{fixture}/{seed}/{flag_set}.png", "unknown placeholder"),
    ("/abs/{fixture}/{seed}.png", "inside the baseline folder"),
    ("../{fixture}/{seed}.png", "inside the baseline folder"),
])
def test_bad_layouts_are_refused(layout, message):
    with pytest.raises(ValueError, match=message):
        QualitySettings(baseline_layout=layout)


def _attempt(attempt_id: str, kind: str, started: str | None, artifact: str | None):
    run = {"tool_version": "0.1.0", "command": ["omniprobe"], "started_at": started}
    provenance = {
        "transcribed": {"source": {"name": "seed.txt", "sha256": None}, "section": "x"},
        "measured": {"host": "rtx3090", "hostname": "h", **run},
        "simulated": {"model": "omniprobe.sim", **run},
    }[kind]
    meta = Attempt(id=attempt_id, host="rtx3090", date="2026-10-08", description="d",
                   provenance={"kind": kind, **provenance})
    return LoadedAttempt(Path(attempt_id), meta, requests=[
        record(artifact=artifact) if artifact else record(outcome="oom")])


@pytest.mark.parametrize(("attempts", "expected"), [
    ([_attempt("old", "measured", "2026-10-07T10:00:00Z", "a.png"),
      _attempt("new", "measured", "2026-10-08T10:00:00+02:00", "b.png"),
      _attempt("no-images", "measured", "2026-10-09T10:00:00Z", None),
      _attempt("copied", "transcribed", None, "c.png")], "new"),
    ([_attempt("sim", "simulated", "2026-10-08T10:00:00", "a.png"),
      _attempt("real", "measured", "2026-10-01T10:00:00Z", "b.png")], "sim"),
    ([_attempt("copied", "transcribed", None, "c.png")], None),
])
def test_the_default_attempt_is_the_latest_with_images(attempts, expected):
    if expected is None:
        with pytest.raises(InputError, match="pass --attempt ID"):
            latest_attempt_with_outputs(attempts)
    else:
        assert latest_attempt_with_outputs(attempts).id == expected


# --- omniprobe quality, end to end on a generated evidence tree ------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch):
    """hosts.toml and fixtures from the repository, a transcribed Diffusers baseline attempt, a
    measured attempt with five requests (one OOM) and their images, and the baseline images."""
    hosts_copy(tmp_path)
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    artifacts = tmp_path / "artifacts"
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    monkeypatch.setenv("OMNIPROBE_ARTIFACTS", str(artifacts))
    host = tmp_path / "evidence" / "rtx3090"
    write_section(host / "q3-pair", "attempt.json", {
        "id": "q3-pair", "host": "rtx3090", "date": "2026-10-07", "description": "Diffusers",
        "provenance": {"kind": "transcribed", "section": "PSNR",
                       "source": {"name": "seed.txt", "sha256": None}}})
    write_section(host / "run-1", "attempt.json", {
        "id": "run-1", "host": "rtx3090", "date": "2026-10-08", "description": "serve",
        "baseline": "q3-pair",
        "provenance": {"kind": "measured", "host": "rtx3090", "hostname": "cachyos-alexander",
                       "tool_version": "0.1.0", "command": ["omniprobe", "probe-serve"],
                       "started_at": "2026-10-08T10:00:00Z"}})
    base = {seed: natural(seed=seed) for seed in (2301, 2302)}
    for seed, image in base.items():
        save(tmp_path / "baseline" / FIXTURE / f"{seed}.png", image)
    images = {  # compress_level differs: same pixels, different bytes
        ("cpuoff-expandable", 2301): (perturbed(base[2301], 8), {"compress_level": 1}),
        ("cpuoff", 2301): (perturbed(base[2301], 8), {"compress_level": 9}),
        ("fp8", 2301): (broken_signature(shape=base[2301].shape[:2]), {}),
        ("cpuoff-expandable", 2302): (perturbed(base[2302], 5), {}),
    }
    records = []
    for (flag_set, seed), (image, params) in images.items():
        save(artifacts / "run-1" / f"{flag_set}-{seed}.png", image, **params)
        records.append(record(flag_set, seed, artifact=f"run-1/{flag_set}-{seed}.png",
                              output_sha256=sha256_file(artifacts / "run-1" /
                                                        f"{flag_set}-{seed}.png")))
    records.append(record("cpuoff", 2302, outcome="oom"))
    write_section(host / "run-1", "requests.json", records)
    return Project(tmp_path)


def test_quality_writes_psnr_rows_and_determinism_groups(project, capsys):
    args = ["quality", "--attempt", "run-1", "--baseline", str(project.root / "baseline")]
    assert main(args) == 0
    out = capsys.readouterr().out
    attempt, problems = load_attempt(project.evidence_dir / "rtx3090" / "run-1")
    assert problems == []
    rows = {(r.flag_set, r.seeds[0]): r for r in attempt.psnr}
    assert set(rows) == {("cpuoff-expandable", 2301), ("cpuoff", 2301), ("fp8", 2301),
                         ("cpuoff-expandable", 2302)}
    for (flag_set, seed), row in rows.items():
        ours = np.asarray(Image.open(project.artifacts_dir / "run-1" / f"{flag_set}-{seed}.png"))
        theirs = np.asarray(Image.open(project.root / "baseline" / FIXTURE / f"{seed}.png"))
        expected = textbook_psnr(theirs, ours, data_range=255)
        assert row.psnr_db.min == row.psnr_db.max == pytest.approx(expected, abs=1e-6)
        assert (row.comparator, row.baseline_attempt, row.identical) == ("rgba", "q3-pair", False)
    assert rows[("fp8", 2301)].structure == "broken" and "not a usable" in rows[("fp8", 2301)].note
    assert rows[("fp8", 2301)].psnr_db.min < 12 < rows[("cpuoff", 2301)].psnr_db.min
    assert all(rows[k].structure == "sound" for k in rows if k[0] != "fp8")

    same = pixels_sha256(load_pixels(project.artifacts_dir / "run-1" / "cpuoff-2301.png"))
    assert [(g.seed, g.flag_sets, g.identical, g.sha256_prefix) for g in attempt.determinism] == [
        (2301, ["cpuoff-expandable", "cpuoff", "fp8"], False, same),
        (2301, ["cpuoff-expandable", "cpuoff"], True, same),
    ]
    assert "identical across cpuoff-expandable, cpuoff" in out and "psnr.json" in out
    _, project_problems = load_project(project)
    assert project_problems == []


def test_quality_picks_the_latest_attempt_and_another_layout(project):
    baseline = project.root / "baseline"
    for seed in (2301, 2302):
        (baseline / FIXTURE / f"{seed}.png").rename(baseline / f"{FIXTURE}-{seed}.png")
    args = ["quality", "--baseline", str(baseline), "--layout", "{fixture}-{seed}.png"]
    assert main(args) == 0
    assert (project.evidence_dir / "rtx3090" / "run-1" / "psnr.json").is_file()


def test_missing_baseline_images_are_named_and_nothing_is_written(project, capsys):
    (project.root / "baseline" / FIXTURE / "2302.png").unlink()
    args = ["quality", "--attempt", "run-1", "--baseline", str(project.root / "baseline")]
    assert main(args) == 2  # bad input
    err = capsys.readouterr().err
    assert str(project.root / "baseline" / FIXTURE / "2302.png") in err
    assert f"fixture '{FIXTURE}' seed 2302 not found" in err
    assert sorted(p.name for p in (project.evidence_dir / "rtx3090" / "run-1").iterdir()) == [
        "attempt.json", "requests.json"]


def _repeat_first_request(p: Project) -> None:
    path = p.evidence_dir / "rtx3090" / "run-1" / "requests.json"
    data = json.loads(path.read_text())
    data["requests"].append(data["requests"][0])
    path.write_text(json.dumps(data))


def _drop_the_baseline_attempt(p: Project) -> None:
    path = p.evidence_dir / "rtx3090" / "run-1" / "attempt.json"
    data = json.loads(path.read_text())
    del data["attempt"]["baseline"]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "args", "message"), [
    (lambda p: (p.artifacts_dir / "run-1" / "fp8-2301.png").unlink(), [],
     "$.requests[2].artifact: image not found at"),
    (_repeat_first_request, [], "$.requests[5]: a second record of (flag set, fixture, seed) "
                                "('cpuoff-expandable', 'edit-compose-pair', 2301); the first is "
                                "at $.requests[0]"),
    (_drop_the_baseline_attempt, [], "$.attempt.baseline: the attempt names no baseline attempt"),
    (lambda p: save(p.root / "baseline" / FIXTURE / "2301.png", natural((10, 10))), [],
     "differs from"),
    # An output laid over its record's artifact: refused by its hash before any comparison.
    (lambda p: save(p.artifacts_dir / "run-1" / "fp8-2301.png", natural((10, 10))), [],
     "not the image the probe wrote"),
    (lambda p: None, ["--baseline-attempt", "nope"], "baseline attempt 'nope' is not under"),
    (lambda p: None, ["--layout", "{seed}.png"], "must name {seed} and {fixture}"),
    (lambda p: None, ["--attempt", "run-9"], "no attempt 'run-9'"),
])
def test_bad_inputs_are_clear_errors_and_nothing_is_written(project, capsys, change, args,
                                                            message):
    change(project)
    base = ["quality", "--baseline", str(project.root / "baseline")]
    assert main(base + (args if "--attempt" in args else ["--attempt", "run-1", *args])) == 2
    assert message in capsys.readouterr().err
    assert not (project.evidence_dir / "rtx3090" / "run-1" / "psnr.json").exists()


def test_an_image_laid_over_its_records_path_is_refused_and_nothing_is_written(project):
    """An artifact whose bytes are not the ones its record hashed (planted by hand, or by an
    archive from elsewhere) is compared with nothing: quality names the file and writes no
    PSNR."""
    planted = project.artifacts_dir / "run-1" / "cpuoff-2301.png"
    save(planted, natural(seed=99))
    with pytest.raises(InputError, match="not the image the probe wrote") as err:
        from omniprobe.harness.common.quality import run_quality

        run_quality(project, project.root / "baseline", attempt_id="run-1")
    assert str(planted) in str(err.value.problems[0])
    assert not (project.evidence_dir / "rtx3090" / "run-1" / "psnr.json").exists()


def test_quality_writes_through_the_store_and_waits_for_no_probe_holding_the_attempt(
        project, capsys):
    """A probe resuming the attempt holds its lock: quality is refused by name, nothing written."""
    from omniprobe.evidence.attempts import open_attempt

    folder = project.evidence_dir / "rtx3090" / "run-1"
    probe = open_attempt(project, folder)
    try:
        args = ["quality", "--attempt", "run-1", "--baseline", str(project.root / "baseline")]
        assert main(args) != 0
        assert "another probe is writing attempt run-1" in capsys.readouterr().err
        assert not (folder / "psnr.json").exists() and not (folder / "determinism.json").exists()
    finally:
        probe.close()
    assert main(args) == 0 and (folder / "psnr.json").is_file()
