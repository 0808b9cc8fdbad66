"""The README's quick start, run as a new user would on a distribution's Python (issue 34, items 1
and 2): a throwaway copy of this machine's base Python, marked EXTERNALLY-MANAGED (PEP 668) as
Debian's and Arch's are, with pipx installed as the distribution's package step would install it;
then the quick start's lines, as written, in a fresh clone; then every `omniprobe ...` command the
README and the guides under docs/ name and every `nox -s ...` line of their code blocks.

Slow and needs PyPI (pipx, nox, uv and omniprobe's dependencies are downloaded): `.ci/run` runs
it (`-m slow`); the suite's default run deselects it (pyproject.toml addopts)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.network]

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
# The standard library's parts no command here needs, left out of the copy.
NOT_COPIED = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
              "__pycache__", "EXTERNALLY-MANAGED")


def throwaway_python(folder: Path) -> Path:
    """A copy of this machine's base interpreter and standard library outside any venv: a
    Python whose own site-packages pip would write to, as a distribution's system Python's."""
    base = Path(sys.base_prefix)
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / VERSION
    shutil.copy2(os.path.realpath(sys._base_executable), python)
    (folder / "lib").mkdir()
    for lib in (base / "lib").glob("libpython*.so*"):
        shutil.copy2(lib, folder / "lib" / lib.name)
    shutil.copytree(base / "lib" / VERSION, folder / "lib" / VERSION, symlinks=True,
                    ignore=shutil.ignore_patterns(*NOT_COPIED))
    (folder / "lib" / VERSION / "site-packages").mkdir()
    (folder / "bin" / "python3").symlink_to(VERSION)
    return folder / "bin" / "python3"


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 900):
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    # The closing note's figures: each command's time and last line (pytest -s shows them).
    print(f"[{time.perf_counter() - start:6.1f} s] {shlex.join(argv)}\n    -> exit "
          f"{done.returncode}: {lines[-1] if lines else ''}")
    return done


def code_blocks(readme: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"(?ms)^```[a-z]*\n(.*?)^```", readme)]


def commands_of(line: str) -> list[list[str]]:
    """A console line's commands, as the shell would run them: its comment dropped, `&&`
    splitting it."""
    words = shlex.split(line, comments=True)
    commands, current = [], []
    for word in words:
        if word == "&&":
            commands.append(current)
            current = []
        else:
            current.append(word)
    return [*commands, current] if current else commands


@pytest.fixture(scope="module")
def quick_started(tmp_path_factory):
    """A fresh clone after the README's quick start on an externally managed Python: the clone,
    and the environment its user's shell has."""
    root = tmp_path_factory.mktemp("quick-start")
    python = throwaway_python(root / "python")
    home = root / "home"
    bin_dir = home / ".local" / "bin"
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{python.parent}:/usr/bin:/bin",
           "LANG": "C.UTF-8", "PIPX_HOME": str(home / ".local/share/pipx"),
           "PIPX_BIN_DIR": str(bin_dir), "PIPX_DEFAULT_PYTHON": str(python),
           "XDG_CACHE_HOME": str(home / ".cache")}
    for name in ("PIP_INDEX_URL", "UV_INDEX_URL", "http_proxy", "https_proxy", "HTTP_PROXY",
                 "HTTPS_PROXY", "NO_PROXY", "no_proxy", "SSL_CERT_FILE"):
        if name in os.environ:
            env[name] = os.environ[name]
    # The distribution's own packages: its pip, and pipx (`sudo apt install pipx`) ...
    assert run([str(python), "-m", "ensurepip", "--default-pip"], root, env).returncode == 0
    assert run([str(python), "-m", "pip", "install", "--quiet", "pipx"], root, env).returncode == 0
    # ... then the marker that makes it a distribution's Python (PEP 668).
    (python.parent.parent / "lib" / VERSION / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This environment is externally managed (a test's "
        "stand-in for Debian's python3)\n")
    clone = root / "clone"
    assert run(["git", "clone", "--quiet", str(REPO), str(clone)], root, env).returncode == 0
    return clone, env, python, quick_start(clone, env)


def quick_start(clone: Path, env: dict[str, str]) -> list[tuple[list[str], int, str]]:
    """The README's quick start as written, after the distribution's step (done by the fixture),
    until a command fails: each command, its exit code and its output."""
    readme = (clone / "README.md").read_text(encoding="utf-8")
    lines = code_blocks(readme[readme.index("## Quick start"):])[0]
    # the distribution's step, root's: no sudo (issue 52)
    assert lines[0].startswith("apt update && apt install -y pipx")
    ran = []
    for line in lines[1:]:
        for argv in commands_of(line):
            if argv == ["nox", "-s", "tests"]:
                # The whole suite is this suite; one file of it shows the session works.
                argv = [*argv, "--", "-n", "0", "-q", "tests/test_atomic.py"]
            done = run(argv, clone, env)
            ran.append((argv, done.returncode, done.stdout + done.stderr))
            if done.returncode != 0:
                return ran
    return ran


def test_the_old_first_command_fails_on_an_externally_managed_python(quick_started):
    clone, env, python, _ = quick_started
    done = run([str(python), "-m", "pip", "install", "nox", "uv"], clone, env)
    assert done.returncode != 0 and "externally-managed-environment" in done.stdout + done.stderr


def test_the_quick_start_works_on_an_externally_managed_python(quick_started):
    clone, env, _, ran = quick_started
    failed = [(argv, out[-3000:]) for argv, code, out in ran if code != 0]
    assert failed == []
    assert [argv[:3] for argv, _, _ in ran] == [
        ["pipx", "install", "nox"], ["pipx", "install", "uv"], ["pipx", "install", "--editable"],
        ["nox", "-s", "report"], ["nox", "-s", "tests"]]
    report = ran[3][2]
    assert re.search(r"report: \d+ file\(s\) written, 0 removed, \d+ unchanged", report)
    assert "nox > Session report was successful" in report
    assert shutil.which("omniprobe", path=env["PATH"]) is not None


def user_docs(clone: Path) -> str:
    """What a user reads: the README and the guides under docs/ it links."""
    return "\n".join(path.read_text(encoding="utf-8")
                     for path in [clone / "README.md", *sorted((clone / "docs").glob("*.md"))])


def readme_omniprobe_commands(readme: str) -> list[list[str]]:
    """Every `omniprobe ...` command of the README: the lines of its code blocks as written, and
    the command words of each inline one (`omniprobe env fetch-model`, `omniprobe image-check
    PATH...`)."""
    found = [argv for block in code_blocks(readme) for line in block
             for argv in commands_of(line) if argv[:1] == ["omniprobe"]]
    for span in re.findall(r"`(omniprobe(?:\s[^`]*)?)`", readme):
        words = ["omniprobe"]
        for word in span.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            words.append(word)
        if words not in found:
            found.append(words)
    return found


def test_every_omniprobe_command_the_readme_names_runs_after_the_quick_start(quick_started):
    clone, env, _, _ = quick_started
    commands = readme_omniprobe_commands(user_docs(clone))
    assert ["omniprobe", "env", "fetch-model"] in commands
    assert any(argv[:2] == ["omniprobe", "probe-offline"] and "--profile" in argv
               for argv in commands)
    failed = [argv for argv in commands if run([*argv, "--help"], clone, env).returncode != 0]
    assert failed == []


def test_every_nox_line_of_the_readmes_code_blocks_runs_after_the_quick_start(quick_started):
    """Each `nox -s ...` line: an env session with `-- --dry-run`, every other with `-- --help`
    (each session's command prints its help). tests-diffusers installs torch: .ci/run runs it as
    written, so here its listing by `nox -l` stands for it."""
    clone, env, _, _ = quick_started
    readme = user_docs(clone)
    lines = [argv for block in code_blocks(readme) for line in block
             for argv in commands_of(line) if argv[:2] == ["nox", "-s"]]
    listed = run(["nox", "-l"], clone, env).stdout
    for argv in lines:
        named = argv[2:argv.index("--")] if "--" in argv else argv[2:]
        sessions = [word.replace("<host>", "rtx3090") for word in named]
        for session in sessions:
            assert re.search(rf"(?m)^[*-] {re.escape(session)} -> ", listed), session
        for session in sessions:
            if session in ("tests", "tests-diffusers"):
                continue  # the quick start's test runs `tests`; .ci/run runs both
            extra = ["--dry-run"] if session.startswith("env-") else ["--help"]
            done = run(["nox", "-s", session, "--", *extra], clone, env)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def message_commands() -> list[list[str]]:
    """Every omniprobe command a message or docstring of the package names (`omniprobe env
    build`, "omniprobe env fetch-model"), by its command words: those the parser knows."""
    import argparse

    from omniprobe.cli import build_parser

    def choices(parser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return subs[0].choices if subs else {}

    found = []
    for path in sorted((REPO / "src" / "omniprobe").rglob("*.py")):
        for span in re.findall(r"[`\"'(]omniprobe((?: [a-z][a-z-]*){1,2})",
                               path.read_text(encoding="utf-8")):
            words, parser = ["omniprobe"], build_parser()
            for word in span.split():
                if word not in choices(parser):
                    break
                words.append(word)
                parser = choices(parser)[word]
            if len(words) > 1 and words not in found:
                found.append(words)
    return found


def test_every_command_a_message_names_runs_after_the_quick_start(quick_started):
    clone, env, _, _ = quick_started
    commands = message_commands()
    assert ["omniprobe", "env", "fetch-model"] in commands and ["omniprobe", "env", "build"] in commands
    failed = [argv for argv in commands if run([*argv, "--help"], clone, env).returncode != 0]
    assert failed == []


def test_the_uv_tool_route_installs_the_same_commands(quick_started, tmp_path):
    """The README's other route: `uv tool install nox && uv tool install --editable .`, with the
    uv the user has (here: pipx's), in a home of its own."""
    clone, env, _, _ = quick_started
    readme = (clone / "README.md").read_text(encoding="utf-8")
    [line] = re.findall(r"`(uv tool install nox && uv tool install --editable \.)`", readme)
    uv = shutil.which("uv", path=env["PATH"])
    home = tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    own = {**env, "HOME": str(home), "UV_TOOL_DIR": str(home / ".local/share/uv/tools"),
           "UV_TOOL_BIN_DIR": str(bin_dir), "XDG_CACHE_HOME": env["XDG_CACHE_HOME"],
           "PATH": f"{bin_dir}:{Path(uv).parent}:/usr/bin:/bin"}
    for argv in commands_of(line):
        done = run(argv, clone, own)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shutil.which("omniprobe", path=str(bin_dir)) and shutil.which("nox", path=str(bin_dir))
    done = run(["omniprobe", "report", "--check"], clone, own)
    assert done.returncode == 0 and done.stdout.strip().startswith("the report is fresh"), done.stderr


def test_one_nox_run_of_env_sim_probe_init_probe_serve_shares_one_attempt(quick_started):
    """Issue 34, item 9, as the user meets it: each nox session has its own venv, and the sim's
    environment is what it runs, so probe-serve resumes the attempt probe-init made."""
    from omniprobe.harness.common.process import free_port

    clone, env, _, _ = quick_started
    done = run(["nox", "-s", "env-sim", "probe-init", "probe-serve", "--", "--flag-set", "fp8",
                "--fixture", "sim-single", "--port", str(free_port())], clone, env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    [init] = re.findall(r"probe-init on sim: attempt (\S+) \(new", out)
    assert f"probe-serve on sim: attempt {init} (resumed" in out
    assert len({p.name for p in (clone / ".nox").iterdir()}) >= 3  # a venv per session
