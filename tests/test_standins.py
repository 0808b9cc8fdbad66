"""The stand-in fixtures: their generator, their rules, and their whole chain through the sim."""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from omniprobe.analysis.verdicts import host_verdict
from omniprobe.classify.imaging import decode_pixels, load_pixels, measure, pixels_sha256, to_pixels
from omniprobe.cli import main
from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.config.standins import STANDIN_REFERENCES, encode_png, hash_bytes, reference_pixels
from omniprobe.errors import InputError
from omniprobe.evidence.load import load_attempt
from omniprobe.evidence.validate import load_project
from omniprobe.harness.common.quality import run_quality

from .conftest import REPO, fixtures_problems, in_process, probe_argv
from .rendered import render_harness

SEED_FIXTURES = ("single-reference", "edit-compose-pair", "edit-compose-three",
                 "edit-compose-four", "t2i")


def pins(suite) -> dict[str, tuple[str, str]]:
    """file -> (sha256, pixels_sha256) as the stand-ins bind them."""
    return {r.file: (r.sha256, r.pixels_sha256) for f in suite.fixtures if f.stands_in_for
            for r in f.references or []}


# --- the generator ------------------------------------------------------------------------


def test_the_hash_is_splitmix64():
    # splitmix64's finaliser of 0 is 0xE220A8397B1DCDAF (its published first output): top byte 0xE2.
    zero = np.zeros(1, np.int64)
    assert hash_bytes(0, 0, zero, zero).tolist() == [0xE2]


# The tests that draw every stand-in share one worker: a drawing is kept per process.
DRAWS = pytest.mark.xdist_group("standins-draw")


@pytest.mark.e2e
@DRAWS
def test_regenerating_the_references_gives_the_committed_digests(repo):
    pinned = pins(load_fixtures(repo.fixtures_file))
    assert sorted(pinned) == sorted(r.file for r in STANDIN_REFERENCES)
    for ref in STANDIN_REFERENCES:
        drawn = to_pixels(Image.fromarray(reference_pixels(ref)), ref.file)
        file_sha, pixel_sha = pinned[ref.file]
        assert pixels_sha256(drawn) == pixel_sha, ref.file
        committed = repo.fixtures_file.parent / ref.file
        assert hashlib.sha256(committed.read_bytes()).hexdigest() == file_sha
        assert pixels_sha256(load_pixels(committed)) == pixel_sha
    # Re-encoding may give other bytes on another Pillow or zlib, never other pixels (one is
    # enough to show it: zlib level 9 takes a second a picture).
    assert pixels_sha256(decode_pixels(encode_png(drawn.rgba[..., :3]), ref.file)) == pixel_sha


def test_the_references_look_like_photographs_to_the_gate(repo):
    structure = load_hosts(repo.hosts_file).structure
    for ref in STANDIN_REFERENCES:
        metrics = measure(load_pixels(repo.fixtures_file.parent / ref.file), structure)
        assert metrics.verdict == "sound" and metrics.flatness < 0.1 and metrics.rgb_std > 30
        assert (metrics.width, metrics.height) == (ref.width, ref.height)
    assert len({r.seed for r in STANDIN_REFERENCES}) == len(STANDIN_REFERENCES)


def test_the_suite_stays_small_on_disk(repo):
    total = sum((repo.fixtures_file.parent / r.file).stat().st_size for r in STANDIN_REFERENCES)
    assert total < 3 * 2**20


@pytest.mark.e2e
@DRAWS
def test_standins_check_passes_on_the_repo_and_names_a_tampered_file(repo_copy, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["standins", "--check"]) == 0
    ref_b = repo_copy.fixtures_file.parent / "standins" / "ref-b.png"
    with Image.open(ref_b) as img:
        pixels = bytearray(img.tobytes())
        size = img.size
    pixels[0] ^= 1
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, bytes(pixels)).save(buffer, "PNG")
    ref_b.write_bytes(buffer.getvalue())
    capsys.readouterr()
    assert main(["standins", "--check"]) == 1
    err = capsys.readouterr().err
    assert "standins/ref-b.png: its pixels are not the generator's" in err
    assert "standins/ref-b.png: file sha256" in err and "standins/ref-a.png" not in err
    _, problems = load_project(repo_copy)
    assert any("standins/ref-b.png: sha256 differs from the pinned" in str(p) for p in problems)


@pytest.mark.e2e
@DRAWS
def test_drawing_keeps_right_files_and_redraws_wrong_ones(repo_copy, monkeypatch):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    folder = repo_copy.fixtures_file.parent / "standins"
    kept = (folder / "ref-a.png").read_bytes()
    (folder / "ref-c.png").unlink()
    assert main(["standins"]) == 0
    assert (folder / "ref-a.png").read_bytes() == kept
    assert main(["standins", "--check"]) == 0  # ref-c drawn again: its pinned pixels


# --- the fixtures' rules -------------------------------------------------------------------


def test_every_seed_fixture_has_one_stand_in_of_its_kind_and_count(repo):
    suite = load_fixtures(repo.fixtures_file)
    for seed_id in SEED_FIXTURES:
        original = suite.get(seed_id)
        [standin] = suite.standins_for(seed_id)
        assert standin.runnable and standin.inputs == "stand-in" and original.inputs == "original"
        assert (standin.kind, standin.reference_count) == (original.kind, original.reference_count)
        assert {"prompt"} <= set(standin.chosen_by_omniprobe)
        stated = original.width is not None
        assert ("width" in standin.chosen_by_omniprobe) is not stated
    assert (suite.get("standin-pair").width, suite.get("standin-pair").height) == (1248, 832)
    assert "width" not in suite.get("standin-pair").chosen_by_omniprobe
    assert not any(f.stands_in_for for f in suite.fixtures if f.simulated)


def _standin(data, fixture_id):
    return next(f for f in data["fixtures"] if f["id"] == fixture_id)


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda d: _standin(d, "standin-pair").update(stands_in_for="ghost"),
     "stands in for unknown fixture 'ghost'"),
    (lambda d: _standin(d, "standin-pair").update(stands_in_for="edit-compose-four"),
     "is a edit with 2 references; 'edit-compose-four' is a edit with 4"),
    (lambda d: _standin(d, "standin-pair").update(width=1024),
     "has width 1024; 'edit-compose-pair' states 1248"),
    (lambda d: _standin(d, "standin-pair")["chosen_by_omniprobe"].append("width"),
     "width is in chosen_by_omniprobe exactly when 'edit-compose-pair' does not state it"),
    (lambda d: _standin(d, "standin-four")["chosen_by_omniprobe"].remove("height"),
     "height is in chosen_by_omniprobe exactly when"),
    (lambda d: _standin(d, "standin-four")["chosen_by_omniprobe"].remove("references"),
     "a stand-in's references are omniprobe's"),
    (lambda d: _standin(d, "standin-t2i")["chosen_by_omniprobe"].remove("prompt"),
     "a stand-in's prompt are omniprobe's"),
    (lambda d: _standin(d, "standin-t2i").update(simulated=True), "cannot be simulated"),
    (lambda d: _standin(d, "standin-single").update(stands_in_for="sim-single"),
     "which is itself made up"),
    (lambda d: _standin(d, "standin-single")["references"][0].update(file="../hosts.toml"),
     "which climbs out with '..'"),
])
def test_stand_in_rules_are_named(repo_copy, mutate, expected):
    problems = fixtures_problems(repo_copy, mutate)
    assert any(expected in p for p in problems), problems


def fill_in_the_pair(project) -> None:
    """What a user holding the seed's inputs does: the pair's prompt and references."""
    data = json.loads(project.fixtures_file.read_text())
    pair = _standin(data, "edit-compose-pair")
    sim = _standin(data, "sim-pair")
    pair.update(prompt="the user's own prompt", references=sim["references"])
    project.fixtures_file.write_text(json.dumps(data))


@pytest.mark.parametrize(("fill_pair", "expected"), [
    (False, ["standin-single", "standin-pair", "standin-three", "standin-four", "standin-t2i"]),
    (True, ["standin-single", "edit-compose-pair", "standin-three", "standin-four",
            "standin-t2i"]),
])
def test_a_host_serves_the_originals_where_stated_else_their_stand_ins(project, fill_pair,
                                                                         expected):
    if fill_pair:
        fill_in_the_pair(project)
    chosen, notes = load_fixtures(project.fixtures_file).default_fixtures()
    assert [f.id for f in chosen] == expected
    assert ("edit-compose-pair: its source does not state prompt, references; stand-in "
            "standin-pair runs in its place" in notes) is not fill_pair
    assert not any(f.simulated for f in chosen)


# --- the chain through the sim -------------------------------------------------------------


def probe(project, session, port, *extra, nvml=None):
    return in_process(project, probe_argv(session, port, *extra), nvml=nvml)


def the_attempt(project, host="sim"):
    [folder] = sorted((project.evidence_dir / host).iterdir())
    attempt, problems = load_attempt(folder)
    assert problems == []
    return attempt


@pytest.mark.e2e
def test_the_stand_ins_run_through_the_sim_end_to_end(project, port, tmp_path):
    flag_sets = ("--flag-set", "cpuoff", "--flag-set", "fp8")
    code, out = probe(project, "probe-serve", port, *flag_sets)
    assert code == 0, out
    assert "t2i: its source does not state prompt, width, height; stand-in standin-t2i" in out
    attempt = the_attempt(project)
    records = attempt.requests
    assert {r.fixture for r in records} == {"standin-single", "standin-pair", "standin-three",
                                            "standin-four", "standin-t2i"}
    # Provenance of the inputs, on every record as written.
    raw = json.loads((attempt.path / "requests.json").read_text())["requests"]
    assert {r["inputs"] for r in raw} == {"stand-in"}
    outcomes = {(r.flag_set, r.fixture): (r.outcome, r.structure) for r in records}
    assert outcomes[("cpuoff", "standin-four")] == ("oom", "unchecked")
    assert outcomes[("cpuoff", "standin-three")] == ("ok", "sound")
    assert outcomes[("fp8", "standin-four")] == ("ok", "broken")
    pair = next(r for r in records if (r.flag_set, r.fixture) == ("cpuoff", "standin-pair"))
    stated = load_fixtures(project.fixtures_file).get("edit-compose-pair")  # as the project has it
    assert (pair.image.width, pair.image.height) == (stated.width, stated.height)

    # The stand-in cells count for capacity and output structure, and the verdict says so.
    loaded, problems = load_project(project)
    assert problems == []
    verdict = host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert (verdict.verdict, verdict.blocker, verdict.highest_served_refs) == (
        "not-built", "structure", 3)
    assert verdict.served_by == ("cpuoff",)
    assert [(u.flag_set, u.attempt, u.structure, u.fixture) for u in verdict.capacity_unlocks] == [
        ("fp8", attempt.id, "broken", "standin-four")]
    assert verdict.capacity_inputs == verdict.structure_inputs == ("stand-in",)
    assert verdict.standin_halves == ("capacity", "output structure")

    # The report marks each stand-in cell and says which halves rest on stand-ins.
    shutil.copytree(REPO / "templates", project.templates_dir)
    report = render_harness(project)
    matrix = [line for line in report.splitlines() if line.startswith("| ") and "| ok |" in line]
    assert len(matrix) == 2 and all(line.count(" (stand-in) |") == 5 for line in matrix)
    assert "| **OOM** (stand-in) |" in matrix[0]
    assert "— **output broken** (stand-in) |" in matrix[1]
    assert "| cpuoff (stand-in) | 1.50 GiB |" in report  # the OOM signature at four references
    assert (f"| standin-pair | edit-compose-pair | edit | 2 | {stated.width}×{stated.height} | "
            "prompt, references |") in report
    assert ("The capacity and output structure halves of this verdict rest on stand-in inputs "
            "(omniprobe's prompts") in report

    # PSNR against the baseline refuses every stand-in output by name, and writes nothing.
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    with pytest.raises(InputError) as info:
        run_quality(project, baseline, attempt_id=attempt.id, baseline_attempt=attempt.id)
    refused = [p.message for p in info.value.problems]
    assert len(refused) == sum(r.outcome == "ok" for r in records) == 9
    assert ("cpuoff standin-pair seed 2301: no PSNR against the baseline: 'standin-pair' is a "
            "stand-in for 'edit-compose-pair', and the baseline ran the original inputs") in refused
    assert not (attempt.path / "psnr.json").exists()


@pytest.mark.e2e
def test_a_filled_in_original_runs_beside_the_stand_ins_and_only_it_gets_psnr(project, port,
                                                                              tmp_path):
    fill_in_the_pair(project)
    code, out = probe(project, "probe-serve", port, "--flag-set", "cpuoff")
    assert code == 0, out
    attempt = the_attempt(project)
    inputs = {r.fixture: r.inputs for r in attempt.requests}
    assert inputs == {"standin-t2i": "stand-in", "standin-single": "stand-in",
                      "edit-compose-pair": "original", "standin-three": "stand-in",
                      "standin-four": "stand-in"}
    loaded, problems = load_project(project)
    assert problems == []
    verdict = host_verdict("sim", loaded.hosts, loaded.fixtures, loaded.evidence)
    assert verdict.capacity_inputs == verdict.structure_inputs == ("original", "stand-in")

    pair = next(r for r in attempt.requests if r.fixture == "edit-compose-pair")
    baseline = tmp_path / "baseline"
    (baseline / "edit-compose-pair").mkdir(parents=True)
    shutil.copy(project.artifacts_dir / pair.artifact, baseline / "edit-compose-pair" / "2301.png")
    result = run_quality(project, baseline, attempt_id=attempt.id, baseline_attempt=attempt.id)
    assert [(r.fixture, r.identical) for r in result.rows] == [("edit-compose-pair", True)]
    assert sorted(p.message.split(":")[0] for p in result.refused) == [
        "cpuoff standin-single seed 2301", "cpuoff standin-t2i seed 2301",
        "cpuoff standin-three seed 2301"]
    # A PSNR row on a stand-in, however it got there, does not validate.
    psnr = json.loads((attempt.path / "psnr.json").read_text())
    psnr["psnr"].append({**psnr["psnr"][0], "fixture": "standin-single"})
    (attempt.path / "psnr.json").write_text(json.dumps(psnr))
    _, problems = load_project(project)
    assert [str(p).split(": ", 1)[1] for p in problems] == [
        "$.psnr[1].fixture: fixture 'standin-single' is a stand-in for 'single-reference': PSNR "
        "against the baseline needs the baseline's own inputs"]


def test_a_record_whose_inputs_disagree_with_its_fixture_does_not_validate(project, port):
    assert probe(project, "probe-serve", port, "--flag-set", "fp8",
                 "--fixture", "standin-t2i")[0] == 0
    attempt = the_attempt(project)
    raw = json.loads((attempt.path / "requests.json").read_text())
    raw["requests"][0]["inputs"] = "original"
    (attempt.path / "requests.json").write_text(json.dumps(raw))
    _, problems = load_project(project)
    assert [p.message for p in problems] == [
        "expected 'stand-in', the inputs of fixture 'standin-t2i', got 'original'"]
    assert problems[0].path == "$.requests[0].inputs"


def test_offline_records_say_whose_inputs_they_ran_on(project):
    code, out = in_process(project, ["probe-offline", "--host", "sim", "--grace", "2",
                                     "--kwarg-set", "sim-offline-bf16",
                                     "--fixture", "standin-pair", "--fixture", "sim-single"])
    assert code == 0, out
    attempt = the_attempt(project)
    assert {(r.fixture, r.inputs) for r in attempt.offline_requests} == {
        ("standin-pair", "stand-in"), ("sim-single", "original")}


def test_a_real_host_serves_the_stand_ins_by_default(project, port, tmp_path_factory,
                                                     monkeypatch):
    from omniprobe.harness.common.selection import serve_fixtures

    from .env_scaffold import FakeNvml

    cfg, suite = load_hosts(project.hosts_file), load_fixtures(project.fixtures_file)
    assert [f.id for f in serve_fixtures(suite, cfg.host("rtx3090"))] == [
        "standin-t2i", "standin-single", "standin-pair", "standin-three", "standin-four"]
    # So probe-serve gets past its fixtures and stops only at the env this machine lacks.
    env_root = tmp_path_factory.mktemp("envroot")  # outside the project, as an env must be
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(env_root))
    monkeypatch.setenv("HF_HUB_CACHE", str(env_root / "hf"))
    code, out = probe(project, "probe-serve", port, "--host", "rtx3090", nvml=FakeNvml())
    assert code != 0 and "env.stamp failed: no build stamp" in out
    assert "cannot run" not in out


def test_a_reference_that_leads_out_of_the_fixtures_folder_is_refused(repo_copy, tmp_path):
    outside = tmp_path / "elsewhere.png"
    ref_a = repo_copy.fixtures_file.parent / "standins" / "ref-a.png"
    shutil.copy(ref_a, outside)
    ref_a.unlink()
    ref_a.symlink_to(outside)
    _, problems = load_project(repo_copy)
    assert [p.message for p in problems] == [
        f"standins/ref-a.png: resolves outside {repo_copy.fixtures_file.parent}"] * 4


def test_with_no_runnable_fixture_the_default_refuses_naming_each(project, port):
    data = json.loads(project.fixtures_file.read_text())
    data["fixtures"] = [f for f in data["fixtures"] if not f.get("stands_in_for")]
    project.fixtures_file.write_text(json.dumps(data))
    code, out = probe(project, "probe-serve", port)
    assert code == 3  # a refusal
    assert ("error: no fixture can run:\nerror: single-reference: not run: its source does not "
            "state prompt, width, height, references, and it has no runnable stand-in") in out
    assert not (project.evidence_dir / "sim").exists()


HALVES = [
    # stand-in requests filed for the 3090 (fixture, outcome, structure) -> verdict, blocker,
    # capacity inputs, structure inputs, halves on stand-ins
    ([], ("not-built", "structure", ("original",), ("original",), ())),
    ([("standin-four", "oom", "unchecked")],
     ("not-built", "structure", ("original", "stand-in"), ("original",), ("capacity",))),
    ([("standin-four", "ok", "sound")],
     ("built", None, ("original", "stand-in"), ("original", "stand-in"),
      ("capacity", "output structure"))),
]


@pytest.mark.parametrize(("requests", "expected"), HALVES)
def test_stand_in_cells_decide_a_real_hosts_verdict_and_it_says_which_half(repo_copy, requests,
                                                                          expected):
    from omniprobe.analysis.verdicts import all_verdicts

    from .conftest import agreeing
    from .evidence_scaffold import add_attempt

    if requests:
        add_attempt(repo_copy, "rtx3090", "standins", runs=[
            {"flag_set": "cpuoff", "init": {"outcome": "ready"}}], requests=[
            {"flag_set": "cpuoff", "fixture": fixture, "inputs": "stand-in", "seed": seed,
             "outcome": outcome, "structure": structure, "wall_s": 44.0,
             **agreeing(outcome, structure)}
            for fixture, outcome, structure in requests for seed in (2301, 2302)])
    loaded, problems = load_project(repo_copy)
    assert problems == []
    v = all_verdicts(loaded.hosts, loaded.fixtures, loaded.evidence)["rtx3090"]
    assert (v.verdict, v.blocker, v.capacity_inputs, v.structure_inputs, v.standin_halves) == (
        expected)
    # Speed-ups against the baseline stay on the original fixtures.
    assert {s.fixture for s in v.speedups} <= set(SEED_FIXTURES)
