"""Where a host's probe environment lives, the hash of what it pins, the stamp of its last
complete build, and the runner every `omniprobe env` command goes through."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from omniprobe.atomic import write_text_atomic
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.config.stack import EnvConfig, InstallStep
from omniprobe.config.strict import STRICT
from omniprobe.digests import sha256_json
from omniprobe.errors import EnvironmentFailure, InputError
from omniprobe.safe_io import MissingFile, read_text

ENV_ROOT_VAR = "OMNIPROBE_ENV_ROOT"
STAMP_FILE = "omniprobe-env.json"
CONSTRAINTS_FILE = "omniprobe-constraints.txt"
OVERRIDES_FILE = "omniprobe-overrides.txt"
# Bump when the meaning of a build changes, so every stamp made before is rebuilt.
_HASH_SCHEME = 1


class EnvError(EnvironmentFailure):
    """The environment cannot be built, found or used; the message says why and what to do."""


class EnvBuildError(EnvError):
    """A build step failed; the env is left marked incomplete and the next build repairs it."""


class EnvNotReady(EnvError):
    """A probe asked for an environment that is incomplete or fails a check."""


# Which of a host's two environments: the probe's ([env]) or the Diffusers engine's
# ([diffusers_env]); each has its own venv, stamp and manifest.
EnvName = Literal["probe", "diffusers"]
# How a sentence names each: "the Diffusers environment of host ...".
ENV_WORDS: dict[EnvName, str] = {"probe": "probe", "diffusers": "Diffusers"}


def env_config(cfg: HostsConfig, hosts_file: Path) -> EnvConfig:
    if cfg.env is None:
        raise EnvError(f"{hosts_file}: no [env] table; it says how to build the probe environment")
    return cfg.env


def install_steps(cfg: HostsConfig, hosts_file: Path, which: EnvName) -> list[InstallStep]:
    """The install steps of the probe env ([env]) or the Diffusers env ([diffusers_env])."""
    if which == "probe":
        return env_config(cfg, hosts_file).install
    if cfg.diffusers_env is None:
        raise EnvError(f"{hosts_file}: no [diffusers_env] table; it says how to build the "
                       "Diffusers environment (the Diffusers engine's)")
    return cfg.diffusers_env.install


def env_label(which: EnvName) -> str:
    return "env" if which == "probe" else "Diffusers env"


def build_command(host: str, which: EnvName, action: Literal["build", "check"] = "build") -> str:
    """The command that builds (or repairs) the env, or with `action` "check" only checks it."""
    return f"omniprobe env {action} --host {host}" + (" --env diffusers" if which == "diffusers"
                                                      else "")


@dataclass(frozen=True)
class EnvPaths:
    venv: Path
    git_cache: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def bin_dir(self) -> Path:
        return self.venv / "bin"

    @property
    def stamp(self) -> Path:
        return self.venv / STAMP_FILE

    @property
    def constraints(self) -> Path:
        return self.venv / CONSTRAINTS_FILE

    @property
    def overrides(self) -> Path:
        return self.venv / OVERRIDES_FILE

    def clone_dir(self, step: InstallStep) -> Path:
        # One clone per pinned commit: an editable install must never see its tree move.
        return self.git_cache / f"{step.name}-{step.commit}"


def env_paths(cfg: HostsConfig, project: Project, host: str, venv: str | Path | None = None,
              which: EnvName = "probe") -> EnvPaths:
    """The venv (--venv, else <root>/envs/<host>, the Diffusers env's <root>/envs/<host>-diffusers)
    and git cache; both must lie outside git."""
    if cfg.host(host).simulated:
        # [env] pins the real stack; a simulated host's server is omniprobe.sim (see envsim).
        raise EnvError(f"host {host!r} is simulated: it has no pinned env to build or check; "
                       f"`omniprobe env build --host {host}` checks what its server runs on")
    env = env_config(cfg, project.hosts_file)
    root = Path(os.environ.get(ENV_ROOT_VAR) or env.root).expanduser().resolve()
    paths = EnvPaths(
        venv=Path(venv).expanduser().resolve() if venv else root / "envs" / (
            host if which == "probe" else f"{host}-diffusers"),
        git_cache=root / "git",
    )
    repo = project.root.resolve()
    for what, path in (("venv", paths.venv), ("git cache", paths.git_cache)):
        if path == repo or repo in path.parents:
            raise EnvError(f"the {what} {path} is inside the repository {repo}; it must live "
                           f"outside git: pass --venv, set {ENV_ROOT_VAR}, or change [env] root")
    return paths


def pins_hash(cfg: HostsConfig, project: Project, which: EnvName = "probe") -> str:
    """Changes exactly when a build would install something different."""
    steps = install_steps(cfg, project.hosts_file, which)
    pins = {
        "scheme": _HASH_SCHEME,
        "python": cfg.stack.python,
        # A step without an override or a choice hashes as before they existed: no rebuild.
        "install": [step.model_dump(mode="json", exclude={
            key for key in ("override", "chosen") if getattr(step, key) is None})
            for step in steps],
    }
    if which == "diffusers":  # the probe env's hash stays as it was
        pins["env"] = which
    return sha256_json(pins)


class Stamp(BaseModel):
    """Written 'incomplete' before the first install and 'complete' only after the last."""

    model_config = STRICT

    state: Literal["incomplete", "complete"]
    host: str
    pins_hash: str
    python: str
    started_at: datetime
    finished_at: datetime | None = None


def write_stamp(paths: EnvPaths, stamp: Stamp) -> None:
    write_text_atomic(paths.stamp, stamp.model_dump_json(indent=2) + "\n")


def stamp_state(paths: EnvPaths, want_hash: str) -> tuple[bool, str]:
    """(current, why): current means a complete build of exactly these pins."""
    try:
        stamp = Stamp.model_validate_json(read_text(paths.stamp))
    except MissingFile:
        return False, f"no build stamp at {paths.stamp}: the env was never completely built"
    except InputError as exc:
        return False, f"unreadable build stamp {exc}"
    except ValidationError as exc:
        return False, f"unreadable build stamp {paths.stamp}: {exc.errors()[0]['msg']}"
    if stamp.state != "complete":
        return False, (f"incomplete: the build started {stamp.started_at:%Y-%m-%d %H:%M:%S} "
                       "did not finish")
    if stamp.pins_hash != want_hash:
        return False, (f"stale: built for pins {stamp.pins_hash[:12]}, hosts.toml now pins "
                       f"{want_hash[:12]}")
    if not paths.python.exists():
        return False, f"the venv interpreter {paths.python} is gone"
    return True, f"complete build of pins {want_hash[:12]}, finished {stamp.finished_at}"


def uv_command() -> str:
    """`uv` from PATH, else the binary of the uv package omniprobe depends on."""
    if shutil.which("uv"):
        return "uv"
    from uv import find_uv_bin

    return find_uv_bin()


@dataclass
class CommandRun:
    argv: tuple[str, ...]
    returncode: int
    seconds: float


@dataclass
class Runner:
    """Runs argument lists, never a shell, and keeps a record of each for the manifest."""

    ran: list[CommandRun] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, capture: bool = True, tee: bool = False,
            env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        """`timeout_s`: past it the command is killed and reads as exit 124, saying so. `tee`
        (with capture off): its stderr is shown as it comes and kept, so a failure's words can be
        read back (an install's "Failed to fetch")."""
        start = time.perf_counter()
        try:
            if tee and not capture:
                proc = _teed(argv, env)
            else:
                proc = subprocess.run(list(argv), capture_output=capture, text=True, check=False,
                                      env=None if env is None else dict(env), timeout=timeout_s)
        except FileNotFoundError:
            raise EnvError(f"{argv[0]!r} is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(list(argv), 124, "",
                                               f"timed out after {timeout_s:g} s")
        self.ran.append(CommandRun(tuple(argv), proc.returncode, time.perf_counter() - start))
        return proc


# How much of a teed command's stderr is kept: its failure's last words, not a whole build log.
_TEED_LINES = 400


def _teed(argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    """Run `argv` with its stdout ours and its stderr passed through to ours line by line, its
    last lines kept."""
    kept: collections.deque[str] = collections.deque(maxlen=_TEED_LINES)
    with subprocess.Popen(list(argv), stderr=subprocess.PIPE, text=True, errors="replace",
                          env=None if env is None else dict(env)) as child:
        assert child.stderr is not None
        for line in child.stderr:
            sys.stderr.write(line)
            kept.append(line)
        code = child.wait()
    return subprocess.CompletedProcess(list(argv), code, "", "".join(kept))
