"""What a host's offline runs are: one entry per offline kwarg set (vLLM-Omni's `Omni(...)`), or on
a Diffusers host per Diffusers profile, each with the runner's engine, kwargs, environment and
sampling; and the facts of the Python a runner on the machine's own interpreter runs in."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omniprobe.config.diffusers import (
    ModelConfigs,
    int8_text_encoder_problems,
    load_model_configs,
    pipeline_problems,
)
from omniprobe.config.fixtures import Sampling
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.pinned_cache import pinned_cache_problems
from omniprobe.config.project import Project
from omniprobe.errors import EnvironmentFailure, InputError, Refusal
from omniprobe_engine.adapters import known_pipelines

# How long the runner's Python may take to answer --versions: it imports torch, transformers and
# diffusers and counts a build's parameters on the meta device, seconds alone but minutes on a
# loaded machine (two cores shared by a test run took over 120 s).
VERSIONS_TIMEOUT_S = 600.0


class PlanRefused(Refusal):
    """An offline entry asked for that the host does not run, or whose kwargs are not stated."""


class RunnerEnvBroken(EnvironmentFailure):
    """The runner's Python cannot say what it runs on (the runner's `--versions` failed)."""


@dataclass(frozen=True)
class OfflineEntry:
    """One row of a host's offline matrix."""

    name: str
    engine: str  # the runner's --engine
    kwargs: dict
    env: dict[str, str] = field(default_factory=dict)
    steps: int | None = None  # a profile's capacity settings, over the fixtures' sampling
    true_cfg_scale: float | None = None
    seeds: tuple[int, ...] | None = None
    weights: str | None = None
    expected_parameters: dict = field(default_factory=dict)  # component -> (billions, tolerance)
    allocator: str | None = None  # a profile's allocator setting, in the variable its torch reads

    @property
    def named(self) -> dict[str, str]:
        """How its records name it: a Diffusers profile, or an Omni engine's kwarg set."""
        return {"profile" if self.engine == "diffusers" else "kwarg_set": self.name}

    def runner_env(self, allocator_variable: str | None) -> dict[str, str]:
        """The entry's own environment, its allocator setting in `allocator_variable`."""
        if self.allocator is None:
            return dict(self.env)
        if allocator_variable is None:
            raise PlanRefused(f"Diffusers profile {self.name!r} sets the allocator, but the "
                              "runner's torch could not say which variable it reads")
        return {**self.env, allocator_variable: self.allocator}

    def sampling(self, sampling: Sampling) -> tuple[int, float, str]:
        """(steps, guidance, whose) for this entry's requests."""
        overridden = self.steps is not None or self.true_cfg_scale is not None
        return (self.steps if self.steps is not None else sampling.num_inference_steps,
                self.true_cfg_scale if self.true_cfg_scale is not None
                else sampling.true_cfg_scale,
                "profile" if overridden or self.seeds is not None else "fixtures")


def not_runnable(name: str) -> str:
    return (f"offline kwarg set {name!r} cannot run: hosts.toml [offline_kwarg_sets.{name}] has "
            "no 'kwargs' (the source does not state them); record them there first")


def _chosen(names: list[str], wanted: tuple[str, ...], host_name: str, what: str) -> list[str]:
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise PlanRefused(f"{what}(s) {', '.join(unknown)} are not run on host {host_name!r} "
                          f"(its {what}s: {', '.join(names) or 'none'})")
    return [n for n in names if not wanted or n in wanted]


def offline_matrix(cfg: HostsConfig, project: Project, host_name: str, host: Host,
                   wanted: tuple[str, ...]
                   ) -> tuple[list[OfflineEntry], list[str], ModelConfigs | None]:
    """(the entries to run, in hosts.toml order; refusals of those skipped; a random-weight
    host's model configs). A kwarg set without kwargs is refused: with an error when asked for
    by name, else skipped."""
    if host.diffusers is not None:
        return _diffusers_entries(cfg, project, host_name, host, wanted)
    chosen = _chosen(host.offline_kwarg_sets, wanted, host_name, "offline kwarg set")
    refusals = [not_runnable(k) for k in chosen if cfg.offline_kwarg_sets[k].kwargs is None]
    if wanted and refusals:
        raise PlanRefused("\n".join(refusals))
    entries = [OfflineEntry(k, "omni", cfg.offline_kwarg_sets[k].kwargs,
                            dict(cfg.offline_kwarg_sets[k].env))
               for k in chosen if cfg.offline_kwarg_sets[k].kwargs is not None]
    if not entries:
        raise PlanRefused("\n".join(refusals) if refusals
                          else f"host {host_name!r} has no offline kwarg sets")
    return entries, refusals, None


def _diffusers_entries(cfg: HostsConfig, project: Project, host_name: str, host: Host,
                       wanted: tuple[str, ...]
                       ) -> tuple[list[OfflineEntry], list[str], ModelConfigs | None]:
    spec = host.diffusers
    chosen = _chosen(host.diffusers_profiles, wanted, host_name, "Diffusers profile")
    unserved = unknown_pipelines({name: cfg.diffusers_profiles[name].pipeline for name in chosen})
    if unserved:
        raise PlanRefused(unserved)
    configs = (load_model_configs(project.root, spec.configs) if spec.weights == "random"
               else None)
    if configs is not None:  # a configuration the project refuses: before any attempt
        every = {name: cfg.diffusers_profiles[name] for name in host.diffusers_profiles}
        mine = {name: every[name] for name in chosen}
        transformer = configs.components.get("transformer")
        problems = (pipeline_problems(every, configs, str(project.hosts_file), host_name)
                    + int8_text_encoder_problems(mine, configs, str(project.hosts_file))
                    + (pinned_cache_problems(
                        mine, transformer.config, {n: cfg.output_resolution(n) for n in mine},
                        cfg.probe.target_reference_count,
                        host.emulation.host_ram_gib if host.emulation else None, host_name,
                        str(project.hosts_file)) if transformer is not None else []))
        if problems:
            raise InputError(problems)
    weights = ({"kind": "random", "seed": spec.init_seed,
                "components": configs.engine_components()}
               if configs is not None else {"kind": "snapshot"})
    expected = {} if configs is None else {
        name: (c.expected_parameters_b.value, c.expected_parameters_b.tolerance)
        for name, c in configs.components.items() if c.expected_parameters_b is not None}
    entries = []
    for name in chosen:
        profile = cfg.diffusers_profiles[name]
        entries.append(OfflineEntry(
            name, "diffusers", {"profile": profile.model_dump(mode="json"), "weights": weights,
                                "output_resolution": cfg.output_resolution(name)},
            {}, profile.steps, profile.true_cfg_scale,
            tuple(profile.seeds) if profile.seeds is not None else None, spec.weights, expected,
            profile.allocator))
    return entries, [], configs


def unknown_pipelines(pipelines: dict[str, str]) -> str | None:
    """Why profiles naming a pipeline no Diffusers adapter serves cannot run, each by name; None
    when every pipeline has one."""
    known = known_pipelines()
    unknown = {name: p for name, p in pipelines.items() if p not in known}
    if not unknown:
        return None
    return "\n".join(f"Diffusers profile {name!r}: pipeline {p!r} has no adapter in "
                      f"omniprobe_engine/adapters/ (adapters serve "
                      f"{', '.join(known)}); add one, or name one of those"
                      for name, p in unknown.items())


MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")


def missing_package(python: str, module: str) -> str:
    """What to do when the runner's Python lacks a module the Diffusers engine imports: install
    the engine's packages there, or run the runner in the Diffusers env."""
    top = module.split(".")[0]
    return (f"the runner's Python {python} has no module {top!r}, which the Diffusers engine "
            "imports. Either run the runner in the Diffusers env (runner_env = \"diffusers\" in "
            "the host's [hosts.<name>.diffusers]; `nox -s probe-capacity -- --host HOST` builds "
            "it first), or install the engine's packages into that Python (the wheels of "
            "wheels/h200.txt: `omniprobe wheels --dest .whl` where a registry is reachable, then "
            f"`{python} -m pip install --no-index --no-deps .whl/*.whl`)")


def runner_facts(command: list[str], env: dict[str, str],
                 profiles: dict[str, dict] | None = None, components: dict | None = None,
                 timeout_s: float = VERSIONS_TIMEOUT_S) -> dict:
    """The runner's `--versions` in the runner's Python (`command` runs the runner): the
    packages it runs on; given Diffusers profiles by name, those its engine would refuse
    (`refusals`, in the engine's words); given a random build's components, each weighted
    component's parameters (`parameters`), counted before anything is built."""
    with tempfile.TemporaryDirectory(prefix="omniprobe-asked-") as folder:
        extra = []
        if profiles or components:
            extra = [str(Path(folder) / "asked.json")]
            Path(extra[0]).write_text(json.dumps({"profiles": profiles or {},
                                                  "components": components}), encoding="utf-8")
        return _facts(command, env, extra, timeout_s)


def _facts(command: list[str], env: dict[str, str], extra: list[str], timeout_s: float) -> dict:
    try:
        done = subprocess.run([*command, "--versions", *extra], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise RunnerEnvBroken(f"the runner's Python did not answer --versions within "
                              f"{timeout_s:g} s") from None
    except OSError as exc:
        raise RunnerEnvBroken(f"the runner's Python did not answer --versions: {exc}") from None
    if done.returncode != 0:
        missing = MISSING_MODULE.search(done.stderr or "")
        if missing is not None:
            raise RunnerEnvBroken(missing_package(command[0], missing[1]))
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RunnerEnvBroken(f"the runner's Python failed --versions (exit {done.returncode}): "
                              + " | ".join(tail))
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RunnerEnvBroken(f"--versions printed no JSON: {done.stdout[-300:]!r}") from None
    if not isinstance(facts, dict) or not isinstance(facts.get("packages"), dict):
        raise RunnerEnvBroken(f"--versions printed {facts!r}, expected its packages")
    return facts
