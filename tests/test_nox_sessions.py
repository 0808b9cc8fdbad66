"""The noxfile driven through nox itself (no venvs, nothing installed: the sessions run this
interpreter's omniprobe), on a private copy of the project: options after `--` reach the sessions
that take them, and a failed env session stops the probe sessions of its run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


def nox(project, tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "OMNIPROBE_ROOT": str(project.root),
           "OMNIPROBE_ARTIFACTS": str(tmp_path / "artifacts"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "nox", "--no-venv", "--no-install", "-f",
                           str(REPO / "noxfile.py"), *args], env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    return done.returncode, done.stdout + done.stderr


def probe_attempts(project, host: str) -> list[str]:
    return sorted(p.name for p in (project.evidence_dir / host).glob("*-probe"))


@pytest.mark.e2e
def test_env_session_takes_dry_run(repo_copy, tmp_path):
    before = sorted(p.name for p in (repo_copy.evidence_dir / "rtx3090").iterdir())
    code, out = nox(repo_copy, tmp_path, "-s", "env-rtx3090", "--", "--dry-run")
    assert code == 0, out
    assert "omniprobe env build --host rtx3090 --select --dry-run" in out
    assert "dry run" in out
    assert sorted(p.name for p in (repo_copy.evidence_dir / "rtx3090").iterdir()) == before


def test_an_option_no_session_of_the_run_takes_is_an_error_naming_those_that_would(repo_copy,
                                                                                  tmp_path):
    code, out = nox(repo_copy, tmp_path, "-s", "report", "--", "--dry-run")
    assert code != 0
    assert ("error: nox arguments after --: --dry-run: no session of this run (report) takes it; "
            "the sessions that take it: env-<host>") in out
    assert "file(s) written" not in out


@pytest.mark.e2e
def test_probe_options_reach_the_probes_and_the_report_renders(repo_copy, tmp_path):
    from omniprobe.harness.common.process import free_port

    before = probe_attempts(repo_copy, "sim")
    code, out = nox(repo_copy, tmp_path, "-s", "env-sim", "probe-init", "probe-serve", "report",
                    "--", "--fresh", "--flag-set", "fp8", "--fixture", "sim-single",
                    "--port", str(free_port()))
    assert code == 0, out
    assert "nox > omniprobe report\n" in out and "wrote report/HARNESS.md" in out  # no --fresh for it
    [new] = sorted(set(probe_attempts(repo_copy, "sim")) - set(before))
    assert f"probe-init on sim: attempt {new} (new: --fresh)" in out
    assert f"probe-serve on sim: attempt {new} (joined: {new}, this nox run's --fresh one)" in out
    attempt = json.loads((repo_copy.evidence_dir / "sim" / new / "attempt.json").read_text())
    assert attempt["attempt"]["environment"]["served"]["source"] == "simulated"


@pytest.mark.e2e
def test_a_failed_env_session_makes_the_probe_of_its_run_refuse(repo_copy, tmp_path):
    suite = json.loads(repo_copy.fixtures_file.read_text())
    reference = next(f for f in suite["fixtures"] if f["id"] == "sim-single")["references"][0]
    (repo_copy.fixtures_file.parent / reference["file"]).write_bytes(b"tampered")
    before = probe_attempts(repo_copy, "sim")
    code, out = nox(repo_copy, tmp_path, "-s", "env-sim", "probe-init")
    assert code != 0
    assert "env-sim failed: no host selected" in out
    assert ("error: env-sim failed, so it selected no host and the probe sessions of this nox run "
            f"do not run: fixtures.references failed: {reference['file']}") in out
    assert probe_attempts(repo_copy, "sim") == before


@pytest.mark.e2e
def test_a_capacity_sweep_whose_flag_sets_oom_at_init_exits_0(repo_copy, tmp_path):
    """Issue 23: at 16 GiB every bf16 flag set of the sim OOMs at init, at 20 some do: these
    are the card's answers, so the sweep's session succeeds, and says so last."""
    from omniprobe.harness.common.process import free_port

    code, out = nox(repo_copy, tmp_path, "-s", "env-sim-emulated", "probe-serve", "--",
                    "--fresh", "--caps", "16,20", "--fixture", "sim-single",
                    "--port", str(free_port()))
    assert code == 0, out
    assert "Session probe-serve was successful" in out
    assert "not sent: the init oom on record settles them" in out
    assert out.count("done: every init and cell this run asks for is settled") == 2


@pytest.mark.e2e
def test_a_failed_sessions_last_line_says_what_omniprobes_exit_code_meant(repo_copy, tmp_path):
    """Issue 34: through nox every failure is exit 1, so the session says omniprobe's own code
    and its meaning last (errors.EXIT_MEANINGS)."""
    from omniprobe.errors import EXIT_MEANINGS

    code, out = nox(repo_copy, tmp_path, "-s", "probe-serve", "--", "--host", "sim-emulated",
                    "--caps", "12,abc")
    assert code != 0
    assert "error: --caps: expects GiB figures separated by commas, got 'abc'" in out
    assert out.strip().splitlines()[-1].startswith(
        f"nox > Session probe-serve aborted: omniprobe probe-serve exited 2: {EXIT_MEANINGS[2]}")


def nox_list(project, tmp_path) -> dict[str, str]:
    code, out = nox(project, tmp_path, "-l")
    assert code == 0, out
    return dict(re.findall(r"(?m)^[*-] (\S+) -> (.*)$", out))


def test_nox_l_describes_every_session_in_whole_sentences(repo_copy, tmp_path):
    """Issue 34: `nox -l` shows a docstring's first line, which cut several mid-sentence."""
    listed = nox_list(repo_copy, tmp_path)
    assert {"report", "tests", "probe-baseline", "upstream", "env-sim"} <= set(listed)
    for name, description in listed.items():
        assert description[:1].isupper() and description.endswith("."), (name, description)
        assert description.count("(") == description.count(")"), (name, description)
        assert description.count("`") % 2 == 0, (name, description)


def test_nox_l_calls_a_simulated_hosts_env_session_a_check_not_a_build(repo_copy, tmp_path):
    """Issue 34: env-sim-emulated was called a build; its dry run says there is nothing to build."""
    from omniprobe.config.hosts import load_hosts

    listed = nox_list(repo_copy, tmp_path)
    for name, host in load_hosts(repo_copy.hosts_file).hosts.items():
        words = listed[f"env-{name}"]
        if host.simulated:
            assert words.startswith(f"Check {name}'s env") and "nothing is built" in words, words
        else:
            assert words.startswith(f"Build {name}'s pinned env"), words
