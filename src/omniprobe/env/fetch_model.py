"""`omniprobe env fetch-model`: put the pinned model snapshot into the hub cache, where the env
check's model.snapshot looks for it.

The seed states the revision short (`790c9263`) and the Hub takes a full one for a commit, so
the command lists the repository's commits (huggingface_hub `list_repo_commits`, of its main
branch) and takes the one the prefix names; where none or several do, the user gives the full
revision (`--revision`). It then downloads that revision (`snapshot_download`) into the cache
the env check scans. Nothing else writes to the cache.

The revision becomes a folder name in the cache (`snapshots/<commit>`), so whether the user gave
it or the Hub answered it, it is used only as a full commit id, 40 lower-case hex digits, and the
folder the download names must lie inside the cache.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path

from omniprobe.config.hosts import HostsConfig
from omniprobe.errors import EnvironmentFailure, InputError, Problem

COMMAND = "omniprobe env fetch-model"
_COMMIT = re.compile(r"[0-9a-f]{40}")


def hf_cache_dir() -> Path:
    """The hub cache as huggingface_hub resolves it, read now rather than at its import."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


class FetchFailed(EnvironmentFailure):
    """The Hub could not be asked, or did not give the snapshot."""


def fetch_hint(cfg: HostsConfig) -> str:
    """The commands that fetch the pinned snapshot, for a model.snapshot check that fails."""
    repo, revision = cfg.stack.model_repo, cfg.stack.model_revision
    return (f"fetch it: `{COMMAND}` (takes the commit of {repo} starting {revision} from its "
            f"commit list, then downloads it into {hf_cache_dir()}), or `hf download "
            f"{shlex.quote(repo)} --revision <the full commit starting {revision}>`")


def is_commit(value: object) -> bool:
    """A full commit id: 40 lower-case hex digits, nothing a path could climb out with."""
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def full_revision(prefix: str, commits: Iterable[str], repo: str) -> str:
    """The one commit id starting with `prefix`; FetchFailed naming what to give otherwise, or
    naming a commit id of the Hub's answer that is not one."""
    commits = list(commits)
    odd = [c for c in commits if not is_commit(c)]
    if odd:
        raise FetchFailed(f"the Hub's commit list of {repo} holds {len(odd)} id(s) that are not "
                          f"40 hex digits, e.g. {odd[0]!r}: refusing to use any of it")
    matching = sorted({c for c in commits if c.startswith(prefix)})
    if len(matching) == 1:
        return matching[0]
    found = (f"{len(matching)} commits of {repo} start" if matching
             else f"no commit of {repo}'s main branch starts")
    raise FetchFailed(f"{found} with {prefix}" + (f" ({', '.join(matching)})" if matching else "")
                      + f": give the full revision, `{COMMAND} --revision <40 hex digits>`")


def fetch_model(cfg: HostsConfig, *, revision: str | None = None,
                list_commits: Callable[[str], list[str]] | None = None,
                download: Callable[[str, str, Path], str] | None = None,
                echo: Callable[[str], None] = print) -> Path:
    """Download the pinned snapshot into the hub cache; its folder. `list_commits` (repo ->
    commit ids) and `download` (repo, revision, cache -> folder) stand in for huggingface_hub."""
    repo, prefix = cfg.stack.model_repo, cfg.stack.model_revision
    if revision is not None and not is_commit(revision):
        raise InputError([Problem("--revision", "", f"expected a full commit id (40 lower-case "
                                  f"hex digits), got {revision!r}")])
    if revision is not None and not revision.startswith(prefix):
        raise InputError([Problem("--revision", "", f"{revision!r} does not start with the "
                                  f"pinned {prefix} ([stack] model_snapshot)")])
    list_commits = list_commits or _hub_commits
    download = download or _hub_download
    try:
        if revision is None:
            echo(f"# listing the commits of {repo} to find the one starting {prefix}")
            revision = full_revision(prefix, list_commits(repo), repo)
        cache = hf_cache_dir()
        echo(f"# downloading {repo} at {revision} into {cache}")
        folder = Path(download(repo, revision, cache))
        if not folder.resolve().is_relative_to(cache.resolve()):
            raise FetchFailed(f"the download of {repo} at {revision} names {folder}, outside "
                              f"the hub cache {cache}")
    except FetchFailed:
        raise
    except Exception as exc:  # huggingface_hub's errors: network, auth, offline mode, not found
        raise FetchFailed(f"the Hub did not give {repo} at {revision or prefix}: "
                          f"{type(exc).__name__}: {exc}") from None
    echo(f"fetched {repo}@{revision[:12]}: {folder}; `omniprobe env check --host <host>` finds it")
    return folder


def _hub_commits(repo: str) -> list[str]:
    from huggingface_hub import HfApi

    return [c.commit_id for c in HfApi().list_repo_commits(repo)]


def _hub_download(repo: str, revision: str, cache: Path) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, revision=revision, cache_dir=cache)
