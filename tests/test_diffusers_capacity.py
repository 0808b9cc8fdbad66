"""The Diffusers capacity rules as tables: the smallest swept cap ("≤ / M–N / >"), the KV cache's
arithmetic, the card's capacity-only verdict; evidence packs and the wheel list."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from omniprobe.analysis.diffusers_capacity import (
    CapacityCell,
    HostRam,
    KvMeasure,
    MinCap,
    ProfileRun,
    card_capacity,
    kv_per_reference,
    min_cap,
    min_caps,
)
from omniprobe.config.pinned_cache import architecture_bytes_per_token
from omniprobe.config.project import Project
from omniprobe.env.wheels import download_command, read_pins, wheel_folder_problems
from omniprobe.errors import InputError, Refusal
from omniprobe.evidence import archive
from omniprobe.evidence.upgrade import upgrade_evidence

from .evidence_scaffold import empty_project

GIB = 1024  # MiB


@pytest.mark.parametrize(("swept", "text"), [
    # cap (GiB) -> fits                       the smallest card it needs
    ({16: True, 24: True}, "≤ 16"),
    ({16: False, 24: True}, "16–24"),
    ({16: False, 24: False}, "> 24"),
    ({16: False, 20: False, 24: True, 32: True}, "20–24"),
    ({16: True}, "≤ 16"),
    ({24: False}, "> 24"),
    ({16: True, 20: False, 24: True}, "≤ 16"),  # read at the smallest cap that fit
    ({}, "not run"),
])
def test_the_smallest_swept_cap_is_as_precise_as_the_sweep(swept, text):
    assert min_cap({gib * GIB: fits for gib, fits in swept.items()}).text() == text


def test_a_min_cap_keeps_both_bounds():
    assert min_cap({16 * GIB: False, 24 * GIB: True}) == MinCap(24 * GIB, 16 * GIB)


@pytest.mark.parametrize(("transformer", "dtype", "bytes_per_token"), [
    # blocks x (K, V) x heads x head dim x bytes: Qwen-Image-2.1's DiT (diffusers' defaults)
    ({"num_layers": 32, "num_attention_heads": 32, "attention_head_dim": 128}, "bfloat16", 524288),
    # the tiny one of tests/test_diffusers.py
    ({"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 32}, "bfloat16", 512),
    ({"num_layers": 32, "num_attention_heads": 32, "attention_head_dim": 128}, "float32", 1048576),
])
def test_the_architecture_implies_the_cache_per_token(transformer, dtype, bytes_per_token):
    assert architecture_bytes_per_token(transformer, dtype) == bytes_per_token


def kv(refs: int, tokens: int, text: int | None, profile: str = "p", res: int = 1024
       ) -> KvMeasure:
    return KvMeasure(profile, f"f{refs}", refs, res, tokens * 524288, tokens, text)


@pytest.mark.parametrize(("measures", "per_reference_tokens"), [
    # Each fixture its own prompt: a 20-token prompt beside one 1024² reference, 57 beside four.
    # Against the text-only fixture's 31 tokens the naive share would read 4,143 and 4,160.
    ([kv(0, 31, 31), kv(1, 4169, 20), kv(4, 16653, 57)], [(1, 4149), (4, 4149)]),
    # Prompts of one length: the naive and the right share agree.
    ([kv(0, 31, 31), kv(2, 8329, 31)], [(2, 4149)]),
    # A record that does not count its prompt's tokens gives no share, never a guess.
    ([kv(0, 31, None), kv(1, 4174, None)], []),
    ([kv(1, 4174, None), kv(1, 4169, 20, profile="q")], [(1, 4149)]),
])
def test_the_cache_per_reference_is_each_requests_prefix_less_its_own_prompt(
        measures, per_reference_tokens):
    per_ref = kv_per_reference(measures)
    assert [(p.reference_count, p.tokens_per_reference) for p in per_ref] == per_reference_tokens
    assert all(p.bytes_per_reference == p.tokens_per_reference * 524288 for p in per_ref)


def run(profile: str, cap_gib: int, cells: dict[int, tuple[str, float, bool]]) -> ProfileRun:
    return ProfileRun("h", cap_gib * GIB, profile, "a", tuple(
        CapacityCell(n, f"f{n}", outcome, outcome == "ok" and not breach, peak, peak, None,
                     breach) for n, (outcome, peak, breach) in cells.items()), "ready")


@pytest.mark.parametrize(("runs", "verdict", "fits"), [
    ([run("leaf", 16, {4: ("oom", 15488, False)}), run("nokv", 16, {4: ("ok", 11958, False)})],
     "fits", ["nokv"]),
    ([run("leaf", 16, {4: ("oom", 15488, False)})], "does not fit", []),
    # A run over the cap is no fit, whatever its outcome.
    ([run("expandable", 16, {4: ("ok", 15728, True)})], "does not fit", []),
    ([run("leaf", 16, {2: ("ok", 15016, False)})], "not measured", []),
    # Another cap's runs say nothing of this card.
    ([run("leaf", 24, {4: ("ok", 22350, False)})], "not measured", []),
])
def test_the_cards_verdict_is_capacity_only_and_follows_the_evidence(runs, verdict, fits):
    capacity = card_capacity("h", runs, 16 * GIB, 4)
    assert capacity.verdict == verdict and [f.profile for f in capacity.fits] == fits


def held(run_: ProfileRun, cap_gib: int | None, peak_gib: float | None,
         killed: bool = False, init: str = "ready", pinned_gib: float | None = None,
         build_path: str | None = "random-streamed") -> ProfileRun:
    return replace(run_, host_ram=HostRam(cap_gib and cap_gib * GIB,
                                          peak_gib and peak_gib * GIB, killed,
                                          pinned_gib and pinned_gib * GIB),
                   init_outcome=init, build_path=build_path)


FITS_4 = {4: ("ok", 11958, False)}


@pytest.mark.parametrize(("runs", "host_ram_gib", "verdict", "fits"), [
    # The seed's 5080 host has 30 GiB. The H200's uncapped runner held 42 GiB: the GPU fit says
    # nothing of the card's host.
    ([held(run("nokv", 16, FITS_4), None, 42.3)], 30, "fits the GPU only", []),
    # Under a 30 GiB cgroup, or holding no more than 30 GiB, the fit is the card's.
    ([held(run("nokv", 16, FITS_4), 30, 29.9)], 30, "fits", ["nokv"]),
    ([held(run("nokv", 16, FITS_4), None, 28.0)], 30, "fits", ["nokv"]),
    # A cap larger than the host's says nothing of it either.
    ([held(run("nokv", 16, FITS_4), 32, 31.0)], 30, "fits the GPU only", []),
    # Killed at the host's RAM while building: it fit nothing, and that is an answer.
    ([held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error")], 30,
     "does not fit", []),
    ([held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error"),
      held(run("nokv", 16, FITS_4), None, 42.3)], 30, "fits the GPU only", []),
    # Killed under the random build that held the whole bf16 model at once (no build path on
    # record): the harness's failure, which asks nothing of the card.
    ([held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error", build_path=None)], 30,
     "not measured", []),
    # Where the host's RAM is not stated, the GPU's fit is the verdict (the report says so).
    ([held(run("nokv", 16, FITS_4), None, 42.3)], None, "fits", ["nokv"]),
    # Both must fit: the GPU pool and the host footprint (issue 32). Pinned memory within the
    # RAM fits; a host that fits does not make a GPU OOM fit.
    ([held(run("leaf", 16, FITS_4), None, 29.0, pinned_gib=24.0)], 30, "fits", ["leaf"]),
    ([held(run("leaf", 16, {4: ("oom", 15488, False)}), None, 20.0)], 30, "does not fit", []),
    # Pinned memory must fit in RAM: over it, no swap or zram could take it.
    ([held(run("leaf", 16, FITS_4), None, None, pinned_gib=31.0)], 30, "fits the GPU only", []),
    ([held(run("leaf", 16, FITS_4), 30, None, pinned_gib=31.0)], 30, "fits the GPU only", []),
])
def test_a_card_whose_host_ram_is_stated_fits_only_within_it(runs, host_ram_gib, verdict, fits):
    capacity = card_capacity("h", runs, 16 * GIB, 4, host_ram_gib and host_ram_gib * GIB)
    assert capacity.verdict == verdict and [f.profile for f in capacity.fits] == fits
    # Each GPU fit says which side of the host's RAM its footprint fell.
    for fit in (*capacity.fits, *capacity.gpu_only):
        assert (fit.host is None) == (host_ram_gib is None)
        assert fit.host is None or fit.host.fits is (fit in capacity.fits)


# --- evidence packs ----------------------------------------------------------------------------


def test_an_attempt_packed_elsewhere_unpacks_here_whole_and_never_over_itself(repo_copy,
                                                                              tmp_path):
    ev, art = repo_copy.evidence_dir, repo_copy.root / "artifacts"
    attempt = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
    log = art / "diffusers-tiny-cpu" / attempt / "tiny-cpu" / "runner-1" / "runner.log"
    log.parent.mkdir(parents=True)
    log.write_text("a runner log\n")
    packed = archive.pack(repo_copy, [attempt], tmp_path / "e.tar.gz", artifact_max_bytes=1 << 20)
    assert packed.files > 3 and packed.left_out == ()
    elsewhere = empty_project(repo_copy, tmp_path / "elsewhere")
    assert archive.unpack(packed.path, elsewhere).attempts == (attempt,)
    here = ev / "diffusers-tiny-cpu" / attempt
    for file in here.iterdir():
        assert (elsewhere.evidence_dir / "diffusers-tiny-cpu" / attempt / file.name
                ).read_bytes() == file.read_bytes()
    assert (elsewhere.artifacts_dir / log.relative_to(art)).read_text() == "a runner log\n"
    # The same archive again (issue 34, item 7): the attempt is here byte for byte, so skipped.
    again = archive.unpack(packed.path, elsewhere)
    assert (again.attempts, again.skipped) == ((), (attempt,))
    changed = elsewhere.evidence_dir / "diffusers-tiny-cpu" / attempt / "attempt.json"
    changed.write_bytes(changed.read_bytes() + b"\n")
    with pytest.raises(Refusal, match=r"refusing to overwrite .*attempt\.json \(content differs\)"):
        archive.unpack(packed.path, elsewhere)


def test_an_archive_packed_before_a_format_bump_unpacks_and_upgrades_to_the_committed_file(
        repo_copy, tmp_path):
    # The attempt as another machine held it at format version 3 (the real file, before the bump).
    attempt = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
    committed = repo_copy.evidence_dir / "diffusers-tiny-cpu" / attempt / "offline-requests.json"
    current = committed.read_text()
    old = (Path(__file__).parent / "data" / "migrations" / "v3" / "offline-requests.json").read_text()
    committed.write_text(old)
    packed = archive.pack(repo_copy, [attempt], tmp_path / "e.tgz")
    target = empty_project(repo_copy, tmp_path / "t").evidence_dir
    assert archive.unpack(packed.path, Project(target.parent)).attempts == (attempt,)
    landed = target / "diffusers-tiny-cpu" / attempt / "offline-requests.json"
    assert landed.read_text() == old  # unpack moves the bytes; the loader migrates them
    assert [(p.name, v) for p, v in upgrade_evidence(target)] == [("offline-requests.json", 3)]
    assert landed.read_text() == current


def _rewrite(path, edit) -> None:
    """The archive with one member's bytes edited, the manifest left as it was."""
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    edit(members)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: m.update({k: v + b" " for k, v in m.items() if k.endswith("attempt.json")}),
     "sha256 differs from the manifest"),
    (lambda m: m.update({"evidence/x/../../escape/a.json": b"{}"}), "the archive's files differ"),
    (lambda m: m.update({"manifest.json": json.dumps({"format": 1, "files": {
        **json.loads(m["manifest.json"])["files"],
        "../escape/a/b": hashlib.sha256(b"x").hexdigest()}}).encode(), "../escape/a/b": b"x"}),
     "is not under evidence/"),
])
def test_a_tampered_archive_writes_nothing(repo_copy, tmp_path, edit, words):
    attempt = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
    packed = archive.pack(repo_copy, [attempt], tmp_path / "e.tgz")
    _rewrite(packed.path, edit)
    target = empty_project(repo_copy, tmp_path / "t").evidence_dir
    with pytest.raises((Refusal, InputError), match=words):
        archive.unpack(packed.path, Project(target.parent))
    assert list(target.iterdir()) == []


def test_an_archive_whose_attempt_does_not_validate_is_refused(repo_copy, tmp_path):
    attempt = "2026-12-01T094615Z-diffusers-tiny-cpu-offline"
    packed = archive.pack(repo_copy, [attempt], tmp_path / "e.tgz")

    def bad(members):
        name = next(k for k in members if k.endswith("offline-requests.json"))
        data = json.loads(members[name])
        data["offline_requests"][0]["structure"] = "sound"
        members[name] = json.dumps(data).encode()
        files = json.loads(members["manifest.json"])
        files["files"][name] = hashlib.sha256(members[name]).hexdigest()
        members["manifest.json"] = json.dumps(files).encode()
    _rewrite(packed.path, bad)
    target = empty_project(repo_copy, tmp_path / "t").evidence_dir
    with pytest.raises(InputError) as info:
        archive.unpack(packed.path, Project(target.parent))
    assert "random-weight record claims no output structure" in str(info.value.problems)
    assert list(target.iterdir()) == []


# --- the wheel list ----------------------------------------------------------------------------


def test_the_committed_wheel_list_pins_each_package_once_with_its_hash(repo):
    pins = read_pins(repo.root / "wheels" / "h200.txt")
    names = {p.name for p in pins}
    assert {"diffusers", "torchao", "pydantic", "pydantic-core"} <= names
    assert all(len(p.sha256) == 64 for p in pins)
    command = download_command(repo.root / "wheels" / "h200.txt", repo.root / ".whl")
    assert "--require-hashes" in command and "--no-deps" in command
    assert command[command.index("--python-version") + 1] == "3.12"


@pytest.mark.parametrize(("line", "words"), [
    ("diffusers>=0.42", "expected 'name==version --hash=sha256:<64 hex>'"),
    ("diffusers==0.42.1", "expected 'name==version"),
    ("diffusers==0.42.1 --hash=sha256:abc", "expected 'name==version"),
])
def test_a_wheel_list_line_without_an_exact_pin_and_hash_is_refused(tmp_path, line, words):
    path = tmp_path / "list.txt"
    path.write_text(f"# a comment\n{line}\n")
    with pytest.raises(InputError, match=words):
        read_pins(path)


def test_a_folder_of_wheels_is_checked_against_the_list(tmp_path):
    good, other = tmp_path / "a_pkg-1.0-py3-none-any.whl", tmp_path / "b-2.0-py3-none-any.whl"
    good.write_bytes(b"wheel")
    other.write_bytes(b"other")
    (tmp_path / "list.txt").write_text(
        f"a-pkg==1.0 --hash=sha256:{hashlib.sha256(b'wheel').hexdigest()}\n"
        f"c==3.0 --hash=sha256:{'0' * 64}\n")
    problems = wheel_folder_problems(read_pins(tmp_path / "list.txt"), tmp_path)
    assert problems == [f"c==3.0: no wheel in {tmp_path}", f"{other.name}: not in the list"]
    good.write_bytes(b"tampered")
    assert any("sha256 differs" in p for p in wheel_folder_problems(read_pins(tmp_path / "list.txt"),
                                                            tmp_path))


# --- host RAM emulated with the card ------------------------------------------------------------


def test_a_runner_joins_its_cgroup_before_it_runs(tmp_path):
    """cgroup_exec writes its own pid into cgroup.procs, then becomes the command (same pid)."""
    import subprocess
    import sys

    from omniprobe.harness.offline.host_ram_cap import HostRamCap

    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    cap = HostRamCap.create("omniprobe-test", 30 * 1024, root)
    assert (cap.folder / "memory.max").read_text() == f"{30 * 1024**3}\n"
    done = subprocess.run(cap.wrap([sys.executable, "-c", "import os; print(os.getpid())"],
                                   sys.executable), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (cap.folder / "cgroup.procs").read_text().split() == [done.stdout.strip()]
    (cap.folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (cap.folder / "memory.peak").write_text(f"{31 * 1024**3}\n")
    check = cap.check()
    assert (check.cap_mib, check.peak_mib, check.oom_kills) == (30720, 31744.0, 1)
    cap.remove()
    assert not cap.folder.exists()


@pytest.mark.parametrize(("controllers", "words"), [
    (None, "no cgroup v2 at"),
    ("cpu pids\n", "has no memory controller"),
])
def test_no_cgroup_to_cap_host_ram_is_the_machines_failure_named(tmp_path, controllers, words):
    from omniprobe.errors import EnvironmentFailure
    from omniprobe.harness.offline.host_ram_cap import require_host_ram_cap

    if controllers is not None:
        (tmp_path / "cgroup.controllers").write_text(controllers)
    with pytest.raises(EnvironmentFailure, match=words):
        require_host_ram_cap(tmp_path)


@pytest.mark.parametrize(("runs", "host_ram_gib", "words"), [
    # The emulated 5080: its profiles killed under the 30 GiB cap, and what they held without it.
    ([held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error"),
      held(run("nokv", 16, FITS_4), None, 42.3)], 30,
     "host RAM capped at 30 GiB by a cgroup in 1 profile run(s), 1 of them killed at the cap "
     "(zram not emulated); without a host RAM cap the runner held up to 42.3 GiB of host RAM, "
     "**more than** the real card's host's 30 GiB of RAM"),
    # A kill under the old whole-model build says so; the seed's words for the RAM are quoted,
    # and zram is never counted.
    ([held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error", build_path=None)], 30,
     "host RAM capped at 30 GiB by a cgroup in 1 profile run(s), 1 of them killed at the cap "
     "(1 under the random build that held the whole bf16 model at once, not the card's answer) "
     "(zram not emulated)"),
    ([held(run("nokv", 16, FITS_4), None, 28.0)], 30,
     "host RAM not emulated: the runner held up to 28.0 GiB of host RAM, within the real card's "
     "host's 30 GiB of RAM"),
    ([held(run("nokv", 24, FITS_4), None, 42.3)], None,
     "host RAM not emulated: the runner held up to 42.3 GiB of host RAM, and the card's host RAM "
     "is not stated"),
])
def test_the_host_ram_line_says_what_was_capped_killed_and_held(runs, host_ram_gib, words):
    from omniprobe.report.diffusers_view import host_ram_text

    assert host_ram_text(runs, host_ram_gib, None) == words


def test_a_build_killed_at_the_host_ram_cap_answers_for_the_host_not_the_gpu():
    from omniprobe.analysis.diffusers_capacity import gpu_runs
    from omniprobe.report.diffusers_view import build_note

    killed = held(run("leaf", 16, {}), 30, 30.0, killed=True, init="init-error")
    oom_at_build = held(run("block", 16, {}), None, 20.0, init="init-oom")
    assert build_note(killed) == "build: the kernel killed the runner at the 30 GiB host RAM cap"
    assert build_note(oom_at_build) == "build: init-oom"
    whole = replace(killed, build_path=None)
    assert build_note(whole).endswith("not the load path's: not the card's answer until re-run")
    assert gpu_runs([killed, oom_at_build]) == [oom_at_build]


UPSTREAM = "diffusers/hooks/group_offloading.py:199 in _pinned_memory_tensors: RuntimeError: cannot pin"


@pytest.mark.parametrize(("runs", "verdict"), [
    # A failure in upstream code that is no lack of memory is never the card's answer...
    ([replace(run("lowmem-int8", 16, {4: ("error", None, False)}),
              cells=(replace(run("x", 16, {4: ("error", None, False)}).cells[0],
                             upstream_failure=UPSTREAM),))], "not measured"),
    ([replace(run("lowmem-int8", 16, {}), init_outcome="init-error",
              init_upstream_failure=UPSTREAM)], "not measured"),
    # ... while an OOM, or a build the host's RAM ended, is.
    ([run("leaf", 16, {4: ("oom", 15488, False)})], "does not fit"),
    ([replace(run("leaf", 16, {}), init_outcome="init-oom")], "does not fit"),
])
def test_an_upstream_failure_asks_nothing_of_the_card(runs, verdict):
    assert card_capacity("h", runs, 16 * GIB, 4).verdict == verdict


@pytest.mark.parametrize(("cgroup_peaks", "resident", "held"), [
    # int8-leaf-nostream under the 5080's 30 GiB cgroup (2026-12-02T003903Z): the cgroup charged
    # 30,610.6 MiB, while the runner's RSS, which counts shared library pages, read 31,076.0.
    ([30610.6, 30610.6], [29599.1, 31076.0, 25471.0], 30610.6),
    ([None], [29599.1, 31076.0], 31076.0),  # no cgroup peak read: the resident memory
    ([], [42400.0, None], 42400.0),  # no cgroup: the most resident
    ([], [None], None),
])
def test_under_a_cgroup_what_a_run_held_is_the_cgroups_own_charge(cgroup_peaks, resident, held):
    from omniprobe.analysis.diffusers_capacity import held_mib

    assert held_mib(cgroup_peaks, resident) == held


@pytest.mark.parametrize(("left", "words"), [
    # Issue 35 class 8: a cgroup a killed run left behind no longer fails every resume.
    (None, None),  # nothing left: created
    ("", None),  # left, empty: removed, then created again
    ("999999999\n", None),  # left with a process long gone: removed
    ("{me}\n", "still holds process(es) {me}"),  # a run of it still goes on: named
])
def test_a_cgroup_a_killed_run_left_is_removed_or_named(tmp_path, left, words):
    import os
    import re

    from omniprobe.harness.offline.host_ram_cap import HostRamCap, HostRamUnavailable

    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    if left is not None:
        (root / "omniprobe-x").mkdir()
        (root / "omniprobe-x" / "cgroup.procs").write_text(left.format(me=os.getpid()))
    if words is None:
        cap = HostRamCap.create("omniprobe-x", 1024, root)
        assert (cap.folder / "memory.max").read_text() == f"{1024**3}\n"
    else:
        with pytest.raises(HostRamUnavailable, match=re.escape(words.format(me=os.getpid()))):
            HostRamCap.create("omniprobe-x", 1024, root)


def test_a_count_not_run_at_a_cap_is_read_only_at_the_caps_it_ran():
    # Run at 16 GiB for every count, at 24 GiB for four references only: three references failed
    # at 16 and were never asked at 24, so "> 16", never "> 24"; two were never run at all.
    runs = [run("p", 16, {0: ("ok", 9000, False), 3: ("oom", 15000, False),
                          4: ("oom", 15500, False)}),
            run("p", 24, {4: ("ok", 22000, False)}),
            run("q", 24, {2: ("ok", 12000, False)})]
    needs = {n: c.text() for n, c in min_caps(runs, "p").items()}
    assert needs == {0: "≤ 16", 3: "> 16", 4: "16–24"}
    assert 2 not in needs  # read as "—" in the table, not as a failure
