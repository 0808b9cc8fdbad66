import json

import pytest

from omniprobe import cli
from omniprobe.evidence.files import write_section
from omniprobe.evidence.migrations import content_key
from omniprobe.evidence.validate import load_project

MATRIX = "evidence/rtx3090/seed-3090-1-serve-matrix"


def _edit(repo_copy, rel, mutate):
    """Change a committed evidence file's content (what its format version wraps)."""
    path = repo_copy.root / rel
    data = json.loads(path.read_text())
    mutate(data[content_key(path.name)])
    path.write_text(json.dumps(data))
    return path


def test_committed_project_is_valid(repo):
    loaded, problems = load_project(repo)
    assert problems == []
    kinds = {(a.host, a.meta.provenance.kind) for a in loaded.evidence.attempts}
    assert kinds == {("rtx3090", "transcribed"), ("rtx5080", "transcribed"), ("sim", "simulated"),
                     ("sim-emulated", "emulated"), ("sim-on-h200", "emulated"),
                     ("upstream", "measured"), ("diffusers-tiny-cpu", "measured"),
                     ("rtx3090-on-h200-diffusers", "emulated"),
                     ("rtx5080-on-h200-diffusers", "emulated"), ("h200-diffusers", "measured"),
                     ("h200-klein-diffusers", "measured"), ("h100-diffusers", "measured")}
    # Every Diffusers attempt of random weights says so, and no record of it claims structure.
    random = [a for a in loaded.evidence.attempts if a.host.endswith("diffusers")
              or a.host == "diffusers-tiny-cpu"]
    assert random and all(a.meta.weights == "random" for a in random)
    assert all(r.structure == "unchecked" and r.image is None
               for a in random for r in a.offline_requests)

BAD_EVIDENCE = [
    (
        "missing field",
        f"{MATRIX}/runs.json",
        lambda d: d[1]["cells"][0].pop("outcome"),
        "$.runs[1].cells[0].outcome",
        "required field is missing",
    ),
    (
        "wrong type",
        f"{MATRIX}/runs.json",
        lambda d: d[1].update(gpu_peak_mib="lots"),
        "$.runs[1].gpu_peak_mib",
        "valid integer",
    ),
    (
        "unknown flag set",
        f"{MATRIX}/propagation.json",
        lambda d: d[0].update(flag_set_with="turbo"),
        "$.propagation[0].flag_set_with",
        "unknown flag set 'turbo'",
    ),
    (
        "min exceeds max",
        f"{MATRIX}/runs.json",
        lambda d: d[5]["cells"][1].update(wall_s={"min": 35.05, "max": 34.62}),
        "$.runs[5].cells[1].wall_s",
        "minimum 35.05 exceeds maximum 34.62",
    ),
    (
        "unknown fixture",
        f"{MATRIX}/psnr.json",
        lambda d: d[0].update(fixture="edit-compose-nine"),
        "$.psnr[0].fixture",
        "unknown fixture 'edit-compose-nine'",
    ),
    (
        "unknown baseline",
        f"{MATRIX}/attempt.json",
        lambda d: d.update(baseline="nowhere"),
        "$.attempt.baseline",
        "baseline attempt 'nowhere'",
    ),
]


@pytest.mark.parametrize(
    ("name", "rel", "mutate", "path", "message"), BAD_EVIDENCE, ids=[b[0] for b in BAD_EVIDENCE]
)
def test_bad_evidence_names_file_and_field(repo_copy, name, rel, mutate, path, message):
    file = _edit(repo_copy, rel, mutate)
    _, problems = load_project(repo_copy)
    hits = [p for p in problems if p.file == str(file) and p.path == path and message in p.message]
    assert hits, problems


def test_truncated_json_is_named(repo_copy):
    file = repo_copy.root / MATRIX / "runs.json"
    file.write_text(file.read_text()[:500])
    _, problems = load_project(repo_copy)
    assert len(problems) == 1
    assert problems[0].file == str(file)
    assert "not valid JSON (truncated or malformed)" in problems[0].message


def test_unknown_flag_set_in_a_run_is_named(repo_copy):
    file = _edit(repo_copy, f"{MATRIX}/runs.json", lambda d: d[2].update(flag_set="turbo"))
    _, problems = load_project(repo_copy)
    assert [(p.file, p.path) for p in problems] == [(str(file), "$.runs[2].flag_set")]


def test_every_error_is_reported_and_cli_fails(repo_copy, monkeypatch, capsys):
    for _, rel, mutate, _, _ in BAD_EVIDENCE:
        _edit(repo_copy, rel, mutate)
    before = {p: p.read_bytes() for p in repo_copy.evidence_dir.rglob("*.json")}
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["validate"]) == 1
    err = capsys.readouterr().err
    for _, rel, _, path, message in BAD_EVIDENCE:
        assert f"{repo_copy.root / rel}: {path}: " in err and message in err
    assert {p: p.read_bytes() for p in repo_copy.evidence_dir.rglob("*.json")} == before


def test_folder_and_id_must_agree(repo_copy):
    _edit(repo_copy, f"{MATRIX}/attempt.json", lambda d: d.update(id="other", host="rtx5080"))
    _, problems = load_project(repo_copy)
    assert {p.path for p in problems} >= {"$.attempt.id", "$.attempt.host"}


def test_unknown_evidence_file_is_named(repo_copy):
    (repo_copy.root / MATRIX / "notes.json").write_text("[]")
    _, problems = load_project(repo_copy)
    assert any(
        "unknown evidence file" in p.message and p.file.endswith("notes.json") for p in problems
    )


def test_bad_write_leaves_existing_evidence_untouched(repo_copy):
    folder = repo_copy.root / MATRIX
    before = (folder / "runs.json").read_bytes()
    with pytest.raises(ValueError):
        write_section(folder, "runs.json", [{"flag_set": "cpuoff"}])
    assert (folder / "runs.json").read_bytes() == before
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_write_section_round_trips(repo_copy):
    folder = repo_copy.root / MATRIX
    _, problems = load_project(repo_copy)
    from omniprobe.evidence.load import load_attempt

    attempt, _ = load_attempt(folder)
    write_section(folder, "runs.json", attempt.runs)
    again, problems = load_attempt(folder)
    assert problems == [] and again.runs == attempt.runs


def test_a_published_figure_of_a_model_no_host_builds_is_named(repo_copy):
    hosts = repo_copy.hosts_file
    old = '[published_figures.bfl-readme]\nmodel = "FLUX.2 [klein] 4B"'
    assert old in hosts.read_text()
    hosts.write_text(hosts.read_text().replace(old, old.replace("4B", "12B")))
    _, problems = load_project(repo_copy)
    assert [(p.path, p.message.split(";")[0]) for p in problems] == [
        ("[published_figures.bfl-readme] key 'model'",
         "'FLUX.2 [klein] 12B' is no model a host builds")]
    assert "'FLUX.2 [klein] 4B'" in problems[0].message and "'Qwen-Image-2.1'" in problems[0].message
