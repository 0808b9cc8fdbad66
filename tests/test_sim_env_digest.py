"""The sim's environment digest comes from what it runs, not from where its interpreter lives
(issue 34, item 9): every nox session has its own venv, and `nox -s env-sim probe-init
probe-serve` must share one attempt."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from omniprobe.env import simulated
from omniprobe.env.simulated import sim_env_digest
from omniprobe.harness.common.process import free_port

from .conftest import REPO

DIGEST = "from omniprobe.env.simulated import sim_env_digest; print(sim_env_digest())"


def twin_venv(folder: Path) -> Path:
    """A second virtual environment holding the very same packages as this one (its
    site-packages linked), as two nox sessions' venvs hold the same install: its python is
    another path."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (folder / "bin").mkdir(parents=True)
    (folder / "lib" / version).mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = "
                                       f"false\nversion = {'.'.join(map(str, sys.version_info[:3]))}\n")
    (folder / "bin" / "python").symlink_to(Path(sys._base_executable))
    (folder / "lib" / version / "site-packages").symlink_to(sysconfig.get_paths()["purelib"])
    return folder / "bin" / "python"


def digest_in(python: Path | str, src: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(python), "-c", DIGEST], env=env, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


@pytest.mark.e2e
def test_two_venvs_of_one_checkout_are_one_environment(tmp_path):
    twin = twin_venv(tmp_path / "twin")
    assert digest_in(twin, REPO / "src") == digest_in(sys.executable, REPO / "src")
    assert subprocess.run([str(twin), "-c", "import sys; print(sys.executable)"], text=True,
                          capture_output=True, check=True).stdout.strip() != sys.executable


def test_another_checkout_of_other_code_is_another_environment(tmp_path):
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    assert digest_in(sys.executable, tmp_path / "src") == digest_in(sys.executable, REPO / "src")
    with open(tmp_path / "src" / "omniprobe" / "sim" / "memory.py", "a") as handle:
        handle.write("\n# another line\n")
    assert digest_in(sys.executable, tmp_path / "src") != digest_in(sys.executable, REPO / "src")


@pytest.mark.parametrize("package", simulated.SIM_DISTRIBUTIONS)
def test_another_version_of_a_package_the_sim_runs_is_another_environment(package, monkeypatch):
    before = sim_env_digest()
    real = simulated._installed
    monkeypatch.setattr(simulated, "_installed",
                        lambda name: "0.0.1-other" if name == package else real(name))
    assert sim_env_digest() != before


@pytest.mark.e2e
def test_probe_init_then_probe_serve_from_two_venvs_share_one_attempt(repo_copy, tmp_path):
    twin = twin_venv(tmp_path / "twin")
    env = {**os.environ, "OMNIPROBE_ROOT": str(repo_copy.root), "PYTHONPATH": str(REPO / "src"),
           "OMNIPROBE_ARTIFACTS": str(tmp_path / "artifacts")}
    shape = ["--host", "sim", "--flag-set", "fp8", "--fixture", "sim-single"]
    first = subprocess.run([sys.executable, "-m", "omniprobe", "probe-init", *shape, "--fresh",
                            "--port", str(free_port())], env=env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run([str(twin), "-m", "omniprobe", "probe-serve", *shape,
                             "--port", str(free_port())], env=env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    attempts = sorted((repo_copy.evidence_dir / "sim").glob("*-probe"))
    newest = attempts[-1].name
    assert f"probe-init on sim: attempt {newest} (new: --fresh)" in first.stdout + first.stderr
    assert f"probe-serve on sim: attempt {newest} (resumed" in second.stdout + second.stderr
