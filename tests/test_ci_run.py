""".ci/run (issue 52): nox and uv in a venv of its own, never `pip install` into the system Python
(an externally managed one refuses it); every step runs even after one fails, and a summary line
per step (step, pass or fail, seconds) ends it, its exit status 1 if any step failed.

The steps run here are stand-ins: a `python3` that makes the venv, a `nox` that fails one session,
so the script's own flow is what is tested, in seconds (the real run takes some 11 minutes)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .conftest import REPO

CI = REPO / ".ci" / "run"


def dry_run() -> list[str]:
    done = subprocess.run([str(CI), "--dry-run"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_tools_go_in_a_venv_of_its_own_never_the_system_python():
    setup, *_ = dry_run()
    assert setup.startswith("python3 -m venv .ci/venv && .ci/venv/bin/python -m pip install ")
    assert "nox uv" in setup
    assert not re.search(r"(?m)^[^#]*python3 -m pip", CI.read_text())


def _stand_ins(folder: Path, failing: str) -> Path:
    """A bin folder: `python3 -m venv DIR` makes DIR/bin/python (a no-op pip); `nox` records its
    arguments and fails the session named `failing`."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        '#!/bin/sh\n[ "$1 $2" = "-m venv" ] || exit 9\nmkdir -p "$3/bin"\n'
        'printf "#!/bin/sh\\nexit 0\\n" > "$3/bin/python"\nchmod +x "$3/bin/python"\n')
    (bin_dir / "nox").write_text(
        f'#!/bin/sh\necho "$@" >> "{folder}/nox-calls"\ncase "$*" in *{failing}*) exit 1;; esac\n')
    for tool in ("python3", "nox"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _run_clone(tmp_path, failing: str) -> tuple:
    """.ci/run in a clone of its own, nox and python3 stood in for, `failing` failing: the run and
    the clone."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy2(CI, clone / ".ci" / "run")
    bin_dir = _stand_ins(tmp_path, failing=failing)
    done = subprocess.run([str(clone / ".ci" / "run")], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=60)
    return done, clone


def test_every_step_runs_after_one_fails_and_a_summary_line_each_ends_it(tmp_path):
    done, clone = _run_clone(tmp_path, failing="lint")
    setup, *steps = dry_run()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (tmp_path / "nox-calls").read_text().splitlines() == [s[len("nox "):] for s in steps]
    summary = done.stdout[done.stdout.index("CI summary"):].splitlines()[1:]
    assert [line.rsplit(None, 3)[0] for line in summary] == [setup, *steps]
    results = {line.rsplit(None, 3)[0]: line.rsplit(None, 3)[1] for line in summary}
    assert results == {step: "fail" if "lint" in step else "pass" for step in [setup, *steps]}
    assert all(re.search(r" \d+ s$", line) for line in summary)
    assert (clone / ".ci" / "venv" / "bin" / "python").is_file()


def test_a_run_whose_steps_all_pass_exits_0(tmp_path):
    done, _ = _run_clone(tmp_path, failing="no-session-is-named-so")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " fail " not in done.stdout[done.stdout.index("CI summary"):]
