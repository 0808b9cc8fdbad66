"""The environment of a simulated host: omniprobe itself, run by this interpreter.

[env] pins the real stack (torch, vLLM-Omni, ...), which a simulated host never runs: its server is
`{python} -m omniprobe.sim`. So `omniprobe env build|check --host <simulated host>` installs
nothing and files no manifest. It checks that this interpreter starts the sim in a fresh process
with our environment, as the probe will, and that the references of the fixtures it runs (the
simulated ones and the stand-ins) match their digests.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import omniprobe
from omniprobe import __version__
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.digests import sha256_bytes, sha256_json
from omniprobe.env.check_record import describe_checks, failure_lines
from omniprobe.env.nvml_facts import emulation_check, gpu_checks, host_facts
from omniprobe.env.preflight import serve_preflight
from omniprobe.env.references import references_check
from omniprobe.env.state import Runner
from omniprobe.evidence.models.environment import EnvCheck

SIM_MODULE = "omniprobe.sim"
_PROBE = (f"import json, sys, {SIM_MODULE} as sim; print(json.dumps({{"
          "'version': '%d.%d.%d' % sys.version_info[:3], 'module': sim.__file__}))")


@dataclass(frozen=True)
class SimEnv:
    host: str
    python: str
    checks: list[EnvCheck]

    @property
    def problems(self) -> list[str]:
        return failure_lines(self.checks)

    @property
    def ok(self) -> bool:
        return not self.problems


def interpreter_check(python: str, runner: Runner) -> EnvCheck:
    """Whether `python` imports the sim in a fresh process under this process's environment."""
    proc = runner.run([python, "-c", _PROBE])
    if proc.returncode != 0:
        return EnvCheck(name="sim.interpreter", status="fail", expected=f"imports {SIM_MODULE}",
                        detail=f"{python} cannot import {SIM_MODULE}: "
                               f"{proc.stderr.strip()[-400:] or f'exit {proc.returncode}'}")
    found = json.loads(proc.stdout)
    return EnvCheck(name="sim.interpreter", status="pass", actual=f"Python {found['version']}",
                    detail=f"{python} runs the simulated server from {found['module']}")


def check_sim_env(cfg: HostsConfig, project: Project, host: str, *, python: str = sys.executable,
                  runner: Runner | None = None, nvml=None) -> SimEnv:
    """The checks of a simulated host's env; ValueError for a real host. A simulated server
    emulated on a real GPU also has that GPU checked through NVML (`nvml` stands in for pynvml)."""
    if not cfg.host(host).simulated:
        raise ValueError(f"host {host!r} is not simulated; its env is built from [env]")
    skipped = EnvCheck(name="env.install", status="skip",
                       detail="simulated host: nothing is installed ([env] pins the real stack; "
                              f"its server is {SIM_MODULE} run by this interpreter)")
    runner = runner or Runner()
    checks = [skipped, interpreter_check(python, runner),
              *sim_preflight(cfg, project, host, runner=runner),
              references_check(project, simulated=True,
                               max_pixels=cfg.probe.max_reference_pixels)]
    emulation = cfg.host(host).emulation
    if emulation is not None and emulation.mechanism == "memory-fraction":
        facts = host_facts(nvml)
        checks += [*gpu_checks(cfg.host(host), facts, cfg.vram_tolerance),
                   emulation_check(cfg.emulated_cap_mib(host), facts)]
    return SimEnv(host, python, checks)


# What a simulated server runs besides the standard library and omniprobe: Pillow and NumPy
# (its images), pynvml and torch where it is emulated on a GPU; and what the harness measuring it
# reads its evidence with (pydantic, requests).
SIM_DISTRIBUTIONS = ("pillow", "numpy", "nvidia-ml-py", "torch", "pydantic", "requests")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def source_digest() -> str:
    """sha256 of omniprobe's own source files (path and bytes of every .py and data file under
    the package, compiled bytecode aside): another checkout of other code is another env."""
    package = Path(omniprobe.__file__).parent
    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix != ".pyc")
    return sha256_json({p.relative_to(package).as_posix(): sha256_bytes(p.read_bytes())
                        for p in files})


def sim_env_digest() -> str:
    """A simulated host's environment as a probe attempt records it: what the sim runs (Python's
    version, its packages' versions, omniprobe's version and a digest of its source), never where
    the interpreter lives, so every nox session's venv of one checkout is one environment."""
    return sha256_json({"python": platform.python_version(), "omniprobe": __version__,
                        "source": source_digest(),
                        "packages": {name: _installed(name) for name in SIM_DISTRIBUTIONS}})


def sim_preflight(cfg: HostsConfig, project: Project, host: str, *,
                  runner: Runner | None = None, flag_sets: tuple[str, ...] = ()) -> list[EnvCheck]:
    """The serve preflight of a simulated host (of `flag_sets`; empty: all): its command runs
    with this interpreter."""
    return serve_preflight(cfg, host, project.hosts_file, python=sys.executable, bin_dir=None,
                           runner=runner or Runner(), flag_sets=flag_sets)


def format_sim_env(env: SimEnv) -> str:
    lines = describe_checks(f"env {env.host} (simulated: nothing to build) for {env.python}",
                        env.checks)
    lines.append("manifest: not filed (a simulated host's env is omniprobe itself)")
    return "\n".join(lines) + "\n"
