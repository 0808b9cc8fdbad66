"""The data flow as the imports show it: the import contracts in pyproject.toml, and what
importing the report and the verdicts loads."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

import omniprobe

ROOT = Path(__file__).resolve().parents[1]
NOT_FOR_ANALYSIS = ("omniprobe.harness", "omniprobe.env", "omniprobe.sim", "pynvml")


def test_the_import_contracts_are_kept():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True) == 0


# One forbidden import per contract (two for the engine package): each must show as a broken edge.
BREACHES = [
    ("omniprobe/analysis/verdicts.py", "omniprobe.analysis.verdicts", "omniprobe.harness.common.sampler"),
    ("omniprobe/report/render.py", "omniprobe.report.render", "pynvml"),
    ("omniprobe/sim/model.py", "omniprobe.sim.model", "omniprobe.harness.serve.client"),
    ("omniprobe/sim/capacity.py", "omniprobe.sim.capacity", "omniprobe.config.hosts"),
    ("omniprobe/harness/common/sampler.py", "omniprobe.harness.common.sampler", "omniprobe.sim.memory"),
    ("omniprobe/env/preflight.py", "omniprobe.env.preflight", "omniprobe.harness.common.process"),
    ("omniprobe/upstream/checks.py", "omniprobe.upstream.checks", "omniprobe.harness.serve.client"),
    ("omniprobe/protocol.py", "omniprobe.protocol", "omniprobe.errors"),
    ("omniprobe/config/hosts.py", "omniprobe.config.hosts", "omniprobe.evidence.models"),
    ("omniprobe_engine/runner.py", "omniprobe_engine.runner", "omniprobe.errors"),
    ("omniprobe/harness/serve/probe.py", "omniprobe.harness.serve.probe", "omniprobe.cli.tables"),
    ("omniprobe_engine/diffusers_engine.py", "omniprobe_engine.diffusers_engine",
     "omniprobe.harness.common.process"),
    ("omniprobe_engine/emulation_site/sitecustomize.py",
     "omniprobe_engine.emulation_site.sitecustomize", "omniprobe_engine.protocol"),
    ("omniprobe_engine/search.py", "omniprobe_engine.search", "omniprobe_engine.runner"),
    ("omniprobe/harness/offline/capacity.py", "omniprobe.harness.offline.capacity",
     "omniprobe_engine.diffusers_engine"),
    ("omniprobe/classify/oom.py", "omniprobe.classify.oom", "omniprobe.harness.common.logs"),
    ("omniprobe/harness/common/sampler.py", "omniprobe.harness.common.sampler",
     "omniprobe.harness.serve.client"),
]


def test_a_forbidden_import_breaks_its_contract(tmp_path):
    for package in ("omniprobe", "omniprobe_engine"):
        shutil.copytree(ROOT / "src" / package, tmp_path / "src" / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for file, _, imported in BREACHES:
        with open(tmp_path / "src" / file, "a") as handle:
            handle.write(f"\nimport {imported}\n")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "src"), "COLUMNS": "300"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 15 broken." in done.stdout, done.stdout
    for _, importer, imported in BREACHES:
        assert re.search(rf"-\s+{re.escape(importer)} -> {re.escape(imported)} \(l\.", done.stdout), (
            importer, imported)


def import_circles(package: str) -> list[list[str]]:
    """Every circle of imports between the package's modules, an import made only for type
    checking included (Tarjan's strongly connected components of grimp's graph)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            circle = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(circle) > 1:
                circles.append(sorted(circle))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


@pytest.mark.parametrize("package", ["omniprobe", "omniprobe_engine"])
def test_no_import_runs_in_a_circle_not_even_for_type_checking(package):
    assert import_circles(package) == []


def test_a_type_only_circle_is_seen(tmp_path, monkeypatch):
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "views.py").write_text("from circled.part import Part\n")
    (package / "part.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from circled.views import Part\n")
    (package / "alone.py").write_text("import circled.part\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == [["circled.part", "circled.views"]]


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
    assert "omniprobe.harness.common.process" in _foreign(_loaded_by("omniprobe.harness.common.process"))


MODULE_LINES_MAX = 500
CATALOGUE_OPENING = '"""A single catalogue:'


def oversized_modules(package: Path) -> list[str]:
    """Modules over MODULE_LINES_MAX lines whose opening line does not say they are one catalogue."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MODULE_LINES_MAX and not (lines and lines[0].startswith(CATALOGUE_OPENING)):
            found.append(f"{path.relative_to(package)}: {len(lines)} lines")
    return found


def test_no_module_does_more_than_one_job_by_size():
    assert oversized_modules(Path(omniprobe.__file__).parent) == []


def test_an_oversized_module_is_seen_unless_it_says_it_is_a_catalogue(tmp_path):
    (tmp_path / "small.py").write_text('"""One job."""\n')
    (tmp_path / "big.py").write_text('"""Several jobs."""\n' + "x = 1\n" * MODULE_LINES_MAX)
    (tmp_path / "table.py").write_text(CATALOGUE_OPENING + ' checks."""\n' + "x = 1\n" * MODULE_LINES_MAX)
    assert oversized_modules(tmp_path) == [f"big.py: {MODULE_LINES_MAX + 1} lines"]


# Evidence files are written by the attempt store alone; write_section is defined in files.py.
EVIDENCE_WRITERS = {"evidence/attempts.py", "evidence/files.py"}


def evidence_writers(package: Path) -> list[str]:
    """Each module of `package` outside EVIDENCE_WRITERS that names write_section."""
    return sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                  if str(path.relative_to(package)) not in EVIDENCE_WRITERS
                  and re.search(r"\bwrite_section\b", path.read_text(encoding="utf-8")))


def test_the_attempt_store_writes_every_evidence_file():
    assert evidence_writers(Path(omniprobe.__file__).parent) == []


def test_a_module_writing_evidence_itself_is_seen(tmp_path):
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "attempts.py").write_text("write_section(folder, 'a.json', x)\n")
    (tmp_path / "env.py").write_text("from omniprobe.evidence.files import write_section\n")
    (tmp_path / "other.py").write_text("rewrite_sections = 1\n")
    assert evidence_writers(tmp_path) == ["env.py"]


def _files_marked(marker: str) -> list[str]:
    return sorted(path.name for path in (ROOT / "tests").glob("test_*.py")
                  if re.search(rf"(?m)^(?:@pytest\.mark\.{marker}\b|pytestmark = .*pytest\.mark\.{marker}\b)",
                               path.read_text(encoding="utf-8")))


def test_ci_runs_every_slow_test_the_default_run_deselects():
    """A test marked slow is deselected by pyproject.toml's addopts, so .ci/run must name it."""
    ci = (ROOT / ".ci" / "run").read_text()
    slow = _files_marked("slow")
    assert slow, "no slow test: the marker and this check would be dead"
    for name in slow:
        assert f"-m slow tests/{name}" in ci, name


def test_ci_runs_the_end_to_end_tier_the_default_run_deselects():
    """The e2e tier is deselected by addopts too: .ci/run runs all of it, and the README names it."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "not e2e" in addopts
    assert _files_marked("e2e"), "no e2e test: the marker and this check would be dead"
    steps = subprocess.run([str(ROOT / ".ci" / "run"), "--dry-run"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert "nox -s tests -- -m e2e" in steps
    assert "-- -m e2e" in (ROOT / "README.md").read_text()
