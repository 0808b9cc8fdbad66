"""Hostile input, round 4 (issue 53): a calibration that would read the wrong thing as the real run
(another host's attempt, a simulated copy, a figure that is no count) is refused by `validate`,
naming hosts.toml and the [calibrations.X] key, before the report reads "agrees" or "disagrees"."""

from __future__ import annotations

import json
import shutil

import pytest

from omniprobe.cli import main
from omniprobe.errors import InputError
from omniprobe.evidence.validate import load_project

SEALED = "2026-10-07T170729Z-q3-4r"
COPY = "2026-12-01T000000Z-q3-4r-copy"
FIGURES = "evidence/rtx5080/seed-5080-1-init-matrix/figures.json"


def _hosts(old: str, new: str):
    def change(root):
        path = root / "hosts.toml"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
    return change


def _attempt(root, where: str, folder: str, **changes):
    path = root / "evidence" / where / folder / "attempt.json"
    data = json.loads(path.read_text())
    data["attempt"].update(changes)
    path.write_text(json.dumps(data, indent=2))


def _copied(root, host: str, provenance: dict):
    """The sealed baseline copied under `host` as a new attempt of that host."""
    shutil.copytree(root / "evidence/rtx3090" / SEALED, root / "evidence" / host / COPY)
    _attempt(root, host, COPY, id=COPY, host=host, provenance=provenance)
    _hosts(f'baseline_attempt = "{SEALED}"', f'baseline_attempt = "{COPY}"')(root)


SIMULATED = {"kind": "simulated", "tool_version": "0.1.0", "command": ["omniprobe"],
             "started_at": "2026-12-01T00:00:00Z", "model": "omniprobe.sim capacity model"}


def _fraction(root):
    path = root / FIGURES
    data = json.loads(path.read_text())
    next(f for f in data["figures"] if f["key"] == "diffusers_ceiling_references")["value"] = 2.5
    path.write_text(json.dumps(data, indent=2))


def _renamed_id(root):
    _attempt(root, "rtx3090", SEALED, id="2026-10-07T170729Z-q3-4s")
    _hosts(f'baseline_attempt = "{SEALED}"', 'baseline_attempt = "2026-10-07T170729Z-q3-4s"')(root)


BASELINE = "[calibrations.q3-4r] key 'baseline_attempt'"
FIGURE = "[calibrations.b2g] key 'figure'"
CASES = [
    ("a baseline_attempt that does not exist",
     _hosts(f'baseline_attempt = "{SEALED}"', 'baseline_attempt = "2026-10-07T170729Z-q3-9r"'),
     BASELINE, "no attempt '2026-10-07T170729Z-q3-9r' under evidence/ (host 'rtx3090''s "
               f"baselines: {SEALED})"),
    ("another host's attempt",
     _hosts(f'baseline_attempt = "{SEALED}"', 'baseline_attempt = "seed-5080-1-init-matrix"'),
     BASELINE, "is host 'rtx5080''s attempt: the real run is the emulated card's, host "
               "'rtx3090''s"),
    ("another host's attempt holds no walls",
     _hosts(f'baseline_attempt = "{SEALED}"', 'baseline_attempt = "seed-5080-1-init-matrix"'),
     BASELINE, "holds no baseline walls (baseline.json)"),
    ("a simulated attempt holding a copy of the sealed baseline",
     lambda root: _copied(root, "sim", SIMULATED), BASELINE, "is simulated: the real run is read "
                                                            "from a real card's attempt"),
    ("a simulated copy filed under the card's own host",
     lambda root: _copied(root, "rtx3090", SIMULATED), BASELINE, "is simulated"),
    ("a sealed baseline whose own id names another folder", _renamed_id,
     BASELINE, "says it is '2026-10-07T170729Z-q3-4s': a sealed baseline's id names its own "
               "folder"),
    ("a figure the card's evidence lacks",
     _hosts('figure = "diffusers_ceiling_references"', 'figure = "diffusers_floor_references"'),
     FIGURE, "'diffusers_floor_references' is not a figure of host 'rtx5080''s evidence, whose "
             "real run it reads (its figures: bf16_weights, diffusers_ceiling_references)"),
    ("another card's figure",
     _hosts('figure = "diffusers_ceiling_references"', 'figure = "denoise_step_latency"'),
     FIGURE, "'denoise_step_latency' is not a figure of host 'rtx5080''s evidence"),
    ("32 GB of weights read as a reference count",
     _hosts('figure = "diffusers_ceiling_references"', 'figure = "bf16_weights"'),
     FIGURE, "is in 'GiB': expected a count of references"),
    ("a step latency (1.83 s) read as a reference count",
     _hosts(f'baseline_attempt = "{SEALED}"', 'figure = "denoise_step_latency"'),
     "[calibrations.q3-4r] key 'figure'", "is in 's': expected a count of references"),
    ("a fractional count", _fraction, FIGURE, "is 2.5: expected a whole number of references"),
]


@pytest.mark.parametrize(("case", "change", "where", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_calibration_reads_only_the_cards_real_run_as_a_count(repo_copy, case, change, where,
                                                                words):
    change(repo_copy.root)
    _, problems = load_project(repo_copy)
    said = f"{repo_copy.hosts_file}: {where}: "
    named = [str(p) for p in problems]
    assert any(p.startswith(said) and words in p for p in named), named


def test_the_committed_calibrations_read_their_real_runs(repo):
    _, problems = load_project(repo)
    assert not [p for p in problems if "[calibrations." in p.path], problems


@pytest.mark.parametrize("case", ["a fractional count", "a simulated attempt holding a copy of "
                                                        "the sealed baseline"])
def test_a_calibration_refused_renders_no_agreement(repo_copy, monkeypatch, capsys, case):
    report = repo_copy.report_file.read_bytes()
    next(c for c in CASES if c[0] == case)[1](repo_copy.root)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["report"]) == InputError.exit_code
    err = " ".join(capsys.readouterr().err.split())
    assert "[calibrations." in err and "Traceback" not in err
    assert repo_copy.report_file.read_bytes() == report


@pytest.mark.parametrize("gone", ["evidence/rtx5080", "evidence/rtx5080/seed-5080-1-init-matrix/"
                                  "figures.json", f"evidence/rtx3090/{SEALED}"])
def test_a_card_without_its_figures_or_baseline_yet_reads_nothing_and_is_not_refused(repo_copy,
                                                                                       gone):
    path = repo_copy.root / gone
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    _, problems = load_project(repo_copy)
    assert not [p for p in problems if "[calibrations." in p.path], problems
