"""probe-baseline: the seed's Diffusers baseline re-sealed on a host. It runs probe-offline under
the host's baseline profile (the seed's `seed-baseline`: an int8 DiT, 20 steps, KV cache off,
its seeds), then lays the images out where `omniprobe quality --baseline DIR` reads them
(hosts.toml [quality] baseline_layout) with a `baseline.json` saying which attempt made them.

PSNR against such a baseline means something only when both sides ran the same inputs with real
weights: `quality` refuses a random-weight baseline (or attempt) by name.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from omniprobe.atomic import write_text_atomic
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import resolve_host
from omniprobe.errors import Refusal
from omniprobe.evidence.validate import load_valid_project
from omniprobe.harness.common.options import BaselineOptions
from omniprobe.harness.common.quality import baseline_path, resolve_artifact
from omniprobe.harness.offline.env import build_diffusers_env
from omniprobe.harness.offline.session import run_offline

DEFAULT_PROFILE = "seed-baseline"
MARKER = "baseline.json"


class NoBaselineProfile(Refusal):
    """A host with no Diffusers profile to re-seal the baseline with."""


def lay_out(project: Project, attempt_id: str, profile: str, folder: Path) -> list[Path]:
    """Copy the attempt's ok images of `profile` into `folder` by the baseline layout; write the
    marker naming the attempt and its weights. Returns the images written."""
    loaded = load_valid_project(project)
    attempt = loaded.evidence.attempt(attempt_id)
    layout = loaded.hosts.quality.baseline_layout
    written = []
    for i, record in enumerate(attempt.offline_requests):
        if record.configuration != profile or record.outcome != "ok" or record.artifact is None:
            continue
        source = resolve_artifact(record.artifact, project.artifacts_dir,
                                  file=attempt.path / "offline-requests.json",
                                  field=f"$.offline_requests[{i}].artifact")
        target = baseline_path(folder, layout, loaded.fixtures.get(record.fixture), record.seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    write_text_atomic(folder / MARKER, json.dumps(
        {"attempt": attempt.id, "host": attempt.host, "profile": profile,
         "weights": attempt.meta.weights, "layout": layout}, indent=2) + "\n")
    return written


def run_baseline(project: Project, options: BaselineOptions, *, command: list[str],
                 out: TextIO, readers=None) -> int:
    """probe-offline under the baseline profile, then the layout `quality` reads. Where the
    host's runner runs in the Diffusers env, `options.build_env` builds (or only verifies) it first;
    otherwise one not built is refused before any attempt exists (runner_command)."""
    cfg = load_hosts(project.hosts_file)
    host_name, _ = resolve_host(project, cfg, options.host)
    host = cfg.host(host_name)
    profiles = options.configurations or (DEFAULT_PROFILE,)
    if host.diffusers is None or any(p not in host.diffusers_profiles for p in profiles):
        raise NoBaselineProfile(
            f"host {host_name!r} has no Diffusers profile {', '.join(profiles)} to re-seal the "
            f"baseline with (its profiles: {', '.join(host.diffusers_profiles) or 'none'}); "
            "name one with --profile")
    if len(profiles) != 1:
        raise NoBaselineProfile("probe-baseline re-seals one profile: name one --profile")
    if options.build_env:
        build_diffusers_env(project, host_name, host, out)
    code = run_offline(project, replace(options, configurations=profiles, host=host_name),
                       command=command, readers=readers, out=out)
    attempts = sorted(p for p in (project.evidence_dir / host_name).glob("*-offline")
                      if (p / "offline-requests.json").is_file())
    if not attempts:
        return code
    newest = attempts[-1].name
    folder = project.artifacts_dir / host_name / newest / "baseline"
    written = lay_out(project, newest, profiles[0], folder)
    print(f"baseline: {len(written)} image(s) of attempt {newest} in {folder}", file=out)
    print(f"compare with: nox -s quality -- --baseline {folder} --baseline-attempt {newest}",
          file=out)
    return code
