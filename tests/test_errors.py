"""One error family, one handler: each command's failures print as messages with their
category's exit code; the session skeleton refuses before an attempt exists, closes on every
path and records the command line it is given."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from omniprobe import cli
from omniprobe.errors import (
    EnvironmentFailure,
    HarnessError,
    InputError,
    Interrupted,
    OmniprobeError,
    Problem,
    Refusal,
)
from omniprobe.evidence.load import load_attempt
from omniprobe.harness.common.session import Session, run_session

from .conftest import REPO, SRC, in_process, probe_argv

REFERENCE = "sim/ref-a.png"  # the reference of sim-single (and the first of sim-pair)


def tamper_reference(project) -> tuple[str, str, str]:
    """Overwrite the sim fixtures' first reference image; (its path, pinned, actual sha256)."""
    path = project.fixtures_file.parent / REFERENCE
    suite = json.loads(project.fixtures_file.read_text())
    pinned = next(r["sha256"] for f in suite["fixtures"] for r in f.get("references") or []
                  if r["file"] == REFERENCE)
    path.write_bytes(b"not the pinned image")
    return str(path), pinned, hashlib.sha256(b"not the pinned image").hexdigest()


def no_evidence(project) -> bool:
    return not project.evidence_dir.exists() or not any(project.evidence_dir.iterdir())


def test_each_category_has_its_own_exit_code():
    codes = {cls: cls.exit_code
             for cls in (InputError, Refusal, EnvironmentFailure, HarnessError, Interrupted)}
    assert codes == {InputError: 2, Refusal: 3, EnvironmentFailure: 4, HarnessError: 5,
                     Interrupted: 130}
    assert all(issubclass(cls, OmniprobeError) for cls in codes)


def test_every_command_error_is_in_the_family():
    """The package's own error classes all join a category (the sim's are the server's own)."""
    from omniprobe.classify.imaging import ImageMismatch, UnreadableImage
    from omniprobe.config.fixtures import FixtureNotRunnable
    from omniprobe.config.hosts import UnknownHost
    from omniprobe.config.project import NoProject
    from omniprobe.config.selection import NoHost, SelectedEnvFailed
    from omniprobe.env.serve_command import FlagSetNotRunnable, NotInEnv
    from omniprobe.env.state import EnvBuildError, EnvError, EnvNotReady
    from omniprobe.evidence.attempts import AttemptBusy
    from omniprobe.harness.common.process import PortInUse
    from omniprobe.harness.common.references import ReferenceMismatch
    from omniprobe.harness.common.sampler import GpuBusy, NvmlUnavailable
    from omniprobe.harness.common.selection import PlanError
    from omniprobe.harness.offline.plan import KwargSetNotRunnable
    from omniprobe.harness.offline.runner_events import RunnerProtocolError

    expected = {
        InputError: [ImageMismatch, UnreadableImage, NoProject, ReferenceMismatch],
        Refusal: [FixtureNotRunnable, UnknownHost, NoHost, AttemptBusy, KwargSetNotRunnable,
                  PlanError, FlagSetNotRunnable],
        EnvironmentFailure: [SelectedEnvFailed, EnvBuildError, EnvError, EnvNotReady, GpuBusy,
                             NvmlUnavailable, NotInEnv, PortInUse],
        HarnessError: [RunnerProtocolError],
    }
    for category, members in expected.items():
        assert [m.__name__ for m in members if not issubclass(m, category)] == []


def test_input_error_prints_every_problem_line(capsys):
    problems = [Problem("a.json", "$.x", "expected an int"), Problem("b.json", "", "not found")]

    def fails() -> int:
        raise InputError(problems)

    assert cli.run_command(fails) == 2
    assert capsys.readouterr().err == "error: a.json: $.x: expected an int\nerror: b.json: not found\n"


def _hold_port(project, port: int) -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


# (argv, how to break the project, exit code, what the message says)
CASES = [
    # validate's answer is 1 (it lists every problem: its job, not an error of its own)
    (["validate"], lambda p, port: p.hosts_file.write_text("[stack\n"), 1,
     "{root}/hosts.toml: not valid TOML"),
    (["report"], lambda p, port: p.fixtures_file.write_text("{"), 2,
     "{root}/fixtures/fixtures.json: line 1 column 2"),
    (["image-check", "{root}/missing.png"], None, 2, "{root}/missing.png: no such file"),
    (["quality", "--baseline", "{root}"], None, 2, "{root}/evidence: evidence folder not found"),
    (["timeline", "{root}/none.jsonl"], None, 2, "{root}/none.jsonl: file not found"),
    (["env", "build", "--host", "h100"], None, 3,
     "--host names host 'h100', which hosts.toml does not define"),
    (["select-host", "h100"], None, 3, "select-host names host 'h100'"),
    (["probe-init", "--host", "h100"], None, 3, "--host names host 'h100'"),
    (["probe-init", "--host", "sim", "--flag-set", "int8"], None, 3,
     "flag set(s) int8 are not run on host 'sim'"),
    (["probe-init", "--host", "sim", "--port", "{port}"], _hold_port, 4,
     "port {port} on 127.0.0.1 is already in use"),
    (["probe-serve", "--host", "sim", "--fixture", "sim-single"],
     lambda p, port: tamper_reference(p), 2, "{root}/fixtures/sim/ref-a.png: sha256 "),
    (["probe-offline", "--host", "sim", "--kwarg-set", "nope"], None, 3,
     "offline kwarg set(s) nope are not run on host 'sim'"),
    (["propagation", "--host", "sim", "--with", "cpuoff"], None, 3,
     "flag set 'cpuoff' passes no deploy config"),
    # A malformed value is a bad argument (2) whichever command takes it (issue 34: it was 3).
    (["probe-serve", "--host", "sim-emulated", "--caps", "12,abc"], None, 2,
     "--caps: expects GiB figures separated by commas, got 'abc'"),
    (["probe-init", "--host", "sim", "--caps", "12,abc"], None, 2,
     "--caps: expects GiB figures separated by commas, got 'abc'"),
    (["probe-offline", "--host", "sim-emulated", "--caps", "0"], None, 2,
     "--caps: each cap is a number of GiB from 1 MiB (0.001) up to 1024 GiB"),
]


@pytest.mark.parametrize(("argv", "breaks", "code", "message"), CASES,
                         ids=[" ".join(c[0][:2]) + f" -> {c[2]}" for c in CASES])
def test_each_command_fails_with_a_message_and_its_category_code(project, port, capsys, argv,
                                                                   breaks, code, message):
    held = breaks(project, port) if breaks else None
    fill = {"root": str(project.root), "port": str(port)}
    try:
        assert cli.main([part.format(**fill) for part in argv]) == code
    finally:
        if isinstance(held, socket.socket):
            held.close()
    captured = capsys.readouterr()
    assert f"error: {message.format(**fill)}" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert no_evidence(project)


def test_no_project_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OMNIPROBE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate"]) == 2
    assert f"error: {tmp_path}: no hosts.toml here or in any folder above it" in (
        capsys.readouterr().err)


# --- the mismatched reference image --------------------------------------------------------

def test_a_mismatched_reference_is_an_input_error_before_any_attempt(project, port):
    """Through the real command line: the file and both digests named, no traceback, and no
    attempt (it used to surface mid-run as a traceback and leave a half-made attempt)."""
    path, pinned, actual = tamper_reference(project)
    done = subprocess.run(
        [sys.executable, "-m", "omniprobe", *probe_argv("probe-serve", port, "--fixture",
                                                        "sim-pair")],
        cwd=project.root, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC), "OMNIPROBE_ROOT": str(project.root)})
    assert done.returncode == 2, done.stderr
    assert (f"error: {path}: sha256 {actual} differs from {pinned}, the digest fixtures.json "
            "pins for reference 'sim-ref-a' of fixture 'sim-pair'") in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert no_evidence(project) and not project.artifacts_dir.joinpath("sim").exists()


@pytest.mark.parametrize("argv", [
    ["probe-offline", "--host", "sim", "--fixture", "sim-single"],
    ["propagation", "--host", "sim", "--fixture", "sim-single"],
])
def test_offline_and_propagation_refuse_a_mismatched_reference_too(project, argv):
    path, pinned, actual = tamper_reference(project)
    code, out = in_process(project, argv)
    assert code == 2
    assert f"error: {path}: sha256 {actual} differs from {pinned}" in out
    assert no_evidence(project)


def test_a_missing_reference_is_named(project, port):
    (project.fixtures_file.parent / REFERENCE).unlink()
    code, out = in_process(project, probe_argv("probe-serve", port, "--fixture", "sim-single"))
    assert code == 2
    assert f"{REFERENCE}: reference 'sim-ref-a' of fixture 'sim-single' is missing" in out
    assert no_evidence(project)


# --- the session skeleton ------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["probe-init", "--host", "sim", "--flag-set", "int8"],
    ["probe-serve", "--host", "sim", "--fixture", "nope"],
    ["probe-offline", "--host", "sim", "--fixture", "nope"],
    ["propagation", "--host", "sim", "--fixture", "nope"],
    ["probe-init", "--host", "nowhere"],
])
def test_every_session_refuses_before_an_attempt_exists(project, argv):
    code, out = in_process(project, argv)
    assert code == 3 and "error: " in out
    assert no_evidence(project) and not project.artifacts_dir.exists()


class _Recorded(Session):
    """A session that logs each step; `fail` raises in the step it names."""

    def __init__(self, fail: str | None = None, error: BaseException | None = None):
        self.fail, self.error, self.steps = fail, error, []

    def _step(self, name: str) -> None:
        self.steps.append(name)
        if name == self.fail:
            raise self.error

    def prepare(self, ctx) -> None:
        self._step("prepare")

    def open_attempt(self, ctx):
        self._step("open")
        return _Store(self.steps)

    def run(self, ctx, store) -> int:
        self._step("run")
        return 0

    def close(self) -> None:
        self.steps.append("close")

    def interrupted(self, store) -> str:
        return "the server was stopped"


class _Store:
    def __init__(self, steps):
        self.steps = steps

    def close(self) -> None:
        self.steps.append("store closed")

    def discard_if_empty(self) -> bool:
        return False


@pytest.mark.parametrize(("fail", "error", "raised", "steps"), [
    (None, None, None, ["prepare", "open", "run", "close", "store closed"]),
    ("prepare", Refusal("no"), Refusal, ["prepare"]),
    ("run", EnvironmentFailure("busy"), EnvironmentFailure,
     ["prepare", "open", "run", "close", "store closed"]),
    ("run", KeyboardInterrupt(), Interrupted, ["prepare", "open", "run", "close", "store closed"]),
])
def test_the_skeleton_closes_on_every_path_after_the_attempt_opens(project, fail, error, raised,
                                                                  steps):
    session = _Recorded(fail, error)
    if raised is None:
        assert run_session(project, session, "sim", io.StringIO()) == 0
    else:
        with pytest.raises(raised):
            run_session(project, session, "sim", io.StringIO())
    assert session.steps == steps


def test_ctrl_c_is_exit_130_with_the_sessions_word(project, capsys):
    def interrupted() -> int:
        return run_session(project, _Recorded("run", KeyboardInterrupt()), "sim", io.StringIO())

    assert cli.run_command(interrupted) == 130
    assert capsys.readouterr().err == "interrupted: the server was stopped\n"


# --- the command line recorded as provenance -----------------------------------------------

def test_an_attempt_records_the_command_it_is_given(project, port, monkeypatch):
    from omniprobe.harness.common.options import ProbeOptions
    from omniprobe.harness.serve.session import run_probe

    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "somewhere"])
    options = ProbeOptions(host="sim", port=port, grace_s=2, flag_sets=("fp8",))
    command = ["omniprobe", "probe-init", "--flag-set", "fp8"]
    assert run_probe(project, "probe-init", options, command=command, out=io.StringIO()) == 0
    [folder] = (project.evidence_dir / "sim").iterdir()
    assert load_attempt(folder)[0].meta.provenance.command == command


def test_the_cli_records_its_own_arguments_not_sys_argv(project, port, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "somewhere"])
    argv = ["probe-offline", "--host", "sim", "--kwarg-set", "sim-offline-bf16", "--fixture",
            "sim-t2i", "--grace", "2"]
    assert cli.main(argv) == 0
    [folder] = (project.evidence_dir / "sim").iterdir()
    assert load_attempt(folder)[0].meta.provenance.command == ["omniprobe", *argv]


def test_every_exit_code_has_one_meaning_and_the_guides_table_lists_the_same():
    from omniprobe.errors import (
        EXIT_MEANINGS,
        EnvironmentFailure,
        HarnessError,
        InputError,
        Interrupted,
        Refusal,
    )
    categories = {cls.exit_code for cls in (InputError, Refusal, EnvironmentFailure, HarnessError,
                                            Interrupted)}
    assert set(EXIT_MEANINGS) == categories | {0, 1}
    guide = (REPO / "docs" / "guide.md").read_text()
    table = guide[guide.index("| exit | meaning |"):]
    table = table[:table.index("\n\n")]
    assert {int(code) for code in re.findall(r"(?m)^\| (\d+) \|", table)} == set(EXIT_MEANINGS)
    # The README's one paragraph names each code with its word
    readme = (REPO / "README.md").read_text()
    short = readme[readme.index("## When something fails"):]
    assert {int(code) for code in re.findall(
        r"(\d+) (?:done|bad input|refused|this machine|the harness|interrupted)", short)
    } == set(EXIT_MEANINGS)
