"""Hostile input, round 3 (issue 35), classes 1-3: evidence archives that cannot plant, leak or
overwrite. Every case is a row: what an attacker or a careless user hands `evidence unpack` or
`evidence pack`, and the words of the refusal it now gets; after each refusal nothing has landed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from omniprobe.cli import main
from omniprobe.config.project import Project
from omniprobe.errors import EnvironmentFailure, InputError, OmniprobeError, Refusal
from omniprobe.evidence import archive, unpack_journal
from omniprobe.evidence.validate import load_project
from omniprobe.limits import ArchiveLimits

from .conftest import REPO, copy_repo
from .evidence_scaffold import empty_project

TINY = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
TINY_HOST = "diffusers-tiny-cpu"
SIM = "2026-11-30T095643Z-sim-propagation"
EV = f"evidence/{TINY_HOST}/{TINY}"
ART = f"artifacts/{TINY_HOST}/{TINY}"


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _write(path: Path, members: dict[str, bytes], *, manifest: bool = True,
           special: tuple[tarfile.TarInfo, ...] = ()) -> Path:
    """An archive of `members` with a manifest listing their digests (as pack writes it), and
    `special` members (links, folders, devices) besides."""
    files = {k: v for k, v in members.items() if k != "manifest.json"}
    if manifest:
        members = {"manifest.json": json.dumps({"format": 1, "files": {
            k: hashlib.sha256(v).hexdigest() for k, v in files.items()}}).encode(), **files}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in special:
            tar.addfile(info)
    return path


def _special(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.fixture(scope="module")
def packed_once(tmp_path_factory) -> dict[str, bytes]:
    """The tiny CPU attempt packed with a runner log, from a copy of the committed project: packed
    once a module, as its members (each test gets its own dict of them)."""
    source = copy_repo(tmp_path_factory.mktemp("packed-source"))
    log = source.artifacts_dir / TINY_HOST / TINY / "tiny-cpu" / "runner-1" / "runner.log"
    log.parent.mkdir(parents=True)
    log.write_text("a runner log\n")
    out = archive.pack(source, [TINY], source.root / "e.tar.gz", artifact_max_bytes=1 << 20)
    return _members(out.path)


@pytest.fixture
def packed(packed_once, tmp_path):
    """The packed members, this test's to edit, and a machine without them to unpack onto."""
    return dict(packed_once), empty_project(Project(REPO), tmp_path / "here")


def _tree(project) -> list[str]:
    """Every path under the project's evidence/ and artifacts/ (and its staging folder)."""
    return sorted(str(p.relative_to(project.root)) for root in (
        project.evidence_dir, project.artifacts_dir, project.root / unpack_journal.STAGING)
        if root.exists() for p in root.rglob("*") if p.name != unpack_journal.LOCK)


def _tiny_attempt(edit) -> callable:
    """An edit of the packed attempt.json's content."""
    def apply(m):
        data = json.loads(m[f"{EV}/attempt.json"])
        edit(data["attempt"])
        m[f"{EV}/attempt.json"] = json.dumps(data).encode()
    return apply


def _rehost(host: str, provenance: dict | None = None):
    """The packed attempt filed under another host."""
    def apply(m):
        for name in [n for n in m if n.split("/")[1:2] == [TINY_HOST]]:
            m[name.replace(f"/{TINY_HOST}/", f"/{host}/", 1)] = m.pop(name)
        name = f"evidence/{host}/{TINY}/attempt.json"
        data = json.loads(m[name])
        data["attempt"]["host"] = host
        if provenance:
            data["attempt"]["provenance"].update(provenance)
        m[name] = json.dumps(data).encode()
    return apply


# --- class 1: unpack plants what it should refuse ----------------------------------------------


@pytest.mark.parametrize(("edit", "words"), [
    # Artifacts alone, for an attempt already here: would feed `quality` random images.
    (lambda m: [m.pop(n) for n in [n for n in m if n.startswith("evidence/")]],
     "holds no attempt's evidence"),
    (lambda m: m.update({f"{ART}/images/standin-single-2301.png": b"\x89PNG random"}),
     "only logs and timelines travel"),
    (lambda m: m.update({f"{ART}/run.sh": b"#!/bin/sh\nrm -rf ~\n"}),
     "only logs and timelines travel"),
    (lambda m: m.update({"artifacts/sim/2026-11-30T095416Z-sim-probe/server.log": b"x"}),
     "artifacts of attempts the archive does not carry"),
    # A host hosts.toml does not define, a simulated host's attempt claiming 'measured'.
    (_rehost("gpu-from-nowhere", {"host": "gpu-from-nowhere"}), "is not defined in hosts.toml"),
    (_rehost("sim", {"host": "sim"}), "must be 'simulated', not 'measured'"),
    # Temp-named, hidden or unknown files inside an attempt.
    (lambda m: m.update({f"{EV}/.payload.tmp": b"{}"}), "a hidden, temp or '..' name"),
    (lambda m: m.update({f"{EV}/.hidden.json": b"{}"}), "a hidden, temp or '..' name"),
    (lambda m: m.update({f"{ART}/tiny-cpu/.runner.log.x.tmp": b"x"}),
     "a hidden, temp or '..' name"),
    (lambda m: m.update({f"{EV}/notes.txt": b"hello"}), "is not an evidence file"),
    (lambda m: m.update({f"{EV}/sub/attempt.json": b"{}"}), "is not an evidence file"),
    (lambda m: m.update({"/etc/cron.d/evil": b"x"}), "is not under evidence/"),
    (lambda m: m.update({"evidence/x/./y/attempt.json": b"{}"}), "is not under evidence/"),
    (lambda m: m.update({"README.md": b"x"}), "is not under evidence/"),
    # An attempt that does not validate on its own.
    (_tiny_attempt(lambda a: a.update(weights="snapshot")), "builds random weights"),
    (_tiny_attempt(lambda a: a.update(id="another-id")), "expected the folder name"),
])
def test_unpack_refuses_what_it_would_plant_and_lands_nothing(packed, tmp_path, edit, words):
    members, here = packed
    edit(members)
    before = _tree(here)
    with pytest.raises((Refusal, InputError), match=words):
        archive.unpack(_write(tmp_path / "bad.tar.gz", members), here)
    assert _tree(here) == before


def test_an_attempt_id_another_host_uses_is_refused_with_validates_cross_check(
        repo_copy, packed, tmp_path):
    members, _ = packed
    _rehost("sim-emulated")(members)  # an emulated host: refused for that too, and for the id
    with pytest.raises(InputError, match="used by more than one host"):
        archive.unpack(_write(tmp_path / "dup.tar.gz", members), repo_copy)
    assert not (repo_copy.evidence_dir / "sim-emulated" / TINY).exists()


@pytest.mark.parametrize(("where", "words"), [
    ("evidence", "refusing to overwrite"),  # the attempt is committed here
    ("artifacts", "refusing to overwrite"),  # its artifacts are here, its evidence not
])
def test_unpack_never_overwrites_an_attempts_folder(packed, tmp_path, where, words):
    members, here = packed
    target = (here.evidence_dir if where == "evidence" else here.artifacts_dir) / TINY_HOST / TINY
    target.mkdir(parents=True)
    (target / "kept").write_text("mine")
    with pytest.raises(Refusal, match=words):
        archive.unpack(_write(tmp_path / "e.tar.gz", members), here)
    assert (target / "kept").read_text() == "mine"


@pytest.mark.parametrize("root", ["evidence", "artifacts"])
def test_a_host_folder_here_that_links_elsewhere_is_not_followed(packed, tmp_path, root):
    members, here = packed
    outside = tmp_path / "outside"
    outside.mkdir()
    base = here.evidence_dir if root == "evidence" else here.artifacts_dir
    base.mkdir(exist_ok=True)
    (base / TINY_HOST).symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="resolves outside"):
        archive.unpack(_write(tmp_path / "e.tar.gz", members), here)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(("special", "words"), [
    (_special(f"{EV}/link.json", tarfile.SYMTYPE, "/etc/passwd"), "is not a regular file"),
    (_special(f"{EV}/hard.json", tarfile.LNKTYPE, "/etc/passwd"), "is not a regular file"),
    (_special(f"{EV}/folder", tarfile.DIRTYPE), "is not a regular file"),
    (_special(f"{EV}/fifo.json", tarfile.FIFOTYPE), "is not a regular file"),
    (_special(f"{EV}/dev.json", tarfile.CHRTYPE), "is not a regular file"),
    (_special(f"{EV}/blk.json", tarfile.BLKTYPE), "is not a regular file"),
])
def test_every_member_type_but_a_regular_file_is_refused(packed, tmp_path, special, words):
    members, here = packed
    with pytest.raises(Refusal, match=words):
        archive.unpack(_write(tmp_path / "e.tar.gz", members, special=(special,)), here)
    assert _tree(here) == []


def _deep(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


@pytest.mark.parametrize(("manifest", "words"), [
    (None, "the archive holds no manifest"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (_deep(200_000), "nested deeper than 64 levels"),  # was a RecursionError traceback
    (b'{"format": 2, "files": {}}', "format"),
    (b'{"format": 1, "files": []}', "files"),
    (b'{"format": 1}', "required field is missing"),
    (b'{"format": 1, "files": {}, "extra": 1}', "unknown key"),
    (b'{"format": 1, "files": {"a": "not-a-digest"}}', "should match pattern"),
    (b'{"format": 1, "format": 1, "files": {}}', "appears twice"),
    (b"[]", "valid dictionary"),
])
def test_a_malformed_manifest_is_an_input_error_naming_it(packed, tmp_path, manifest, words):
    """Checked by its model, not by `assert` (which `python -O` removes)."""
    members, here = packed
    members.pop("manifest.json")
    if manifest is not None:
        members = {"manifest.json": manifest, **members}
    with pytest.raises((InputError, Refusal), match=words) as info:
        archive.unpack(_write(tmp_path / "e.tar.gz", members, manifest=False), here)
    assert "manifest.json" in str(info.value) or words == "format"
    assert _tree(here) == []


def test_a_member_given_twice_is_refused(packed, tmp_path):
    members, here = packed
    path = _write(tmp_path / "e.tar.gz", members)
    with tarfile.open(path, "r:gz") as tar:
        infos = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w:gz") as tar:
        for info, data in [*infos, infos[-1]]:
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(Refusal, match="appears twice"):
        archive.unpack(path, here)


# --- class 2: bounded, and all or nothing --------------------------------------------------------


def _gzip_of(tar_bytes: bytes, path: Path) -> Path:
    path.write_bytes(gzip.compress(tar_bytes, compresslevel=1))
    return path


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


SMALL = ArchiveLimits(archive_bytes=1 << 20, member_bytes=1 << 16, unpacked_bytes=1 << 18,
                      members=40)


@pytest.mark.parametrize(("build", "words"), [
    # A member claiming 20 GiB (the sparse one ended in MemoryError): refused by its header.
    (lambda p: _gzip_of(_header(f"{EV}/attempt.json", 20 << 30), p), "(member_bytes)"),
    # A gzip of 40 MiB of zeros behind a pax header (tarfile would read it whole itself).
    (lambda p: _gzip_of(_header("pax", 40 << 20, tarfile.XHDTYPE) + bytes(40 << 20), p),
     "(unpacked_bytes)"),
    # Members each within the limit, together over it.
    (lambda p: _write(p, {f"{ART}/{i}.log": os.urandom(60_000) for i in range(6)}),
     "(unpacked_bytes)"),
    (lambda p: _write(p, {f"{ART}/{i}.log": b"x" for i in range(50)}), "(members)"),
    (lambda p: (p.write_bytes(os.urandom(2 << 20)), p)[1], "(archive_bytes)"),
    (lambda p: (p.write_bytes(b"not a gzip at all"), p)[1], "not a readable evidence archive"),
    (lambda p: (p.write_bytes(gzip.compress(b"\x00" * 10)[:12]), p)[1],
     "not a readable evidence archive"),
    (lambda p: (os.mkfifo(p), p)[1], "is not a regular file"),  # it hung on open
    (lambda p: (p.mkdir(), p)[1], "is not a regular file"),
    (lambda p: p, "file not found"),
])
def test_an_archive_over_a_limit_or_not_an_archive_is_refused_naming_the_limit(
        repo_copy, tmp_path, build, words):
    here = empty_project(repo_copy, tmp_path / "here")
    path = build(tmp_path / "hostile.tar.gz")
    with pytest.raises((InputError, Refusal), match=words.replace("(", r"\(").replace(")", r"\)")):
        archive.unpack(path, here, SMALL)
    assert _tree(here) == []


@pytest.mark.parametrize(("build", "words"), [
    # The 3 GiB in a small gzip: a member's header claims it, refused before its bytes.
    (lambda p: _gzip_of(_header(f"{EV}/attempt.json", 3 << 30), p), "64 MiB (member_bytes)"),
    (lambda p: _gzip_of(b"".join(_header(f"{ART}/{i}.log", 0) for i in range(10_001)), p),
     "10000 files (members)"),
])
def test_the_default_limits_hold_against_a_bomb(repo_copy, tmp_path, build, words):
    here = empty_project(repo_copy, tmp_path / "here")
    with pytest.raises(Refusal, match=re.escape(words)):
        archive.unpack(build(tmp_path / "bomb.tar.gz"), here)
    assert _tree(here) == []


def _fail_on(monkeypatch, module, name: str, call: int, exc=KeyboardInterrupt):
    """`module.name` raising `exc` on its `call`-th call, as an interrupt there would."""
    real, calls = getattr(module, name), []

    def patched(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise exc()
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, patched)


@pytest.mark.parametrize(("interrupt", "said", "landed"), [
    # While validating the staged tree: nothing has moved, the staging is gone at once.
    (lambda mp: _fail_on(mp, archive, "load_project", 1), None, False),
    # Between moving the evidence and moving the artifacts: the next command completes it.
    (lambda mp: _fail_on(mp, unpack_journal.os, "rename", 2), "completed an interrupted unpack",
     True),
    # After every move, before the journal is removed: completing moves nothing more.
    (lambda mp: _fail_on(mp, unpack_journal, "discard", 1), "completed an interrupted unpack",
     True),
    # Killed while validating (SIGKILL leaves the staging folder, no journal): rolled back.
    (lambda mp: _fail_on(mp, archive, "load_project", 1, SystemExit), "rolled back", False),
    # Killed writing the journal: no journal, rolled back.
    (lambda mp: _fail_on(mp, unpack_journal, "write_text_atomic", 1, SystemExit), "rolled back",
     False),
])
def test_an_interrupted_unpack_is_completed_or_rolled_back_by_the_next_command(
        packed, tmp_path, monkeypatch, interrupt, said, landed):
    members, here = packed
    path = _write(tmp_path / "e.tar.gz", members)
    with monkeypatch.context() as mp:
        if said == "rolled back":  # a kill cleans up nothing
            mp.setattr(unpack_journal, "discard", lambda staging: None)
        interrupt(mp)
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            archive.unpack(path, here)
    if said and said.startswith("completed"):  # validate names what is half moved till then
        assert any("has not moved everything" in p.message for p in load_project(here)[1])
    recovered = archive.recover(here)
    assert (said is None and recovered == ()) or said in " ".join(recovered)
    evidence = here.evidence_dir / TINY_HOST / TINY
    log = here.artifacts_dir / TINY_HOST / TINY / "tiny-cpu" / "runner-1" / "runner.log"
    assert evidence.is_dir() == landed and log.is_file() == landed
    assert not any((here.root / unpack_journal.STAGING).glob("*/")), "no staging is left"
    assert not any((here.artifacts_dir / unpack_journal.STAGING).glob("*"))
    if not landed:  # a re-run now unpacks it whole
        assert archive.unpack(path, here).attempts == (TINY,)


def test_a_second_unpack_while_one_runs_is_refused_not_nested(packed, tmp_path):
    members, here = packed
    path = _write(tmp_path / "e.tar.gz", members)
    with unpack_journal.locked(here), pytest.raises(EnvironmentFailure, match="another"):
        archive.unpack(path, here)
    assert archive.unpack(path, here).attempts == (TINY,)
    assert not (here.evidence_dir / TINY_HOST / TINY / TINY).exists()


def test_the_staging_folder_is_one_git_ignores():
    for path in (unpack_journal.STAGING + "/x/evidence/a", "artifacts/" + unpack_journal.STAGING):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, path


# --- class 3: pack leaks and overwrites ------------------------------------------------------


SECRET_FILE = "the content of a file outside the project"


def _art(project) -> Path:
    folder = project.artifacts_dir / TINY_HOST / TINY / "tiny-cpu" / "runner-1"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _outside(tmp_path) -> Path:
    target = tmp_path / "outside" / "secret.jsonl"
    target.parent.mkdir(exist_ok=True)
    target.write_text(SECRET_FILE)
    return target


@pytest.mark.parametrize(("plant", "left_out"), [
    # A runner that replaced its own results.jsonl with a symlink.
    (lambda p, t: (_art(p) / "results.jsonl").symlink_to(_outside(t)),
     "results.jsonl (a symlink, not followed)"),
    (lambda p, t: (_art(p) / "runner.log").symlink_to(_outside(t)),
     "runner.log (a symlink, not followed)"),
    # A symlinked folder under artifacts/: not descended into.
    (lambda p, t: (_art(p) / "more").symlink_to(_outside(t).parent, target_is_directory=True),
     None),
    # The attempt's whole artifacts folder a symlink.
    (lambda p, t: (p.artifacts_dir / TINY_HOST).mkdir(parents=True)
     or (p.artifacts_dir / TINY_HOST / TINY).symlink_to(_outside(t).parent), None),
    (lambda p, t: os.mkfifo(_art(p) / "pipe.log"), "pipe.log (not a regular file)"),
    (lambda p, t: (_art(p) / "folder.log").mkdir(), None),  # a folder is walked, not read
])
def test_pack_reads_only_regular_files_inside_the_project(repo_copy, tmp_path, plant, left_out):
    plant(repo_copy, tmp_path)
    packed = archive.pack(repo_copy, [TINY], tmp_path / "e.tar.gz", artifact_max_bytes=1 << 20)
    contents = b"".join(_members(packed.path).values())
    assert SECRET_FILE.encode() not in contents
    assert left_out is None or any(x.endswith(left_out) for x in packed.left_out), packed.left_out


@pytest.mark.parametrize(("out", "words"), [
    (f"evidence/{TINY_HOST}/{TINY}/attempt.json", "inside"),  # was silently overwritten
    ("evidence/e.tar.gz", "inside"),
    (f"{unpack_journal.STAGING}/e.tar.gz", "inside"),
    ("fixtures", "not a folder"),
])
def test_pack_never_writes_inside_evidence_or_over_a_folder(repo_copy, tmp_path, out, words):
    before = {p: p.read_bytes() for p in repo_copy.evidence_dir.rglob("*") if p.is_file()}
    with pytest.raises(InputError, match=words):
        archive.pack(repo_copy, [TINY], repo_copy.root / out)
    assert {p: p.read_bytes() for p in repo_copy.evidence_dir.rglob("*") if p.is_file()} == before


def test_pack_refuses_an_attempt_that_does_not_validate(repo_copy, tmp_path):
    path = repo_copy.evidence_dir / TINY_HOST / TINY / "attempt.json"
    path.write_text(path.read_text().replace('"weights": "random"', '"weights": "snapshot"'))
    with pytest.raises(InputError, match="builds random weights"):
        archive.pack(repo_copy, [TINY], tmp_path / "e.tar.gz")
    assert not (tmp_path / "e.tar.gz").exists()


def test_pack_refuses_an_evidence_file_that_is_a_symlink(repo_copy, tmp_path):
    folder = repo_copy.evidence_dir / TINY_HOST / TINY
    (folder / "offline.json").rename(tmp_path / "offline.json")
    (folder / "offline.json").symlink_to(folder / "offline-requests.json")
    with pytest.raises(InputError):
        archive.pack(repo_copy, [TINY], tmp_path / "e.tar.gz")


@pytest.mark.parametrize("mib", ["nan", "inf", "-inf", "-1", "1e9", "four"])
def test_artifact_max_mib_outside_its_bounds_is_exit_2(repo_copy, tmp_path, capsys, mib):
    with pytest.raises(SystemExit) as info:
        main(["evidence", "pack", "--attempt", TINY, "--out", str(tmp_path / "e.tgz"),
              f"--artifact-max-mib={mib}"])
    assert info.value.code == 2 and "expected a size in MiB" in capsys.readouterr().err


def test_unpack_on_the_command_line_says_what_it_did_and_exits_as_the_table_says(
        packed, tmp_path, monkeypatch, capsys):
    members, here = packed
    monkeypatch.setenv("OMNIPROBE_ROOT", str(here.root))
    path = _write(tmp_path / "e.tar.gz", members)
    assert main(["evidence", "unpack", str(path)]) == 0
    assert f"unpacked 1 attempt(s) into {here.evidence_dir}: {TINY}" in capsys.readouterr().out
    assert main(["evidence", "unpack", str(path)]) == 0  # the same attempt again: skipped
    assert f"skipped 1 attempt(s) already here byte for byte: {TINY}" in capsys.readouterr().out
    (here.evidence_dir / "diffusers-tiny-cpu" / TINY / "attempt.json").write_text("{}\n")
    assert main(["evidence", "unpack", str(path)]) == Refusal.exit_code
    assert "attempt.json (content differs" in capsys.readouterr().err
    os.mkfifo(tmp_path / "fifo")
    assert main(["evidence", "unpack", str(tmp_path / "fifo")]) == InputError.exit_code
    assert issubclass(archive.ArchiveRefused, OmniprobeError)


@pytest.mark.parametrize("case, here, carried, differ", [
    ("byte-identical", {"attempt.json": b"a", "requests.json": b"r"},
     {"attempt.json": b"a", "requests.json": b"r"}, []),
    ("a file changed", {"attempt.json": b"a"}, {"attempt.json": b"b"},
     ["attempt.json (content differs)"]),
    ("a file only here", {"attempt.json": b"a", "init.json": b"i"}, {"attempt.json": b"a"},
     ["init.json (only here)"]),
    ("a file only in the archive", {"attempt.json": b"a"}, {"attempt.json": b"a", "x.json": b"x"},
     ["x.json (only in the archive)"]),
    ("a symlink here", {"attempt.json": None}, {"attempt.json": b"a"},
     ["attempt.json (content differs)"]),
])
def test_an_attempt_here_is_compared_file_by_file(case, here, carried, differ):
    assert archive.evidence_differences(here, carried) == differ, case


def test_an_attempt_here_without_its_artifacts_takes_them_and_skips_its_evidence(
        packed, tmp_path):
    members, here = packed
    path = _write(tmp_path / "e.tar.gz", members)
    assert archive.unpack(path, here).attempts == (TINY,)
    logs = here.artifacts_dir / TINY_HOST / TINY
    assert (logs / "tiny-cpu" / "runner-1" / "runner.log").is_file()
    shutil.rmtree(logs)
    evidence = {f: f.read_bytes() for f in (here.evidence_dir / TINY_HOST / TINY
                                            ).rglob("*") if f.is_file()}
    again = archive.unpack(path, here)
    assert (again.attempts, again.skipped) == ((), (TINY,))
    assert (logs / "tiny-cpu" / "runner-1" / "runner.log").read_text() == "a runner log\n"
    assert {f: f.read_bytes() for f in evidence} == evidence


@pytest.mark.parametrize(("case", "here", "carried", "adds"), [
    # here                                         the archive's                     only adds?
    ("the same", {"r": [1, 2]},                    {"r": [1, 2]},                    True),
    ("records appended", {"v": 5, "r": [1, 2]},    {"v": 5, "r": [1, 2, 3]},         True),
    ("a record between", {"r": [1, 3]},            {"r": [1, 2, 3]},                 True),
    ("a record gone", {"r": [1, 2]},               {"r": [1, 3]},                    False),
    ("a record changed", {"r": [{"a": 1}]},        {"r": [{"a": 2}]},                False),
    ("records reordered", {"r": [1, 2]},           {"r": [2, 1]},                    False),
    ("a key added", {"v": 5},                      {"v": 5, "w": 1},                 False),
    ("records listed anew", {"v": 5},              {"v": 5, "later_runs": [1]},      True),
    ("a figure changed", {"v": 5},                 {"v": 6},                         False),
    ("nested lists grow", {"a": {"runs": [1]}},    {"a": {"runs": [1, 2]}},          True),
])
def test_an_archive_only_adds_to_an_attempt_when_every_record_here_stays(case, here, carried,
                                                                         adds):
    assert archive.only_adds(here, carried) is adds, case


RUN = {"flag_set": "fp8", "gpu_peak_mib": 10240, "lifetimes": [{"n": 0}, {"n": 1}]}


@pytest.mark.parametrize(("case", "name", "here", "carried", "adds"), [
    # A resumed serve run: a lifetime more, its summary re-derived from the lifetimes.
    ("a lifetime more", "runs.json", {"runs": [RUN]},
     {"runs": [dict(RUN, gpu_peak_mib=12288, lifetimes=[*RUN["lifetimes"], {"n": 2}])]}, True),
    ("a run more", "runs.json", {"runs": [RUN]}, {"runs": [RUN, dict(RUN, flag_set="x")]}, True),
    ("a lifetime gone", "runs.json", {"runs": [RUN]},
     {"runs": [dict(RUN, lifetimes=RUN["lifetimes"][:1])]}, False),
    ("a lifetime changed", "runs.json", {"runs": [RUN]},
     {"runs": [dict(RUN, lifetimes=[{"n": 0}, {"n": 9}])]}, False),
    ("a run gone", "runs.json", {"runs": [RUN, dict(RUN, flag_set="x")]}, {"runs": [RUN]},
     False),
    # An offline run resumed: a runner lifetime more, its cells re-summarised; a run more.
    ("an entry re-summarised", "offline.json",
     {"offline": [{"profile": "p", "cells": [{"wall_s": 1}], "lifetimes": [{"n": 0}]}]},
     {"offline": [{"profile": "q", "lifetimes": []},
                  {"profile": "p", "cells": [{"wall_s": 2}],
                   "lifetimes": [{"n": 0}, {"n": 1}]}]}, True),
    ("an offline lifetime gone", "offline.json",
     {"offline": [{"profile": "p", "lifetimes": [{"n": 0}, {"n": 1}]}]},
     {"offline": [{"profile": "p", "lifetimes": [{"n": 1}]}]}, False),
    ("a format bump", "runs.json", {"format_version": 4, "runs": []},
     {"format_version": 5, "runs": []}, False),
])
def test_a_summary_file_may_be_re_summarised_as_what_it_lists_grows(case, name, here, carried,
                                                                     adds):
    assert archive.summary_only_adds(name, here, carried) is adds, case


def _less(members: dict[str, bytes], name: str, key: str) -> bytes:
    """`name` of the tiny attempt with its last record gone: the attempt before a resume."""
    data = json.loads(members[f"{EV}/{name}"])
    data[key] = data[key][:-1]
    return json.dumps(data, indent=2).encode()


def test_an_attempt_here_that_the_archive_only_adds_to_is_taken_and_said(packed, tmp_path,
                                                                           capsys):
    members, here = packed
    full = _write(tmp_path / "full.tar.gz", members)
    older = dict(members, **{f"{EV}/offline-requests.json": _less(
        members, "offline-requests.json", "offline_requests")})
    assert archive.unpack(_write(tmp_path / "older.tar.gz", older), here).attempts == (TINY,)
    mine = here.artifacts_dir / TINY_HOST / TINY / "mine.log"
    mine.write_text("a log only here\n")
    os.environ["OMNIPROBE_ROOT"] = str(here.root)
    try:
        assert main(["evidence", "unpack", str(full)]) == 0
    finally:
        del os.environ["OMNIPROBE_ROOT"]
    assert "added records to 1 attempt(s) already here" in capsys.readouterr().out
    folder = here.evidence_dir / TINY_HOST / TINY
    assert (folder / "offline-requests.json").read_bytes() == members[
        f"{EV}/offline-requests.json"]
    assert mine.read_text() == "a log only here\n"  # its artifacts here stay
    assert (mine.parent / "tiny-cpu" / "runner-1" / "runner.log").is_file()
    assert not any((here.root / unpack_journal.STAGING).glob("*/"))
    assert load_project(here)[1] == []


def test_an_archive_that_changes_a_record_here_is_refused_naming_the_file(packed, tmp_path):
    members, here = packed
    assert archive.unpack(_write(tmp_path / "e.tar.gz", members), here).attempts == (TINY,)
    data = json.loads(members[f"{EV}/offline-requests.json"])
    data["offline_requests"][0]["wall_s"] = 99.0
    changed = dict(members, **{f"{EV}/offline-requests.json": json.dumps(data).encode()})
    before = _tree(here)
    with pytest.raises(Refusal, match=r"offline-requests.json \(content differs: a record "
                                      r"changed or went\)"):
        archive.unpack(_write(tmp_path / "changed.tar.gz", changed), here)
    assert _tree(here) == before


def test_an_extension_interrupted_between_its_renames_is_completed(packed, tmp_path,
                                                                   monkeypatch):
    members, here = packed
    older = dict(members, **{f"{EV}/offline-requests.json": _less(
        members, "offline-requests.json", "offline_requests")})
    archive.unpack(_write(tmp_path / "older.tar.gz", older), here)
    with monkeypatch.context() as mp:
        _fail_on(mp, unpack_journal.os, "rename", 2, SystemExit)  # set aside, not moved in
        with pytest.raises(SystemExit):
            archive.unpack(_write(tmp_path / "full.tar.gz", members), here)
    assert "completed an interrupted unpack" in " ".join(archive.recover(here))
    folder = here.evidence_dir / TINY_HOST / TINY
    assert (folder / "offline-requests.json").read_bytes() == members[
        f"{EV}/offline-requests.json"]
    assert load_project(here)[1] == []
