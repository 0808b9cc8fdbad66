"""Which host a probe acts on.

Order: the host an earlier env-<host> session of the same nox invocation selected, else
`--host NAME`, else the hosts.toml host whose hostname is this machine's, else an error that
lists the hosts. An env-<host> session that fails selects nothing: the probe sessions of its
run refuse, naming its failure, rather than fall back to another host. Nox runs each session in
its own venv and process, so the selection travels through a small state file keyed by the
invocation id the noxfile puts in the environment.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from omniprobe.atomic import write_text_atomic
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.digests import sha256_bytes
from omniprobe.errors import EnvironmentFailure, InputError, Refusal
from omniprobe.safe_io import load_json

INVOCATION_ENV = "OMNIPROBE_INVOCATION"


class NoHost(Refusal):
    """No host could be chosen."""


class SelectedEnvFailed(EnvironmentFailure):
    """The env session that selected the host found its environment failing a check."""


def state_path(project: Project, invocation: str | None) -> Path:
    """This invocation's own state file: two nox runs in one checkout never share one (a run's
    write would hide the other's selection). Named by a digest, since the id comes from the
    environment. Without an invocation, read_state finds nothing and nothing writes."""
    name = sha256_bytes((invocation or "").encode())[:24]
    return project.artifacts_dir / "selections" / f"{name}.json"


def read_state(path: Path, invocation: str | None) -> dict:
    """What earlier sessions of this invocation recorded; empty for another invocation or none."""
    if not invocation:
        return {}
    try:
        data = load_json(path)
    except InputError:  # missing, unreadable or not JSON: no state handed on
        return {}
    return data if isinstance(data, dict) and data.get("invocation") == invocation else {}


def update_state(path: Path, invocation: str, **values) -> dict:
    """Merge values into this invocation's state (a new invocation starts it afresh)."""
    state = {**read_state(path, invocation), **values, "invocation": invocation}
    write_text_atomic(path, json.dumps(state, indent=2, sort_keys=True) + "\n")
    return state


def choose_host(cfg: HostsConfig, *, selected: str | None, requested: str | None,
                hostname: str) -> tuple[str, str]:
    """(host, why) in the documented order; UnknownHost for a name hosts.toml lacks, NoHost
    listing the hosts when none applies."""
    if selected:
        cfg.host(selected, "the env session")
        return selected, "selected by an earlier env session"
    if requested:
        cfg.host(requested, "--host")
        return requested, "given with --host"
    short = hostname.split(".", 1)[0]
    for name, host in cfg.hosts.items():
        if not host.simulated and host.hostname in (hostname, short):
            return name, f"this machine is {hostname}"
    raise NoHost(f"no host selected: run an env-<host> session first, or pass --host NAME "
                 f"(after -- under nox); this machine ({hostname}) matches no hostname in "
                 f"hosts.toml; hosts: {cfg.hosts_list()}")


def resolve_host(project: Project, cfg: HostsConfig, requested: str | None,
                 env: dict[str, str] | None = None, hostname: str | None = None) -> tuple[str, str]:
    """The probe's host; refuses, naming the failure, when an env session of this nox run failed
    (it selected nothing, so no probe of the run may fall back to another host)."""
    env = os.environ if env is None else env
    invocation = env.get(INVOCATION_ENV)
    state = read_state(state_path(project, invocation), invocation)
    failed = state.get("env_failure")
    if failed:
        raise SelectedEnvFailed(f"{failed['session']} failed, so it selected no host and the "
                                f"probe sessions of this nox run do not run: {failed['failure']}")
    return choose_host(cfg, selected=state.get("host"), requested=requested,
                       hostname=hostname or socket.gethostname())


def record_selection(project: Project, host: str, problems: list[str], *, venv: str | None = None,
                     env: dict[str, str] | None = None) -> bool:
    """Hand the host and its env's venv to the later sessions of this nox invocation, or, when
    its env failed (`problems`), no host but the failure; False when there is no invocation to
    hand it to."""
    if problems:  # the env session printed each; the probe sessions after it name the first
        more = f" (and {len(problems) - 1} more, each printed above)" if len(problems) > 1 else ""
        return record_env_failure(project, host, problems[0] + more, env=env)
    env = os.environ if env is None else env
    invocation = env.get(INVOCATION_ENV)
    if not invocation:
        return False
    update_state(state_path(project, invocation), invocation, host=host, venv=venv, env_failure=None)
    return True


def record_env_failure(project: Project, host: str, failure: str, *,
                       env: dict[str, str] | None = None) -> bool:
    """Hand on that env-<host> failed and selected nothing; the probe sessions after refuse."""
    env = os.environ if env is None else env
    invocation = env.get(INVOCATION_ENV)
    if not invocation:
        return False
    update_state(state_path(project, invocation), invocation, host=None, venv=None,
                 env_failure={"session": f"env-{host}", "failure": failure})
    return True


def session_venv(project: Project, host: str, env: dict[str, str] | None = None) -> str | None:
    """The venv an env session of this invocation recorded for `host`, if any."""
    env = os.environ if env is None else env
    invocation = env.get(INVOCATION_ENV)
    state = read_state(state_path(project, invocation), invocation)
    return state.get("venv") if state.get("host") == host else None

