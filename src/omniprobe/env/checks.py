"""Checking a host's environment: every check in its order (verify_env, planned_checks for a dry
run), the manifest it makes, and the gate a probe session passes (require_env_ok)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project, find_project
from omniprobe.env.allocator import ALLOC_VARS, check_allocator_env, uses_allocator_env
from omniprobe.env.check_record import env_check, failure_lines
from omniprobe.env.fetch_model import fetch_hint, hf_cache_dir
from omniprobe.env.nvml_facts import emulation_check, gpu_checks, host_facts, torch_check
from omniprobe.env.preflight import preflight_plan, serve_preflight
from omniprobe.env.references import references_check
from omniprobe.env.snapshot import pinned_snapshot, snapshot_checks, snapshot_folder
from omniprobe.env.state import (
    ENV_WORDS,
    EnvName,
    EnvNotReady,
    EnvPaths,
    Runner,
    build_command,
    env_config,
    env_paths,
    install_steps,
    pins_hash,
    stamp_state,
    uv_command,
)
from omniprobe.env.upstream_clone import clone_contract, contract_warnings
from omniprobe.env.venv import pin_check, pipeline_check, pipelines, probe_venv, python_check
from omniprobe.evidence.models.environment import EnvCheck, EnvManifest, EnvPython, EnvTimings


@dataclass
class Verification:
    """One check pass: the manifest it makes (timed by its checks alone; make_manifest adds the
    action, the build and the commands), where the env is, and whether its stamp is current."""

    manifest: EnvManifest
    paths: EnvPaths
    complete: bool  # the stamp records a complete build of exactly these pins

    @property
    def checks(self) -> list[EnvCheck]:
        return self.manifest.checks

    @property
    def failed(self) -> list[EnvCheck]:
        return self.manifest.failed_checks

    @property
    def ok(self) -> bool:
        return self.manifest.ok


def verify_env(cfg: HostsConfig, project: Project, host_name: str, paths: EnvPaths, *,
               runner: Runner, nvml: Any = None, which: EnvName = "probe") -> Verification:
    """Run every check of `host_name`'s environment `which` at `paths`; never changes anything.
    The Diffusers env runs no server: no serve preflight or upstream contract, but the pipeline."""
    host = cfg.host(host_name)
    env = env_config(cfg, project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    want = pins_hash(cfg, project, which)
    phases: dict[str, float] = {}
    checks: list[EnvCheck] = []

    def timed(phase: str, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            phases[phase] = round(time.perf_counter() - start, 4)

    current, why = stamp_state(paths, want)
    checks.append(env_check("env.stamp", "pass" if current else "fail", why))

    facts = timed("host", host_facts, nvml)
    checks.append(host_name_check(cfg, host_name, facts.hostname))

    names = [step.name for step in steps]
    torch_pinned = "torch" in names
    probe, why = timed("venv", probe_venv, paths, names, torch_pinned, runner,
                       cfg.stack.offline_env)
    checks.append(python_check(cfg.stack.python, probe, why))
    pins = []
    for step in steps:
        dist = probe["dists"].get(step.name) if probe else None
        check, pin = timed(f"pin:{step.name}", pin_check, step, dist, runner)
        checks.append(check)
        pins.append(pin)

    # The model argument the probe will give: the pinned snapshot's folder where it is cached.
    snapshot = None if host.simulated else pinned_snapshot(cfg)
    model = None if snapshot is None else str(snapshot.snapshot_path)
    if which == "probe":
        checks.extend(timed("preflight", lambda: serve_preflight(
            cfg, host_name, project.hosts_file, python=str(paths.python), bin_dir=paths.bin_dir,
            runner=runner, model=model)))
    else:
        checks.append(timed("pipeline", pipeline_check, cfg, host, paths, runner))
    checks.extend(gpu_checks(host, facts, env.checks.vram_tolerance))
    if host.emulation is not None:
        checks.append(emulation_check(cfg.emulated_cap_mib(host_name), facts))
    checks.append(torch_check(host, probe, torch_pinned))
    checks.append(timed("allocator", check_allocator_env, cfg, host_name, paths, runner,
                        torch_pinned))
    checks.extend(timed("snapshot", snapshot_checks, cfg, project))
    checks.append(timed("references", lambda: references_check(
        project, simulated=host.simulated, max_pixels=cfg.probe.max_reference_pixels)))

    upstream, upstream_note = (None, None) if host.simulated or which != "probe" else timed(
        "upstream", clone_contract, cfg, project, paths)
    uv = uv_command()
    freeze: list[str] = []
    if paths.python.exists():
        proc = timed("freeze", runner.run, [uv, "pip", "freeze", "--python", str(paths.python)])
        freeze = proc.stdout.splitlines() if proc.returncode == 0 else []
    version = runner.run([uv, "--version"])
    uv_version = version.stdout.strip() if version.returncode == 0 else None
    verify_s = round(sum(phases.values()), 4)
    python = EnvPython(pinned=cfg.stack.python, version=probe["version"] if probe else None,
                       executable=probe["executable"] if probe else None)
    manifest = EnvManifest(
        host=host_name, env=which, action="verified", venv=str(paths.venv), pins_hash=want,
        uv_version=uv_version, python=python, host_facts=facts,
        model_snapshot=cfg.stack.model_snapshot, pins=pins, freeze=freeze, checks=checks,
        upstream=upstream, upstream_note=upstream_note,
        timings=EnvTimings(total_s=verify_s, verify_s=verify_s, phases=phases))
    return Verification(manifest=manifest, paths=paths, complete=current)


def host_name_check(cfg: HostsConfig, host_name: str, hostname: str) -> EnvCheck:
    """This machine's name against the host entry's, where the entry names a machine."""
    host = cfg.host(host_name)
    if host.simulated:
        return env_check("host.hostname", "skip", "simulated host: runs anywhere")
    if host.emulation is not None:
        return env_check("host.hostname", "skip", "emulated host: runs on any machine with its "
                         f"physical GPU ({host.gpu})")
    if host.gpu_minimum is not None:
        return env_check("host.hostname", "skip", "runs on any machine with a GPU of at least "
                         f"{host.gpu_minimum.memory_gib} GiB and compute capability "
                         f"{host.gpu_minimum.compute_capability}")
    return hostname_check(cfg, host_name, hostname)


def machine_refusal(cfg: HostsConfig, project: Project, host_name: str,
                    nvml: Any = None) -> str | None:
    """What a second tells before anything is downloaded: whether this machine is the host's
    (its name, and its GPU as NVML reads it, against the entry); why not, with the command that
    fixes it, or None."""
    host = cfg.host(host_name)
    facts = host_facts(nvml)
    checks = [host_name_check(cfg, host_name, facts.hostname),
              *gpu_checks(host, facts, env_config(cfg, project.hosts_file).checks.vram_tolerance)]
    failed = failure_lines(checks)
    if not failed:
        return None
    lines = "\n".join(f"  {line}" for line in failed)
    if host.gpu_minimum is not None or host.emulation is not None or host.diffusers is not None:
        remedy = (f"no build can change a machine: run it where NVML reads {host.gpu}")
    else:
        remedy = (f"no build can change a machine: run on the host's machine, name the host "
                  f"entry that is this one (--host), or add one with `omniprobe host add NAME "
                  f"--like {host_name}`")
    return (f"this machine cannot run host {host_name!r}: checked before anything is "
            f"downloaded or built:\n{lines}\n{remedy}")


def hostname_check(cfg: HostsConfig, host_name: str, hostname: str) -> EnvCheck:
    """This machine's name against the host entry's; a mismatch names the remedy: the entry
    that has this name, or the command that adds one (a build cannot change a hostname)."""
    host = cfg.host(host_name)
    if hostname == host.hostname:
        return env_check("host.hostname", "pass", "this machine's name against hosts.toml",
                         host.hostname, hostname)
    matching = [k for k, h in cfg.hosts.items()
                if h.hostname == hostname and not h.simulated and h.emulation is None]
    remedy = (f"host {' or '.join(matching)} in hosts.toml is this machine: run with --host "
              f"{matching[0]}" if matching else
              f"no host entry is this machine: add one with `omniprobe host add NAME --like "
              f"{host_name}`, then run with --host NAME")
    return env_check("host.hostname", "fail", f"this machine's name against hosts.toml; "
                     f"{remedy}", host.hostname, hostname)


def planned_checks(cfg: HostsConfig, project: Project, host_name: str, paths: EnvPaths,
               which: EnvName = "probe") -> list[str]:
    """Every check verify_env runs, in its order, for a dry run: `name: what it looks at`."""
    host = cfg.host(host_name)
    env = env_config(cfg, project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    repo, revision = cfg.stack.model_repo, cfg.stack.model_revision
    lines = [f"env.stamp: {paths.stamp} records a complete build of exactly these pins",
             f"host.hostname: this machine is {host.hostname}"
             if host.emulation is None and host.gpu_minimum is None else
             "host.hostname: skipped (the host runs on any machine with its GPU)",
             f"python.version: {paths.python} is Python {cfg.stack.python}"]
    lines += [f"package.{step.name.lower()}: {step.name} {step.pin} is what the venv holds"
              for step in steps]
    if which == "probe":
        lines += preflight_plan(cfg, host_name, project.hosts_file, paths,
                                model=snapshot_folder(cfg))
    else:
        lines.append(f"diffusers.pipeline: the venv's diffusers holds "
                     f"{', '.join(pipelines(cfg, host)) or 'no pipeline (no profile)'}")
    least = host.gpu_minimum
    lines.append("gpu.nvml, gpu.name, gpu.compute_capability, gpu.memory, gpu.driver: NVML's "
                 + (f"device against {host.gpu}, sm {host.compute_capability}, {host.vram_gb} GB"
                    if least is None else f"device against at least {least.memory_gib} GiB and "
                    f"sm {least.compute_capability}"))
    if host.emulation is not None:
        lines.append(f"emulation.cap: {cfg.emulated_cap_mib(host_name):,} MiB fits the "
                     f"physical {host.gpu}")
    lines.append(f"torch.cuda: the venv's torch sees {host.gpu} sm {host.compute_capability}")
    lines.append("torch.allocator_env: the allocator variable the venv's torch honours "
                 f"({' or '.join(ALLOC_VARS)}), read back from torch"
                 if uses_allocator_env(cfg, host_name) else
                 "torch.allocator_env: skipped (no flag set of this host sets it)")
    lines.append(f"model.snapshot: {repo} at the commit starting {revision} in the hub cache "
                 f"{hf_cache_dir()}; where it is missing, {fetch_hint(cfg)}")
    lines.append("model.snapshot_files: " + (
        f"every file against {env.checks.snapshot_manifest}" if env.checks.snapshot_manifest
        else "skipped (no snapshot_manifest: the seed states no file digests)"))
    lines.append("fixtures.references: the reference images of the fixtures this host runs "
                 "against their sha256 in fixtures/fixtures.json")
    if which == "probe":
        lines.append(f"upstream contract: the env's clone of {cfg.stack.upstream_repo} held "
                     "against the harness (a warning per failed check)")
    return lines


def describe_failures(verification: Verification) -> str:
    return "\n".join(f"  {line}" for line in failure_lines(verification.checks))


def remedy_line(failed: list[EnvCheck], host: str, which: EnvName) -> str:
    """What to run: a build repairs the env, never a hostname (its check names the remedy)."""
    build = f"run `{build_command(host, which)}` (it repairs an incomplete build)"
    if not any(c.name == "host.hostname" for c in failed):
        return build
    others = [c for c in failed if c.name != "host.hostname"]
    hint = ("this machine is not the host's: see host.hostname above for the entry that "
            "matches it, or `omniprobe host add`")
    return f"{hint}; then, for the other checks, {build}" if others else hint


def require_env_ok(host: str, *, project: Project | None = None, venv: str | Path | None = None,
                   nvml: Any = None, runner: Runner | None = None,
                   out: TextIO | None = None, which: EnvName = "probe") -> Verification:
    """For probe sessions: the verified env `which` of `host`, or EnvNotReady naming each failed
    check and the command that builds it.
    Each upstream contract check its clone fails is a warning to `out` (a probe may still be
    worth its GPU time: the check may fail because upstream really behaves so)."""
    project = project or find_project()
    cfg = load_hosts(project.hosts_file)
    paths = env_paths(cfg, project, host, venv, which)
    verification = verify_env(cfg, project, host, paths, runner=runner or Runner(), nvml=nvml,
                              which=which)
    if not verification.ok:
        raise EnvNotReady(
            f"the {ENV_WORDS[which]} environment of host {host!r} at {paths.venv} is not usable:\n"
            f"{describe_failures(verification)}\n"
            f"{remedy_line(verification.failed, host, which)}")
    for line in contract_warnings(verification.manifest):
        print(f"warning: {line}", file=out or sys.stderr)
    return verification
