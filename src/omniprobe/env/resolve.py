"""Before anything is installed: the whole install plan resolves, and a pin whose source is an
upstream recipe agrees with it.

`uv pip compile` resolves every [[env.install]] requirement at once, each pin also a constraint,
for the pinned interpreter; it installs nothing. A clash is a `ResolutionConflict` naming which
requirement of which package meets which pin, with uv's own explanation and what the seed says
about how it installed the pins concerned. A step with an `override` (hosts.toml, chosen by
omniprobe) replaces every other requirement on its package (uv --override) instead. An index or
host the resolver (or git) cannot reach is `Unreachable`, naming it, never a clash.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from omniprobe.config.stack import InstallStep
from omniprobe.env.state import EnvBuildError, Runner

# "... gitpkg-b==0.1.0 depends on six>=1.17 ..." in uv's explanation of a failed resolution.
# ("... all versions of alpha depend on beta>=2.0 ..." where the package has one version.)
_DEPENDS = re.compile(r"([A-Za-z0-9][\w.-]*?)(?:==([\w.+!-]+))? depends? on "
                      r"([A-Za-z0-9][\w.-]*?)([<>=!~][^\s,]*)?(?=[\s,]|$)")
# uv's hint: "`beta` was found on URL, but not at the requested version (beta>=2.0)."
_FOUND_ON = re.compile(r"`([^`]+)` was found on (\S+), but not at the requested version \(([^)]+)\)")
# A version a recipe names for vLLM ("vllm==0.31.0", "vLLM 0.31.0", "vllm>=0.31.0"), not vLLM-Omni's.
_RECIPE_VERSION = r"(?i)\b{name}\b(?![-_]omni)[^\n\d]{{0,20}}?v?(\d+\.\d+(?:\.\d+)?)"


class ResolutionConflict(EnvBuildError):
    """The install plan does not resolve: nothing was installed."""


class Unreachable(EnvBuildError):
    """An index or host the build needs could not be reached: the network's failure, not the
    plan's."""


# The URL a failed request names: uv's "Failed to fetch: URL" / "error sending request for url
# (URL)", git's "unable to access 'URL'".
_FAILED_URL = re.compile(r"(?:Failed to fetch|Failed to download|error sending request for url|"
                         r"unable to access)[:\s`('\"]*(https?://[^\s`)'\"]+)")
# What uv, git (curl) and the resolver say when the other end cannot be reached at all.
_NO_CONNECTION = re.compile(
    r"(Connection refused[^\n]*|dns error[^\n]*|failed to lookup address[^\n]*|"
    r"Could not resolve host[^\n]*|Network is unreachable[^\n]*|No route to host[^\n]*|"
    r"tcp connect error[^\n]*|Failed to connect to[^\n]*|operation timed out[^\n]*|"
    r"Connection timed out[^\n]*|Temporary failure in name resolution[^\n]*)", re.IGNORECASE)
# uv's chain of reasons, innermost last: "  cause: ..." (older uv: "  Caused by: ...").
_CAUSE = re.compile(r"(?m)^\s*(?:cause|Caused by):\s*(.+)$")


def unreachable(output: str, argv: Sequence[str]) -> Unreachable | None:
    """The failure a command's output shows when it could not reach an index or host (the URL's
    host, uv's innermost reason and the command); None when it reached it."""
    sign = _NO_CONNECTION.search(output)
    if sign is None:
        return None
    url = _FAILED_URL.search(output)
    causes = _CAUSE.findall(output)
    reason = (causes[-1] if causes else sign.group(1)).strip()
    where = (f"{urlsplit(url.group(1)).hostname} ({url.group(1)})" if url
             else "an index or host")
    return Unreachable(
        f"cannot reach {where}: {reason}; the network or that server is down, not a clash of "
        "pins, so nothing was installed\n"
        f"  the command that failed: {shlex.join(argv)}\n"
        "  check the machine's network (a proxy, DNS, a firewall) or the index's URL in "
        "hosts.toml [[env.install]], then re-run")


class RecipeMismatch(EnvBuildError):
    """A pin disagrees with the upstream recipe it names as its source."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def index_pyproject(name: str, requirements: list[str], steps: list[InstallStep]) -> str:
    """A pyproject.toml whose dependencies are `requirements`, where each step with its own index
    takes its package from that index only (an explicit named index, `tool.uv.sources`) and
    every other package comes from the default index: torch's index cannot shadow the packages it
    also carries (an older filelock), as uv's first-index strategy with an extra index would."""
    indexed = [step for step in steps if step.index]
    out = ["[project]", f"name = {json.dumps(name)}", 'version = "0"',
           "dependencies = [" + ", ".join(json.dumps(r) for r in requirements) + "]", ""]
    for step in indexed:
        out += ["[[tool.uv.index]]", f"name = {json.dumps(index_name(step))}",
                f"url = {json.dumps(step.index)}", "explicit = true", ""]
    if indexed:
        out.append("[tool.uv.sources]")
        out += [f"{json.dumps(step.name)} = {{ index = {json.dumps(index_name(step))} }}"
                for step in indexed]
    return "\n".join(out) + "\n"


def index_name(step: InstallStep) -> str:
    return f"{_norm(step.name)}-index"


def plan_files(steps: list[InstallStep], requirement: Callable[[InstallStep], list[str]]
               ) -> tuple[str, str]:
    """The plan as (pyproject.toml of every non-editable step, requirements file of the
    editable ones: `-e PATH`)."""
    requirements, editables = [], []
    for step in steps:
        argv = requirement(step)
        if argv[:1] == ["--editable"]:
            editables.append(f"-e {argv[1]}\n")
        else:
            requirements.append(" ".join(argv))
    return index_pyproject("omniprobe-plan", requirements, steps), "".join(editables)


def override_lines(steps: list[InstallStep], requirement: Callable[[InstallStep], list[str]]
                   ) -> str:
    """The overrides file (uv --override): the pin of each step that overrides others'
    requirements on it; empty when none does."""
    return "".join(f"{' '.join(requirement(step))}\n" for step in steps if step.override)


def override_args(steps: list[InstallStep], overrides: Path | str) -> list[str]:
    """`--override FILE` where a step overrides, for the resolution and every install."""
    return ["--override", str(overrides)] if any(step.override for step in steps) else []


def compile_command(uv: str, python: str, pyproject: Path, editables: Path | None,
                    constraints: Path, steps: list[InstallStep], overrides: Path | str = ""
                    ) -> list[str]:
    """`uv pip compile` of the whole plan (index_pyproject: a step's own index serves its
    package only, as its install step's does)."""
    return [uv, "pip", "compile", "--quiet", "--no-header", "--python", python,
            "--constraint", str(constraints), *override_args(steps, overrides), str(pyproject),
            *([str(editables)] if editables else [])]


def explain_conflict(uv_output: str, steps: list[InstallStep]) -> list[str]:
    """One line per requirement of a package that meets a pin, as uv's explanation names them."""
    pins = {_norm(step.name): step for step in steps}
    found = []
    for package, version, wanted, spec in _DEPENDS.findall(" ".join(uv_output.split())):
        step = pins.get(_norm(wanted))
        if step is None or _norm(package) == _norm(wanted):
            continue
        own = pins.get(_norm(package))
        version = version or (own.version if own is not None and own.version else "")
        line = (f"{package}{'==' + version if version else ''} requires {wanted}{spec}, which "
                f"clashes with the pin {step.name} {step.pin} ([[env.install]] {step.name})")
        if step.seed_says:
            line += f"; the seed says: {step.seed_says}"
        if line not in found:
            found.append(line)
    return found


def resolve_plan(uv: str, python: str, steps: list[InstallStep], constraints_text: str,
                 requirement: Callable[[InstallStep], list[str]], runner: Runner,
                 echo: Callable[[str], None]) -> None:
    """Resolve the whole plan with every pin as a constraint; ResolutionConflict if it does not."""
    with tempfile.TemporaryDirectory(prefix="omniprobe-plan-") as folder:
        pyproject, editables = Path(folder) / "pyproject.toml", Path(folder) / "editables.in"
        constraints, overrides = Path(folder) / "pins.txt", Path(folder) / "overrides.txt"
        project_text, editable_text = plan_files(steps, requirement)
        pyproject.write_text(project_text)
        editables.write_text(editable_text)
        constraints.write_text(constraints_text)
        overrides.write_text(override_lines(steps, requirement))
        argv = compile_command(uv, python, pyproject, editables if editable_text else None,
                               constraints, steps, overrides)
        for step in steps:
            if step.override:
                echo(f"# {step.name} {step.pin} overrides every other requirement on "
                     f"{step.name} (uv --override; chosen by {step.override.chosen_by}: "
                     f"{step.override.reason})")
        echo(f"$ {' '.join(argv)}  # resolve the whole plan; installs nothing")
        proc = runner.run(argv)
    if proc.returncode == 0:
        echo(f"# the install plan resolves: {len(proc.stdout.splitlines())} line(s) pinned")
        return
    output = (proc.stderr or proc.stdout).strip()
    offline = unreachable(output, argv)
    if offline is not None:
        raise offline
    strategy = index_strategy(output)
    if strategy:
        raise ResolutionConflict(
            "the install plan does not resolve, so nothing was installed: not a clash of pins "
            f"but uv's index strategy: {strategy}\nuv pip compile says:\n{output[-2000:]}")
    clashes = explain_conflict(output, steps)
    raise ResolutionConflict(
        "the install plan does not resolve, so nothing was installed"
        + "".join(f"\n  {line}" for line in clashes)
        + ("" if clashes else "\n  (uv names no requirement of a package against a pin; "
                              "its explanation follows)")
        + ("\n  a pin meant to win over another package's requirement takes an override in "
           "its [[env.install]] step: override = { chosen_by = \"omniprobe\", reason = \"...\" } "
           "(uv --override)" if clashes else "")
        + f"\nuv pip compile says:\n{output[-2000:]}")


def index_strategy(uv_output: str) -> str | None:
    """What a failure that uv puts down to its index strategy says, in words; None for others.
    uv takes a package from the first index that holds it, so an index that carries an old
    version of a common package (torch's: filelock) hides every newer one on the next."""
    flat = " ".join(uv_output.split())
    if "index-strategy" not in flat and "first index that contains" not in flat:
        return None
    found = _FOUND_ON.search(flat)
    if found is None:
        return "uv considered only the first index holding a package, which lacks the version required"
    package, index, wanted = found.groups()
    return (f"{package} was taken from {index}, the first index that holds it, which has no "
            f"{wanted}; give that index to its own package only ([[env.install]] index: an "
            "explicit index of its step)")


def recipe_versions(text: str, name: str) -> list[str]:
    """The versions of `name` a recipe text names, in order, without repeats."""
    found = re.findall(_RECIPE_VERSION.format(name=re.escape(name)), text)
    return list(dict.fromkeys(found))


def require_recipe_agrees(step: InstallStep, clone: Path, commit: str) -> str:
    """Whether the pin agrees with the recipe file it names, in the upstream clone at `commit`:
    a line to print; RecipeMismatch when the recipe names other versions only."""
    path = clone / str(step.recipe)
    if not path.is_file():
        return (f"# {step.name} {step.version}: cannot check against {step.recipe}: the file is "
                f"not in the upstream clone at {commit[:12]}; the pin stands as hosts.toml states")
    named = recipe_versions(path.read_text(encoding="utf-8", errors="replace"), step.name)
    if step.version in named:
        return f"# {step.name} {step.version}: {step.recipe} at {commit[:12]} names it"
    if not named:
        return (f"# {step.name} {step.version}: cannot check against {step.recipe}: it names no "
                f"{step.name} version at {commit[:12]}; the pin stands as hosts.toml states")
    raise RecipeMismatch(
        f"{step.name} is pinned to {step.version}, but {step.recipe} at {commit[:12]} names "
        f"{', '.join(named)}; fix [[env.install]] {step.name} (nothing was installed)")
