"""The environment manifest as evidence: made from a verification, filed as a new attempt
evidence/<host>/<attempt-id>/ (attempt.json + environment.json), and summarised for the report."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.digests import sha256_json
from omniprobe.env.checks import Verification
from omniprobe.env.state import CommandRun
from omniprobe.errors import InputError
from omniprobe.evidence.attempts import file_attempt, free_attempt_id, provenance
from omniprobe.evidence.files import ATTEMPT_FILE, parse_file
from omniprobe.evidence.models.attempt import Attempt
from omniprobe.evidence.models.environment import CommandTiming, EnvCheck, EnvManifest, EnvPin, EnvTimings

MANIFEST_FILE = "environment.json"
ATTEMPT_SUFFIX = "-env"


def make_manifest(verification: Verification, action: Literal["built", "verified"], *,
                  ran: list[CommandRun], build_s: float | None, total_s: float) -> EnvManifest:
    """The manifest of `verification`, filed as `action`, timed with the build and the commands."""
    checked = verification.manifest
    return checked.model_copy(update={"action": action, "timings": EnvTimings(
        total_s=round(total_s, 4),
        build_s=None if build_s is None else round(build_s, 4),
        verify_s=checked.timings.verify_s,
        phases=checked.timings.phases,
        commands=[CommandTiming(command=list(r.argv), returncode=r.returncode,
                                seconds=round(r.seconds, 4)) for r in ran],
    )})


def fingerprint(manifest: EnvManifest) -> str:
    """What the environment is, leaving out how long it took and whether this run installed."""
    state = manifest.model_dump(mode="json", exclude={"timings", "action"})
    return sha256_json(state)


def env_digest(pins: list[EnvPin], checks: list[EnvCheck], where: str) -> str:
    """What a probe attempt records of its environment: the pins as resolved and each check's
    outcome (not its wording, which names paths and times), and where the env runs from."""
    return sha256_json({
        "where": where,
        "pins": [p.model_dump(mode="json", include={"name", "pin", "resolved"}) for p in pins],
        "checks": [c.model_dump(mode="json", include={"name", "status", "expected", "actual"})
                   for c in checks]})


def manifest_of(evidence_dir: Path, host: str, digest: str, env: str = "probe") -> str | None:
    """The attempt id of the host's newest manifest of env `env` if it is of the env with
    `digest`."""
    latest = latest_manifest(evidence_dir, host, env)
    if latest is None:
        return None
    folder, manifest = latest
    return folder.name if env_digest(manifest.pins, manifest.checks, manifest.venv) == digest \
        else None


def latest_manifest(evidence_dir: Path, host: str, env: str = "probe"
                    ) -> tuple[Path, EnvManifest] | None:
    """The newest readable manifest filed for `host`'s env `env` (validate reports unreadable
    ones): the probe and Diffusers envs' manifests never stand for each other."""
    found = []
    for path in (evidence_dir / host).glob(f"*/{MANIFEST_FILE}"):
        try:
            attempt = parse_file(path.parent / ATTEMPT_FILE)
            manifest = parse_file(path)
        except (InputError, FileNotFoundError):
            continue
        started = getattr(attempt.provenance, "started_at", None)
        if started is not None and manifest.env == env:
            found.append((started, path.parent, manifest))
    if not found:
        return None
    _, folder, manifest = max(found, key=lambda item: item[0])
    return folder, manifest


def record_manifest(project: Project, cfg: HostsConfig, manifest: EnvManifest, *,
                    command: list[str], started_at: datetime) -> tuple[Path, bool]:
    """File the manifest as a new attempt unless the host's newest one says the same.

    Returns the attempt folder holding it and whether this call wrote it.
    """
    latest = latest_manifest(project.evidence_dir, manifest.host, manifest.env)
    if latest is not None and fingerprint(latest[1]) == fingerprint(manifest):
        return latest[0], False
    host_dir = project.evidence_dir / manifest.host
    attempt_id = free_attempt_id(host_dir, manifest.host, started_at, ATTEMPT_SUFFIX)
    attempt = Attempt(id=attempt_id, host=manifest.host, date=started_at.date().isoformat(),
                      description=f"{manifest.env} environment {manifest.action} and checked "
                                  "by `omniprobe env`",
                      provenance=provenance(
                          manifest.host, cfg.host(manifest.host), command, started_at,
                          simulated_model="environment of a simulated host; GPU checks skipped",
                          cap_mib=cfg.emulated_cap_mib(manifest.host)))
    return file_attempt(host_dir / attempt_id, attempt, {MANIFEST_FILE: manifest}), True

