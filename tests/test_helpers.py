"""The one-of-each helpers: digests, attempt ids, provenance, process checks, log tails."""

import hashlib
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.digests import sha256_bytes, sha256_file, sha256_json
from omniprobe.evidence.attempts import free_attempt_id, new_attempt_id, probe_attempts, provenance
from omniprobe.harness.common.logs import log_tail, read_from
from omniprobe.harness.common.processes import alive

from .conftest import REPO, copy_repo

NOW = datetime(2026, 11, 30, 9, 54, 16, tzinfo=UTC)


def test_digests_agree_with_hashlib(tmp_path):
    data = bytes(range(256)) * 5000
    (tmp_path / "blob").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_bytes(data) == sha256_file(tmp_path / "blob") == expected
    assert sha256_json({"b": 1, "a": [2]}) == sha256_json({"a": [2], "b": 1})
    assert sha256_json({"a": 1}) != sha256_json({"a": 2})


IDS = [
    (1, "-probe", "2026-11-30T095416Z-sim-probe"),
    (2, "-probe", "2026-11-30T095416Z.002-sim-probe"),
    (12, "-offline", "2026-11-30T095416Z.012-sim-offline"),
    (999, "-env", "2026-11-30T095416Z.999-sim-env"),
]


@pytest.mark.parametrize(("n", "suffix", "expected"), IDS)
def test_new_attempt_id(n, suffix, expected):
    assert new_attempt_id("sim", NOW, n, suffix) == expected


@pytest.mark.parametrize("n", [0, 1000])
def test_a_count_outside_the_fixed_width_is_refused(n):
    with pytest.raises(ValueError, match="within one second"):
        new_attempt_id("sim", NOW, n)


def test_ids_sort_in_the_order_they_were_made():
    """Issue 12: a collision suffix once sorted before the id it collided with."""
    made = [new_attempt_id("sim", NOW, n) for n in (1, 2, 3, 9, 10, 11, 100)]
    made.append(new_attempt_id("sim", NOW.replace(second=17)))
    assert sorted(made) == made


def test_free_attempt_id_and_resume_pick_the_newest(tmp_path):
    for _ in range(11):
        folder = tmp_path / free_attempt_id(tmp_path, "sim", NOW, "-probe")
        folder.mkdir()
        (folder / "attempt.json").write_text("{}")
    newest = probe_attempts(tmp_path)[-1]
    assert newest.name == "2026-11-30T095416Z.011-sim-probe"


def test_provenance_of_a_real_and_a_simulated_host(repo):
    hosts = load_hosts(repo.hosts_file)
    real = provenance("rtx3090", hosts.host("rtx3090"), ["omniprobe", "x"], NOW)
    assert (real.kind, real.host, real.command, real.started_at) == (
        "measured", "rtx3090", ["omniprobe", "x"], NOW)
    sim = provenance("sim", hosts.host("sim"), ["omniprobe"], NOW)
    assert (sim.kind, sim.model) == ("simulated", "omniprobe.sim capacity model (sim.toml [capacity.sim])")
    assert provenance("sim", hosts.host("sim"), [], NOW, simulated_model="env").model == "env"


def test_alive_for_a_process_and_its_group():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        assert alive(child.pid) and alive(child.pid, group=True)
    finally:
        child.kill()
        child.wait()
    assert not alive(child.pid) and not alive(child.pid, group=True)
    assert alive(os.getpid())


TAILS = [
    ("", 2, "(nothing new)"),
    ("\n  \n", 2, "(nothing new)"),
    ("a\nb\n\nc\n", 2, "b | c"),
    ("  one  \n", 2, "one"),
    ("a\nb\nc", 3, "a | b | c"),
    ("x" * 500, 2, "x" * 400),
]


@pytest.mark.parametrize(("text", "lines", "expected"), TAILS)
def test_log_tail(text, lines, expected):
    assert log_tail(text, lines) == expected


def test_read_from_an_offset(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"old line\nnew \xff line\n")
    assert read_from(log, len(b"old line\n")) == "new \ufffd line\n"


@pytest.mark.xdist_group("group-check")
def test_a_grouped_test_runs_in_its_group(request):
    """Tests that share work per process (one env build, one drawing) are grouped onto one
    worker; pytest 9.2 with xdist 3.8 dropped the groups silently (pytest-xdist#1386)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@group-check")


def test_a_project_copy_edited_in_place_leaves_the_next_copy_as_committed(tmp_path):
    """copy_repo hard-links one pristine copy: a test's in-place write or chmod reaches it, and
    the next copy must still be the committed project, byte for byte and mode for mode."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = copy_repo(tmp_path / "first").root
    hosts, template = first / "hosts.toml", first / "templates" / "report.md.j2"
    with open(hosts, "r+b") as handle:  # in place: the same inode as the pristine copy's
        handle.write(b"broken")
    template.chmod(0o000)
    (first / "evidence" / "added.json").write_text("{}")  # a folder of its own: not shared

    second = copy_repo(tmp_path / "second").root
    assert (second / "hosts.toml").read_bytes() == (REPO / "hosts.toml").read_bytes()
    assert (second / "templates" / "report.md.j2").stat().st_mode == \
        (REPO / "templates" / "report.md.j2").stat().st_mode
    assert not (second / "evidence" / "added.json").exists()
    assert (first / "hosts.toml").read_bytes().startswith(b"broken")  # the edit stays its own
    assert (second / "fixtures").is_dir() and all(
        p.stat().st_nlink == 1 for p in (second / "fixtures").rglob("*") if p.is_file())
    template.chmod(0o644)
