"""`omniprobe evidence pack --new` (issue 34, item 7): from a clone, only the attempts git does
not have yet, so unpacking at home meets no committed attempt it must skip or refuse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from omniprobe.cli import main
from omniprobe.evidence import archive_read as archive
from omniprobe.evidence.uncommitted import NotAGitClone, attempts_of, status_paths

TINY = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
EMULATED = "rtx5080-on-h200-diffusers"


@pytest.mark.parametrize("case, porcelain, paths", [
    ("untracked", b"?? evidence/h/a/attempt.json\0", ["evidence/h/a/attempt.json"]),
    ("modified", b" M evidence/h/a/x.json\0M  evidence/h/b/y.json\0",
     ["evidence/h/a/x.json", "evidence/h/b/y.json"]),
    ("a rename: its new path, not its old", b"R  evidence/h/new/x.json\0evidence/h/old/x.json\0",
     ["evidence/h/new/x.json"]),
    ("nothing", b"", []),
])
def test_git_status_paths(case, porcelain, paths):
    assert status_paths(porcelain) == paths, case


@pytest.mark.parametrize("case, paths, attempts", [
    ("a file of an attempt", ["evidence/h/a/attempt.json"], {("h", "a")}),
    ("a deeper file", ["evidence/h/a/images/x.png"], {("h", "a")}),
    ("a file beside the attempts", ["evidence/h/README"], set()),
    ("outside evidence/", ["hosts.toml"], set()),
])
def test_attempts_of_the_paths(tmp_path, case, paths, attempts):
    assert attempts_of(paths, tmp_path, tmp_path / "evidence") == attempts, case


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_pack_new_packs_only_what_git_does_not_have(repo_copy, monkeypatch, tmp_path, capsys):
    root = repo_copy.root
    monkeypatch.setenv("OMNIPROBE_ROOT", str(root))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "rm", "-r", "-q", "--cached", f"evidence/diffusers-tiny-cpu/{TINY}")
    git(root, "commit", "-q", "-m", "the clone")
    out = tmp_path / "new.tar.gz"
    assert main(["evidence", "pack", "--host", "diffusers-tiny-cpu", "--host", EMULATED,
                 "--new", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    committed = len([d for d in (root / "evidence" / EMULATED).iterdir() if d.is_dir()])
    assert f"left out {committed} attempt(s) git already has" in said
    assert "packed 1 attempt(s)" in said
    members = archive.read_members(out, archive.LIMITS)
    assert {archive.member_path(n, out).attempt_key for n in members
            if n != archive.MANIFEST} == {("diffusers-tiny-cpu", TINY)}


def test_pack_new_outside_a_clone_is_refused(repo_copy, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(repo_copy.root.parent))
    assert main(["evidence", "pack", "--host", EMULATED, "--new", "--out",
                 str(tmp_path / "x.tar.gz")]) == NotAGitClone.exit_code
    assert "is not a git clone" in capsys.readouterr().err


@pytest.mark.e2e
def test_the_readmes_round_trip_as_written(repo_copy, tmp_path, monkeypatch, capsys, port):
    """Issue 34 item 7, the README's words in order: the GPU machine works from a clone with
    committed attempts; it probes, packs --new, and home unpacks; it resumes the same attempt,
    packs --new again, and home takes the records it added."""
    import shutil

    from omniprobe.config.project import Project

    from .conftest import in_process, probe_argv

    gpu = repo_copy
    git(gpu.root, "init", "-q")
    git(gpu.root, "add", "-A")
    git(gpu.root, "commit", "-q", "-m", "the clone")
    home = Project(tmp_path / "home")
    shutil.copytree(gpu.root, home.root, ignore=shutil.ignore_patterns(".git"))

    def at(project, *argv):
        monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
        code = main(list(argv))
        return code, capsys.readouterr().out

    def probe(*extra):
        monkeypatch.setenv("OMNIPROBE_ROOT", str(gpu.root))
        return in_process(gpu, probe_argv("probe-serve", port, "--flag-set", "fp8", *extra))

    assert probe("--fixture", "sim-t2i")[0] == 0
    out = tmp_path / "evidence.tar.gz"
    code, said = at(gpu, "evidence", "pack", "--host", "sim", "--new", "--out", str(out))
    assert code == 0 and "packed 1 attempt(s)" in said, said
    code, said = at(home, "evidence", "unpack", str(out))
    assert code == 0 and "unpacked 1 attempt(s)" in said, said
    assert probe("--fixture", "sim-t2i", "--fixture", "sim-single")[0] == 0  # a resume
    code, said = at(gpu, "evidence", "pack", "--host", "sim", "--new", "--out", str(out))
    assert code == 0 and "packed 1 attempt(s)" in said, said
    code, said = at(home, "evidence", "unpack", str(out))
    assert code == 0 and "added records to 1 attempt(s) already here" in said, said
    assert at(home, "validate")[0] == 0
    from .conftest import REPO

    committed = {p.name for p in (REPO / "evidence" / "sim").iterdir()}
    [new] = [p for p in (home.evidence_dir / "sim").iterdir() if p.name not in committed]
    mine, theirs = new / "requests.json", gpu.evidence_dir / "sim" / new.name / "requests.json"
    assert mine.read_bytes() == theirs.read_bytes()
