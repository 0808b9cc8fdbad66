"""Hostile input, round 3 (issue 35), classes 5, 6, 9 and 11: paths built from the Hub's answers
or the user's, a wheel folder certified by what was hashed, evidence that knows its configs, and
clear errors where tracebacks were. Each case is a row."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from omniprobe.cli import main
from omniprobe.config.hosts import load_hosts
from omniprobe.env.fetch_model import FetchFailed, fetch_model
from omniprobe.env.wheels import (
    WheelDownloadFailed,
    pip_command,
    read_pins,
    wheel_folder_problems,
)
from omniprobe.errors import InputError
from omniprobe.evidence.validate import load_project

from .conftest import REPO

PREFIX = "790c9263"
GOOD = PREFIX + "a" * 32


# --- class 5: revisions from the user or the Hub -----------------------------------------------


def _fetch(tmp_path, monkeypatch, *, revision=None, commits=(), folder=None):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    asked = []

    def download(repo, rev, cache):
        asked.append(rev)
        return str(folder or cache / "models--Qwen--Qwen-Image-2.1" / "snapshots" / rev)
    result = fetch_model(load_hosts(REPO / "hosts.toml"), revision=revision,
                         list_commits=lambda repo: list(commits), download=download,
                         echo=lambda line: None)
    return result, asked


@pytest.mark.parametrize(("revision", "words"), [
    (f"{PREFIX}/../../../../tmp/owned", "expected a full commit id"),  # the example
    (PREFIX, "expected a full commit id"),  # the pin's prefix is no commit
    (GOOD.upper(), "expected a full commit id"),
    (GOOD + "0", "expected a full commit id"),
    (GOOD[:-1] + "/", "expected a full commit id"),
    ("main", "expected a full commit id"),
    ("f" * 40, "does not start with the pinned 790c9263"),
])
def test_a_revision_given_is_a_full_commit_of_the_pin(tmp_path, monkeypatch, revision, words):
    with pytest.raises(InputError, match=words):
        _fetch(tmp_path, monkeypatch, revision=revision)
    assert not (tmp_path / "hub").exists()


@pytest.mark.parametrize("answer", [
    [f"{PREFIX}/../../../escape"],  # starts with the prefix: startswith took it
    [GOOD, f"{PREFIX}/../x"],
    [PREFIX + "A" * 32],
    [PREFIX],
    [GOOD, 12345],
])
def test_the_hubs_commit_list_is_checked_like_a_revision_given(tmp_path, monkeypatch, answer):
    with pytest.raises(FetchFailed, match="not 40 hex digits"):
        _fetch(tmp_path, monkeypatch, commits=answer)


def test_a_download_that_names_a_folder_outside_the_cache_is_refused(tmp_path, monkeypatch):
    with pytest.raises(FetchFailed, match="outside the hub cache"):
        _fetch(tmp_path, monkeypatch, revision=GOOD, folder=tmp_path / "elsewhere")
    folder, asked = _fetch(tmp_path, monkeypatch, commits=[GOOD, "1" * 40])
    assert asked == [GOOD] and folder.is_relative_to(tmp_path / "hub")


@pytest.mark.parametrize(("snapshot", "words"), [
    ("Qwen/Qwen-Image-2.1@../../../tmp", "revision must be a commit or its prefix"),
    ("Qwen/Qwen-Image-2.1@790C9263", "revision must be a commit or its prefix"),
    ("Qwen/Qwen-Image-2.1@790c926", "revision must be a commit or its prefix"),
    ("Qwen/../../etc@790c9263", "repo must be 'owner/name'"),
    ("/abs/path@790c9263", "repo must be 'owner/name'"),
])
def test_the_pin_in_hosts_toml_is_a_hex_prefix_of_a_safe_repo(tmp_path, snapshot, words):
    text = (REPO / "hosts.toml").read_text()
    (tmp_path / "hosts.toml").write_text(text.replace('"Qwen/Qwen-Image-2.1@790c9263"',
                                                      json.dumps(snapshot), 1))
    with pytest.raises(InputError, match=words):
        load_hosts(tmp_path / "hosts.toml")


# --- class 6: wheels --check hashes every file pip could install ---------------------------------


WHEEL = "a_pkg-1.0-py3-none-any.whl"


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "whl"
    folder.mkdir()
    (folder / WHEEL).write_bytes(b"the listed wheel")
    listed = tmp_path / "list.txt"
    listed.write_text(f"a-pkg==1.0 --hash=sha256:{hashlib.sha256(b'the listed wheel').hexdigest()}\n")
    return read_pins(listed), folder


@pytest.mark.parametrize(("plant", "words"), [
    (lambda f: None, None),  # the listed wheel alone: certified
    # The example: another platform tag of the pinned name and version, unhashed before.
    (lambda f: (f / "a_pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"evil"),
     "sha256 differs"),
    (lambda f: (f / "A.Pkg-1.0-py2.py3-none-any.whl").write_bytes(b"evil"), "sha256 differs"),
    (lambda f: (f / "a_pkg-1.0.tar.gz").write_bytes(b"sdist"), "not in the list"),
    (lambda f: (f / "b-2.0-py3-none-any.whl").write_bytes(b"other"), "not in the list"),
    (lambda f: (f / "z-1.0-py3-none-any.whl").symlink_to("/dev/zero"), "not a regular file"),
    (lambda f: os.mkfifo(f / "c-1.0-py3-none-any.whl"), "not a regular file"),
    (lambda f: (f / "d-1.0-py3-none-any.whl").mkdir(), "not a regular file"),
    (lambda f: ((f / WHEEL).unlink(), (f / WHEEL).symlink_to(f.parent / "list.txt")),
     "not a regular file"),
])
def test_wheels_check_refuses_every_file_it_cannot_match_to_a_listed_hash(wheels, plant, words):
    pins, folder = wheels
    plant(folder)
    problems = wheel_folder_problems(pins, folder)
    assert (problems == []) if words is None else any(words in p for p in problems), problems


def test_the_download_finds_a_pip_where_its_python_has_none(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\nexit 1\n")  # a uv venv's python: `-m pip` fails
    python.chmod(0o755)
    assert pip_command(str(python), which=lambda name: f"/usr/bin/{name}") == ["/usr/bin/pip3"]
    beside = python.parent / "pip"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert pip_command(str(python), which=lambda name: None) == [str(beside)]
    beside.unlink()
    with pytest.raises(WheelDownloadFailed, match="no pip to download with.*uv pip install"):
        pip_command(str(python), which=lambda name: None)


# --- class 9: evidence knows its configs -------------------------------------------------------


TINY = "evidence/diffusers-tiny-cpu/2026-12-01T094615Z-diffusers-tiny-cpu-offline"
CONFIGS = "models/qwen-image-2.1/tiny"


def _layers(root: Path, edit) -> None:
    path = root / CONFIGS / "transformer.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _served(root: Path, **update) -> None:
    path = root / TINY / "attempt.json"
    data = json.loads(path.read_text())
    data["attempt"]["environment"]["served"].update(update)
    path.write_text(json.dumps(data))


def _keep(root: Path) -> None:
    """The attempt's own configs kept beside it, as they were when it ran."""
    kept = root / "artifacts" / TINY.removeprefix("evidence/") / "configs"
    kept.mkdir(parents=True)
    for file in (REPO / CONFIGS).iterdir():
        (kept / file.name).write_bytes(file.read_bytes())


def _num_layers(data):
    data["config"]["num_layers"] = data["config"]["num_layers"] + 1


@pytest.mark.parametrize(("change", "words"), [
    (lambda root: None, None),
    # The example: the DiT's num_layers changed under a committed attempt.
    (lambda root: _layers(root, _num_layers), "transformer.json has sha256"),
    (lambda root: (root / CONFIGS / "vae.json").unlink(), "vae.json is missing"),
    (lambda root: (root / CONFIGS / "processor.json").write_text(
        (REPO / CONFIGS / "processor.json").read_text() + " "), "processor.json has sha256"),
    (lambda root: _served(root, configs="../../etc"), "climbs out"),
    (lambda root: _served(root, config_digests={"../../passwd": "0" * 64}), "unknown component"),
    # A git-ignored copy under artifacts/ excuses nothing: the report reads the committed file.
    (lambda root: (_layers(root, _num_layers), _keep(root)), "transformer.json has sha256"),
    (lambda root: (_keep(root), (root / CONFIGS / "vae.json").unlink()), "vae.json is missing"),
])
def test_validate_holds_each_attempts_config_digests_to_the_committed_configs(
        repo_copy, change, words):
    change(repo_copy.root)
    _, problems = load_project(repo_copy)
    if words is None:
        assert problems == []
    else:
        assert any(words in p.message and p.file.endswith("attempt.json") for p in problems), \
            problems
        assert any("2026-12-01T094615Z-diffusers-tiny-cpu-offline" in str(p) for p in problems)


# --- class 11: clear errors, exit codes as the README's table says --------------------------


@pytest.mark.parametrize("version", [99, -1, "4", 4.0, None, [4]])
def test_evidence_upgrade_check_names_a_version_it_cannot_read_with_exit_2(
        repo_copy, monkeypatch, capsys, version):
    path = repo_copy.root / TINY / "offline.json"
    data = json.loads(path.read_text())
    data["format_version"] = version
    path.write_text(json.dumps(data))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["evidence", "upgrade", "--check"]) == InputError.exit_code
    err = capsys.readouterr().err
    assert f"{path}: $.format_version: format version" in err and "Traceback" not in err
