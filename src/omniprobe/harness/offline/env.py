"""Which Python runs the offline runner, and the environment an offline attempt records."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import TextIO

from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.config.selection import session_venv
from omniprobe.digests import sha256_json
from omniprobe.env.allocator import read_back
from omniprobe.env.build import build_env, format_result
from omniprobe.env.checks import Verification, require_env_ok
from omniprobe.env.fetch_model import hf_cache_dir
from omniprobe.env.manifest import env_digest, manifest_of
from omniprobe.env.simulated import sim_env_digest
from omniprobe.env.snapshot import pinned_snapshot
from omniprobe.env.state import EnvName, Runner
from omniprobe.errors import EnvironmentFailure, Refusal
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.harness.common.options import OfflineOptions
from omniprobe.harness.common.probe_env import prepare_env
from omniprobe.harness.common.session import Context
from omniprobe.harness.offline.matrix import OfflineEntry, runner_facts
from omniprobe.redaction import redact_text
from omniprobe_engine.launch import runner_folder

_PLACEHOLDER = re.compile(r"\{(python|runner|hosts_file|host)\}")


@dataclass(frozen=True)
class RunnerCommand:
    """How the offline runner is started, and the built env whose Python runs it (None: the
    Python running omniprobe)."""

    argv: list[str]
    # argv as an environment's digest reads it: `{runner}` unfilled, since its folder is made
    # anew by each process (launch.py) while what it runs is the same.
    recorded_argv: list[str]
    env: EnvName | None = None
    verification: Verification | None = None


def runner_env_name(host: Host) -> EnvName | None:
    """The built env a host's offline runner runs in: the Diffusers env for a Diffusers host whose
    runner_env says so, the probe env where no offline_command is given, else None."""
    if host.diffusers is not None and host.diffusers.runner_env == "diffusers":
        return "diffusers"
    return None if host.offline_command else "probe"


def build_diffusers_env(project: Project, host_name: str, host: Host, out: TextIO) -> None:
    """`--build-env`: where the host's runner runs in the Diffusers env, build it, or only verify
    it when nothing changed (`omniprobe env build --env diffusers`), saying what it did; a runner
    on another Python needs nothing built."""
    if runner_env_name(host) != "diffusers":
        return
    built = build_env(host_name, project=project, which="diffusers",
                      echo=lambda line: print(line, file=out))
    print(format_result(built, project), end="", file=out)


def runner_command(cfg: HostsConfig, project: Project, host_name: str,
                   venv: str | None = None, *, nvml=None, out: TextIO | None = None
                   ) -> RunnerCommand:
    """The host's offline_command (default: {python} {runner}), {python} being the Python of the
    env the runner runs in (runner_env_name) or the one running omniprobe, {runner} the folder
    that runs the engine package alone (omniprobe_engine/launch.py); refuses a built env
    that fails any check (EnvNotReady names each and the command that builds it), as the probe
    sessions do, and warns on `out` of each upstream contract check its clone fails."""
    host = cfg.host(host_name)
    which, verification, python = runner_env_name(host), None, sys.executable
    if which is not None:
        # The env session's venv is the probe env's; the Diffusers env lies at its own folder.
        venv = (session_venv(project, host_name) or venv) if which == "probe" else None
        verification = require_env_ok(host_name, project=project, venv=venv, nvml=nvml, out=out,
                                      which=which)
        python = str(verification.paths.python)
    fill = {"python": python, "hosts_file": str(project.hosts_file), "host": host_name}

    def filled(runner: str) -> list[str]:
        return [_PLACEHOLDER.sub(lambda m: {**fill, "runner": runner}[m[1]], part)
                for part in host.offline_command or ["{python}", "{runner}"]]

    return RunnerCommand(filled(str(runner_folder())), filled("{runner}"), which, verification)


def runner_env(cfg: HostsConfig, entry: OfflineEntry, base: dict[str, str],
               allocator_variable: str | None = None) -> dict[str, str]:
    """Ours, the stack's offline variables, the entry's, and CUDA numbering GPUs as NVML."""
    return {**base, **cfg.stack.offline_env, **entry.runner_env(allocator_variable),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class AllocatorUnknown(EnvironmentFailure):
    """The runner's torch does not read an allocator setting back: a profile that sets one could
    measure the plain configuration."""


def offline_environment(ctx: Context, options: OfflineOptions, runner: RunnerCommand,
                        configs, entries: list[OfflineEntry], *, host_ram_mib: int | None = None,
                        nvml=None) -> tuple[AttemptEnvironment, dict]:
    """The environment an offline attempt runs in and the model its runner is given, recorded so
    a resume continues only in the same one; and the runner's facts (empty unless it runs on the
    machine's own Python)."""
    host, command = ctx.host, runner.argv
    if host.simulated:
        served = ServedModel(model=redact_text(options.model) if options.model
                             else ctx.cfg.stack.model_repo,
                             source="by_hand" if options.model else "simulated")
        return AttemptEnvironment(digest=sim_env_digest(), served=served), {}
    if runner.env == "probe":  # a real host's pinned venv: the probe's own check
        env = prepare_env(ctx.project, ctx.cfg, ctx.host_name, by_hand=options.model,
                          venv=options.venv, nvml=nvml, out=ctx.out)
        return env.record, {}
    if runner.verification is None:  # the machine's own Python: what it runs on, as it says
        facts = runner_facts(command, dict(os.environ), {
            e.name: e.kwargs["profile"] for e in entries if e.engine == "diffusers"},
            configs.engine_components() if configs is not None else None)
        packages, manifest = facts["packages"], None
        digest = sha256_json({"python": facts.get("python"), "packages": packages,
                              "runner": runner.recorded_argv})
    else:  # the Diffusers env: its verified pins and checks, as the probe env's record has them
        v, facts, packages = runner.verification, {}, {}
        digest = env_digest(v.pins, v.checks, str(v.paths.venv))
        manifest = manifest_of(ctx.project.evidence_dir, ctx.host_name, digest, runner.env)
    if configs is not None:
        served = ServedModel(model="random", source="random", configs=configs.folder,
                             config_digests=configs.digests, init_seed=host.diffusers.init_seed)
    elif options.model is None and host.diffusers is not None:
        served = pinned_served(ctx)
    else:
        served = ServedModel(model=redact_text(options.model or ctx.cfg.stack.model_repo),
                             source="by_hand")
    variable = None
    if any(e.allocator for e in entries):  # the one rule: torch reads it back, as the env check
        check = read_back(command[0], Runner(), dict(os.environ))
        if check.status != "pass":
            raise AllocatorUnknown(f"the runner's Python {command[0]}: {check.detail}")
        variable = check.actual
    return AttemptEnvironment(manifest=manifest, digest=digest, served=served,
                              packages=packages, allocator_variable=variable,
                              env=runner.env, host_ram_cap_mib=host_ram_mib), facts


class SnapshotMissing(Refusal):
    """A snapshot-weight host whose pinned snapshot is not in the hub cache."""


def pinned_served(ctx: Context) -> ServedModel:
    """The pinned snapshot's folder in the hub cache, as a Diffusers host with snapshot weights
    loads it (the repo id would resolve through the cache's `main` ref, which need not be the
    pin); refused, naming the cache, when it is not there exactly once."""
    snapshot = pinned_snapshot(ctx.cfg)
    if snapshot is None:
        raise SnapshotMissing(f"no single snapshot of {ctx.cfg.stack.model_snapshot} in the hub "
                              f"cache {hf_cache_dir()}: fetch it there, or pass --model PATH")
    return ServedModel(model=str(snapshot.snapshot_path), source="pinned",
                       revision=snapshot.commit_hash)
