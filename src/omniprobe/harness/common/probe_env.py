"""Where a probe's server runs from: the env's check, before any attempt exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.config.selection import (
    session_venv,
)
from omniprobe.env.allocator import honoured_var
from omniprobe.env.check_record import failure_lines
from omniprobe.env.checks import require_env_ok
from omniprobe.env.fetch_model import hf_cache_dir
from omniprobe.env.manifest import env_digest, manifest_of
from omniprobe.env.serve_command import (
    base_command,
)
from omniprobe.env.simulated import sim_env_digest, sim_preflight
from omniprobe.env.snapshot import pinned_snapshot
from omniprobe.env.state import EnvNotReady
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.redaction import redact_text


@dataclass(frozen=True)
class ProbeEnv:
    """Where the server runs from (None: the simulator) and what the attempt records of it."""

    bin_dir: Path | None
    record: AttemptEnvironment
    alloc_var: str | None = None  # the allocator variable the env's torch honours


def prepare_env(project: Project, cfg: HostsConfig, host_name: str, *, by_hand: str | None,
                venv: str | None, flag_sets: tuple[str, ...] = (), nvml=None,
                out: TextIO | None = None) -> ProbeEnv:
    """The host's verified env and the model its server is given: the snapshot folder the env
    check found at the pinned revision, unless --model gave one by hand (recorded as such).
    EnvNotReady names each failed check; NotInEnv when the env lacks the serve program. Each
    upstream contract check the env's clone fails is a warning on `out`, before any GPU time is
    spent. A simulated host's server is omniprobe's own sim; its serve preflight (of
    `flag_sets`; empty: all) still runs."""
    if cfg.host(host_name).simulated:
        failed = failure_lines(sim_preflight(cfg, project, host_name, flag_sets=flag_sets))
        if failed:
            raise EnvNotReady(f"the serve preflight of host {host_name!r} fails, so no server "
                              "is started:\n" + "\n".join(f"  {line}" for line in failed))
        served = ServedModel(model=redact_text(by_hand) if by_hand else cfg.stack.model_repo,
                             source="by_hand" if by_hand else "simulated")
        return ProbeEnv(None, AttemptEnvironment(digest=sim_env_digest(), served=served))
    verification = require_env_ok(host_name, project=project, nvml=nvml, out=out,
                                   venv=session_venv(project, host_name) or venv)
    snapshot = None if by_hand else pinned_snapshot(cfg)
    if by_hand:
        served = ServedModel(model=redact_text(by_hand), source="by_hand")
    elif snapshot is None:  # the model.snapshot check passed a moment ago: the cache changed
        raise EnvNotReady(f"no single snapshot of {cfg.stack.model_snapshot} in the hub cache "
                          f"{hf_cache_dir()}; run `omniprobe env check --host {host_name}`")
    else:
        served = ServedModel(model=str(snapshot.snapshot_path), source="pinned",
                             revision=snapshot.commit_hash)
    bin_dir = verification.paths.bin_dir
    base_command(cfg, host_name, model=by_hand or served.model, hosts_file=project.hosts_file,
                 bin_dir=bin_dir)
    digest = env_digest(verification.manifest.pins, verification.checks, str(verification.paths.venv))
    return ProbeEnv(bin_dir, AttemptEnvironment(
        manifest=manifest_of(project.evidence_dir, host_name, digest), digest=digest,
        served=served, env="probe"), honoured_var(verification.checks))
