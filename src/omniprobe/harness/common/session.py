"""The one skeleton of every session that makes evidence (probe-init, probe-serve, probe-offline,
propagation): load the configuration, resolve the host, make every refusal before an attempt
exists, open the attempt, run under `signals_interrupt()`, close on every path, report.

Errors are not caught here: they are `OmniprobeError`s that `omniprobe.cli` prints. Ctrl-C (or
SIGTERM) becomes `Interrupted`, raised once the session has stopped its server and closed its
files, with the session's own word on what the attempt holds.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from omniprobe.atomic import require_writable
from omniprobe.config.fixtures import FixtureSuite, load_fixtures
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.config.selection import INVOCATION_ENV, read_state, resolve_host, state_path, update_state
from omniprobe.errors import EnvironmentFailure, Interrupted
from omniprobe.evidence.attempts import AttemptStore
from omniprobe.harness.common.interrupt import signals_interrupt


@dataclass(frozen=True)
class Context:
    """What a session starts from: the configuration and the resolved host."""

    project: Project
    cfg: HostsConfig
    suite: FixtureSuite
    host_name: str
    host: Host
    out: TextIO


class Session(ABC):
    """One session's steps; `run_session` calls them in order."""

    @abstractmethod
    def prepare(self, ctx: Context) -> None:
        """Every refusal (an OmniprobeError), before an attempt exists: a refused run leaves no
        evidence behind."""

    @abstractmethod
    def open_attempt(self, ctx: Context) -> AttemptStore:
        """The attempt to write (new, or the one to resume)."""

    @abstractmethod
    def run(self, ctx: Context, store: AttemptStore) -> int:
        """The work, under signals_interrupt; prints its report and returns the exit status."""

    @abstractmethod
    def close(self) -> None:
        """Finish what run started (e.g. records still being written); called on every path."""

    @abstractmethod
    def interrupted(self, store: AttemptStore) -> str:
        """What an interrupted run leaves behind, for the user."""


def run_session(project: Project, session: Session, host: str | None,
                out: TextIO | None = None) -> int:
    """Run the session's steps on the host (None: the selection's); its exit status."""
    out = out or sys.stderr  # looked up now: a default bound at import goes stale under capture
    cfg = load_hosts(project.hosts_file)
    suite = load_fixtures(project.fixtures_file)
    host_name, why = resolve_host(project, cfg, host)
    print(f"host {host_name} ({why})", file=out)
    ctx = Context(project, cfg, suite, host_name, cfg.host(host_name), out)
    session.prepare(ctx)
    require_writable(project.evidence_dir / host_name, "the evidence folder")
    require_writable(project.artifacts_dir / host_name, "the artifacts folder")
    store = session.open_attempt(ctx)
    failed = True
    try:
        with signals_interrupt():
            code = session.run(ctx, store)
        failed = False
        return code
    except KeyboardInterrupt:
        raise Interrupted(session.interrupted(store)) from None
    finally:
        try:
            session.close()
        finally:
            store.close()
            if failed:
                store.discard_if_empty()


def close_attempt(ctx: Context, store: AttemptStore, not_done: list[str],
                  environment_failures: list[str], whole: str, out: TextIO) -> None:
    """What every session says as it ends: where its evidence is, what it did not do; raised as
    the environment's failure when `whole` things (flag sets, entries) failed for it."""
    print(f"attempt {store.meta.id}: evidence in {store.folder.relative_to(ctx.project.root)}, "
          f"artifacts in {store.artifacts}", file=out)
    for line in not_done:
        print(f"not done: {line}", file=out)
    if environment_failures:
        raise EnvironmentFailure(
            f"the card was not measured: whole {whole} failed for an environment cause "
            "(the evidence records it; fix the environment and re-run):\n"
            + "\n".join(f"  {line}" for line in environment_failures))


def open_run_attempt(ctx: Context, key: str, fresh: bool,
                     opening: Callable[[str | None], tuple[AttemptStore, str]]
                     ) -> tuple[AttemptStore, str]:
    """The attempt `opening` opens, given this nox run's fresh attempt of `key` (the first
    session given --fresh makes it, the sessions after join it); it is remembered for them."""
    invocation = os.environ.get(INVOCATION_ENV)
    state = read_state(state_path(ctx.project, invocation), invocation)
    fresh_id = state.get("fresh_attempts", {}).get(key) if fresh else None
    store, why = opening(fresh_id)
    if fresh and invocation:
        update_state(state_path(ctx.project, invocation), invocation, fresh_attempts={
            **state.get("fresh_attempts", {}), key: store.meta.id})
    return store, why
