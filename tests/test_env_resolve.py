"""The install plan resolves before anything is installed: two pins that clash stop the build at
resolution, naming both requirements, with nothing installed. Local wheels only, no network."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile
from pathlib import Path

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.config.stack import InstallStep
from omniprobe.env.build import build_env
from omniprobe.env.resolve import (
    RecipeMismatch,
    ResolutionConflict,
    explain_conflict,
    index_strategy,
    recipe_versions,
    require_recipe_agrees,
    resolve_plan,
)
from omniprobe.env.state import Runner, env_paths, uv_command

from .env_scaffold import FakeNvml, make_world


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel with one empty module and the given Requires-Dist."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}\n" for path, data in files.items()) + f"{info}/RECORD,,\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", record)
    return wheel


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    """alpha 1.0 needs beta>=2.0; beta comes as 1.0 and 2.0; uv sees only this folder."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "alpha", "1.0", ("beta>=2.0",))
    make_wheel(folder, "beta", "1.0")
    make_wheel(folder, "beta", "2.0")
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(folder))
    monkeypatch.setenv("UV_OFFLINE", "1")
    return folder


def steps(alpha: str, beta: str) -> list[InstallStep]:
    return [InstallStep(name="alpha", version=alpha),
            InstallStep(name="beta", version=beta, seed_says="beta 1.0, installed on its own")]


def _pins(plan: list[InstallStep]) -> str:
    return "".join(f"{s.name}=={s.version}\n" for s in plan)


def _resolve(plan: list[InstallStep]) -> None:
    resolve_plan(uv_command(), sys.executable, plan, _pins(plan),
                 lambda s: [f"{s.name}=={s.version}"], Runner(), lambda line: None)


def test_pins_that_agree_resolve(wheels):
    _resolve(steps("1.0", "2.0"))


def test_clashing_pins_name_both_requirements(wheels):
    with pytest.raises(ResolutionConflict) as caught:
        _resolve(steps("1.0", "1.0"))
    message = str(caught.value)
    assert message.startswith("the install plan does not resolve, so nothing was installed\n")
    assert ("alpha==1.0 requires beta>=2.0, which clashes with the pin beta 1.0 "
            "([[env.install]] beta); the seed says: beta 1.0, installed on its own") in message
    assert "uv pip compile says:" in message


def test_the_build_stops_at_resolution_with_nothing_installed(wheels, tmp_path, monkeypatch):
    world = make_world(tmp_path / "world")
    text = world.project.hosts_file.read_text()
    text = text[:text.index("[[env.install]]")] + (
        '[[env.install]]\nname = "alpha"\nversion = "1.0"\n\n'
        '[[env.install]]\nname = "beta"\nversion = "1.0"\n')
    world.project.hosts_file.write_text(text)
    for key, value in world.env_vars.items():
        monkeypatch.setenv(key, value)
    # uv finds the interpreter running the tests even from inside a virtual environment.
    monkeypatch.setenv("PATH", f"{Path(sys._base_executable).parent}{os.pathsep}{os.environ['PATH']}")
    paths = env_paths(load_hosts(world.project.hosts_file), world.project, "testhost")
    echoed: list[str] = []
    with pytest.raises(ResolutionConflict, match=r"alpha==1\.0 requires beta>=2\.0, which clashes "
                                                 r"with the pin beta 1\.0"):
        build_env("testhost", project=world.project, nvml=FakeNvml(), echo=echoed.append)
    assert any(line.startswith("$ ") and " pip compile " in line for line in echoed)
    assert not any(" pip install " in line for line in echoed)
    assert not paths.venv.exists()  # not even created: nothing is half-installed


def test_explain_conflict_reads_uvs_words():
    output = ("× No solution found when resolving dependencies:\n  ╰─▶ Because gitpkg-b==0.1.0 "
              "depends on diffusers==0.40.0 and you require diffusers==0.36.0.dev0, we can "
              "conclude that your requirements are unsatisfiable.")
    plan = [InstallStep(name="diffusers", version="0.36.0.dev0")]
    assert explain_conflict(output, plan) == [
        "gitpkg-b==0.1.0 requires diffusers==0.40.0, which clashes with the pin diffusers "
        "0.36.0.dev0 ([[env.install]] diffusers)"]


VLLM = InstallStep(name="vllm", version="0.31.0", recipe="recipes/Qwen/Qwen-Image-2.1.md")


@pytest.mark.parametrize(("text", "versions"), [
    ("uv pip install vllm==0.31.0 --torch-backend=auto\n", ["0.31.0"]),
    ("Requires vLLM 0.31.0 and vLLM-Omni 0.32.0.\n", ["0.31.0"]),
    ("pip install vllm-omni==0.30.0\n", []),
])
def test_recipe_versions(text, versions):
    assert recipe_versions(text, "vllm") == versions


def test_the_recipe_check(tmp_path):
    assert "cannot check against recipes/Qwen/Qwen-Image-2.1.md: the file is not in" in \
        require_recipe_agrees(VLLM, tmp_path, "8484d85d1" + "0" * 31)
    recipe = tmp_path / "recipes" / "Qwen" / "Qwen-Image-2.1.md"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("```\nuv pip install vllm==0.31.0\n```\n")
    assert "names it" in require_recipe_agrees(VLLM, tmp_path, "8484d85d1")
    recipe.write_text("```\nuv pip install vllm==0.32.1\n```\n")
    with pytest.raises(RecipeMismatch, match="pinned to 0.31.0, but recipes/Qwen/Qwen-Image-2.1.md "
                                             "at 8484d85d1 names 0.32.1"):
        require_recipe_agrees(VLLM, tmp_path, "8484d85d1")


def test_an_override_lets_a_pin_win_over_another_packages_requirement(wheels):
    """Issue 23 item 1: alpha requires beta>=2.0, the plan pins beta 1.0. Without an override the
    resolution stops naming both (test_clashing_pins_name_both_requirements); with one it
    resolves, beta's pin replacing alpha's requirement (uv --override)."""
    from omniprobe.config.stack import StepOverride

    plan = steps("1.0", "1.0")
    plan[1] = plan[1].model_copy(update={"override": StepOverride(
        chosen_by="omniprobe", reason="the seed installs beta 1.0 beside alpha")})
    echoed: list[str] = []
    resolve_plan(uv_command(), sys.executable, plan, _pins(plan),
                 lambda s: [f"{s.name}=={s.version}"], Runner(), echoed.append)
    assert ("# beta 1.0 overrides every other requirement on beta (uv --override; chosen by "
            "omniprobe: the seed installs beta 1.0 beside alpha)") in echoed
    assert any(" --override " in line for line in echoed if line.startswith("$ "))
    assert echoed[-1].startswith("# the install plan resolves")


def test_the_build_installs_an_overridden_pin_and_files_it(wheels, tmp_path, monkeypatch):
    world = make_world(tmp_path / "world")
    text = world.project.hosts_file.read_text()
    text = text[:text.index("[[env.install]]")] + (
        '[[env.install]]\nname = "alpha"\nversion = "1.0"\n\n'
        '[[env.install]]\nname = "beta"\nversion = "1.0"\n'
        'override = { chosen_by = "omniprobe", reason = "beta 1.0 as the seed ran it" }\n')
    world.project.hosts_file.write_text(text)
    for key, value in world.env_vars.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{Path(sys._base_executable).parent}{os.pathsep}{os.environ['PATH']}")
    paths = env_paths(load_hosts(world.project.hosts_file), world.project, "testhost")
    result = build_env("testhost", project=world.project, nvml=FakeNvml(),
                       echo=lambda line: None, record=False)
    installs = [r.argv for r in result.ran if r.argv[1:3] == ("pip", "install")]
    assert len(installs) == 2 and all("--override" in argv for argv in installs)
    assert paths.overrides.read_text() == "beta==1.0\n"
    pins = {p.name: p for p in result.manifest.pins}
    assert (pins["alpha"].installed_version, pins["beta"].installed_version) == ("1.0", "1.0")
    assert pins["beta"].override == "chosen by omniprobe: beta 1.0 as the seed ran it"
    assert pins["alpha"].override is None


def simple_index(root: Path, wheels: list[tuple[str, str, tuple[str, ...]]]) -> str:
    """A PEP 503 simple index of the given wheels under `root`; its file:// URL."""
    for name, version, requires in wheels:
        (root / name).mkdir(parents=True, exist_ok=True)
        make_wheel(root / name, name, version, requires)
    for folder in (p for p in root.iterdir() if p.is_dir()):
        links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in sorted(folder.glob("*.whl")))
        (folder / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri()


@pytest.fixture
def indexes(tmp_path, monkeypatch) -> str:
    """A 'torch' index that also carries an old beta, as the cu130 index carries an old
    filelock; the default index holds the new beta and gamma, which needs it. Returns the torch
    index's URL."""
    torch_index = simple_index(tmp_path / "torch-index", [("alpha", "1.0", ()), ("beta", "1.0", ())])
    default = simple_index(tmp_path / "default-index", [("beta", "2.0", ()),
                                                       ("gamma", "1.0", ("beta>=2.0",))])
    for var in ("UV_NO_INDEX", "UV_FIND_LINKS", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UV_DEFAULT_INDEX", default)
    monkeypatch.setenv("UV_OFFLINE", "1")
    return torch_index


def test_a_steps_index_serves_its_package_only(indexes, tmp_path):
    """Issue 23 item 2: as an extra index under uv's first-index strategy, the torch index's old
    beta hides the default index's new one and the plan fails with a false clash; as the explicit
    index of its step, it resolves."""
    plan = [InstallStep(name="alpha", version="1.0", index=indexes),
            InstallStep(name="gamma", version="1.0")]
    echoed: list[str] = []
    resolve_plan(uv_command(), sys.executable, plan, _pins(plan),
                 lambda s: [f"{s.name}=={s.version}"], Runner(), echoed.append)
    assert echoed[-1].startswith("# the install plan resolves")
    # What the extra index did, and how its failure is explained: uv's index strategy, not pins.
    (tmp_path / "plan.in").write_text("alpha==1.0\ngamma==1.0\n")
    proc = Runner().run([uv_command(), "pip", "compile", "--python", sys.executable,
                         "--extra-index-url", indexes, str(tmp_path / "plan.in")])
    assert proc.returncode != 0
    assert index_strategy(proc.stderr) == (
        f"beta was taken from {indexes}, the first index that holds it, which has no beta>=2.0; "
        "give that index to its own package only ([[env.install]] index: an explicit index of "
        "its step)")
    assert index_strategy("Because alpha==1.0 depends on beta>=2.0 and you require beta==1.0") is None


def test_the_build_takes_only_its_package_from_a_steps_index(indexes, tmp_path, monkeypatch):
    world = make_world(tmp_path / "world")
    text = world.project.hosts_file.read_text()
    text = text[:text.index("[[env.install]]")] + (
        f'[[env.install]]\nname = "alpha"\nversion = "1.0"\nindex = "{indexes}"\n\n'
        '[[env.install]]\nname = "gamma"\nversion = "1.0"\n')
    world.project.hosts_file.write_text(text)
    for key, value in world.env_vars.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{Path(sys._base_executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = build_env("testhost", project=world.project, nvml=FakeNvml(),
                       echo=lambda line: None, record=False)
    assert {p.name: p.installed_version for p in result.manifest.pins} == {"alpha": "1.0",
                                                                          "gamma": "1.0"}
    freeze = [line for line in result.verification.manifest.freeze if line.startswith("beta")]
    assert freeze == ["beta==2.0"]
