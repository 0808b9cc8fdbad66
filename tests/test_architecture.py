"""The data flow as the imports show it: the import contracts in pyproject.toml, and what
importing the report and the verdicts loads."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
NOT_FOR_ANALYSIS = ("omniprobe.harness", "omniprobe.env", "omniprobe.sim", "pynvml")


def test_the_import_contracts_are_kept():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True) == 0


BREACHES = [
    ("analysis/verdicts.py", "import omniprobe.harness.sampler",
     "analysis and report run with no GPU, harness, env or simulator code"),
    ("report/render.py", "import pynvml",
     "analysis and report run with no GPU, harness, env or simulator code"),
    ("sim/model.py", "import omniprobe.harness.client",
     "the simulator never imports the harness, except the offline runner it reuses"),
    ("config/hosts.py", "import omniprobe.evidence.models", "configuration never imports evidence"),
    ("harness/offline_runner.py", "import omniprobe.errors",
     "the offline runner stands alone: it runs in the probe venv, without omniprobe"),
    ("harness/offline_runner.py", "import omniprobe.harness.server",
     "the offline runner stands alone: it runs in the probe venv, without omniprobe"),
]


@pytest.mark.parametrize(("module", "line", "contract"), BREACHES, ids=[f"{b[0]}:{b[1]}" for b in BREACHES])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    shutil.copytree(ROOT / "src" / "omniprobe", tmp_path / "src" / "omniprobe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "src" / "omniprobe" / module, "a") as handle:
        handle.write(f"\n{line}\n")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{contract} BROKEN" in done.stdout
    assert "Contracts: 4 kept" not in done.stdout


def _loaded_by(module: str) -> list[str]:
    """The modules a fresh interpreter holds after importing `module`."""
    done = subprocess.run(
        [sys.executable, "-c", f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
        check=True, timeout=60)
    return json.loads(done.stdout)


def _foreign(loaded: list[str]) -> list[str]:
    return [name for name in loaded
            if any(name == bad or name.startswith(bad + ".") for bad in NOT_FOR_ANALYSIS)]


@pytest.mark.parametrize("module", ["omniprobe.report.render", "omniprobe.analysis.verdicts"])
def test_rendering_and_verdicts_load_no_gpu_harness_env_or_sim_code(module):
    loaded = _loaded_by(module)
    assert module in loaded
    assert _foreign(loaded) == []


def test_the_check_sees_harness_modules_where_they_are_loaded():
    assert "omniprobe.harness.server" in _foreign(_loaded_by("omniprobe.harness.server"))
