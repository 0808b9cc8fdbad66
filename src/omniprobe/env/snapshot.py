"""The pinned model snapshot in the hub cache, through huggingface_hub's cache scan (it reads the
filesystem and never downloads), and its files against [env.checks] snapshot_manifest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.config.strict import STRICT
from omniprobe.digests import sha256_file
from omniprobe.env.fetch_model import fetch_hint, hf_cache_dir
from omniprobe.env.state import env_config
from omniprobe.errors import InputError, problems_from_validation
from omniprobe.evidence.models.environment import EnvCheck
from omniprobe.safe_io import confine, load_json

if TYPE_CHECKING:
    from huggingface_hub import CachedRevisionInfo
from omniprobe.env.check_record import env_check


class SnapshotManifest(BaseModel):
    """The snapshot's files and their sha256, for [env.checks] snapshot_manifest."""

    model_config = STRICT

    model_snapshot: str = Field(description="'repo@revision' these digests belong to.")
    files: dict[str, str] = Field(min_length=1, description="Path in the snapshot -> sha256.")


def _at_revision(revisions, revision: str) -> list:
    return [rev for rev in revisions if rev.commit_hash.startswith(revision) or revision in rev.refs]


def pinned_snapshot(cfg: HostsConfig):
    """The hub cache's snapshot at the pinned revision (a CachedRevisionInfo: its folder is what
    the server is given for {model}); None unless exactly one revision matches, as the
    model.snapshot check requires. The repo id would resolve through the cache's `main` ref,
    which need not be the pinned revision."""
    from huggingface_hub import scan_cache_dir

    cache = hf_cache_dir()
    if not cache.is_dir():
        return None
    revisions = [rev for r in scan_cache_dir(cache).repos
                 if r.repo_id == cfg.stack.model_repo and r.repo_type == "model"
                 for rev in r.revisions]
    matching = _at_revision(revisions, cfg.stack.model_revision)
    return matching[0] if len(matching) == 1 else None


def snapshot_folder(cfg: HostsConfig) -> str:
    """The folder the probe serves for {model}: the cached snapshot at the pinned revision, or
    where the hub cache puts it once fetched."""
    found = pinned_snapshot(cfg)
    if found is not None:
        return str(found.snapshot_path)
    repo = cfg.stack.model_repo.replace("/", "--")
    return str(hf_cache_dir() / f"models--{repo}" / "snapshots"
               / f"<the commit starting {cfg.stack.model_revision}>")


def snapshot_checks(cfg: HostsConfig, project: Project) -> list[EnvCheck]:
    from huggingface_hub import scan_cache_dir

    repo, revision = cfg.stack.model_repo, cfg.stack.model_revision
    manifest_file = env_config(cfg, project.hosts_file).checks.snapshot_manifest
    cache = hf_cache_dir()
    found = None
    if not cache.is_dir():
        snapshot = env_check("model.snapshot", "fail", f"missing: no Hugging Face cache at {cache}; "
                             f"{fetch_hint(cfg)}", cfg.stack.model_snapshot)
    else:
        info = scan_cache_dir(cache)
        cached = [r for r in info.repos if r.repo_id == repo and r.repo_type == "model"]
        revisions = [rev for r in cached for rev in r.revisions]
        matching = _at_revision(revisions, revision)
        if not cached:
            broken = [str(w) for w in info.warnings if repo.replace("/", "--") in str(w)]
            snapshot = env_check("model.snapshot", "fail",
                                 f"missing: {repo} is not in the cache {cache}"
                                 + (f" ({'; '.join(broken)})" if broken else "")
                                 + f"; {fetch_hint(cfg)}", cfg.stack.model_snapshot)
        elif len(matching) != 1:
            held = ", ".join(f"{rev.commit_hash[:12]} (refs: {', '.join(sorted(rev.refs)) or '-'})"
                             for rev in revisions) or "no complete revision"
            snapshot = env_check("model.snapshot", "fail",
                                 f"{repo} is cached at {held}, not at the pinned {revision}; "
                                 f"{fetch_hint(cfg)}", revision,
                                 ", ".join(rev.commit_hash for rev in revisions) or None)
        else:
            found = matching[0]
            snapshot = env_check("model.snapshot", "pass", f"in {found.snapshot_path}", revision,
                                 found.commit_hash)
    if manifest_file is None:
        return [snapshot, env_check("model.snapshot_files", "skip",
                                    "no snapshot_manifest configured: the file digests are unknown")]
    try:
        path = confine(project.hosts_file.parent, manifest_file, file=project.hosts_file,
                       field="[env.checks] key 'snapshot_manifest'")
    except InputError as exc:
        return [snapshot, env_check("model.snapshot_files", "fail", str(exc))]
    return [snapshot, _manifest_check(path, cfg.stack.model_snapshot, found)]


def _manifest_check(path: Path, model_snapshot: str, revision: CachedRevisionInfo | None
                    ) -> EnvCheck:
    name = "model.snapshot_files"
    try:
        manifest = SnapshotManifest.model_validate(load_json(path), strict=True)
    except (InputError, ValidationError) as exc:
        problems = (problems_from_validation(path, exc) if isinstance(exc, ValidationError)
                    else exc.problems)
        return env_check(name, "fail", f"unusable manifest: {'; '.join(map(str, problems))}")
    if manifest.model_snapshot != model_snapshot:
        return env_check(name, "fail", f"{path} lists the files of another snapshot",
                         model_snapshot, manifest.model_snapshot)
    if revision is None:
        return env_check(name, "fail", "no snapshot at the pinned revision to compare")
    root = Path(revision.snapshot_path)
    present = {Path(f.file_path).relative_to(root).as_posix() for f in revision.files}
    bad = [f"{rel}: missing" for rel in sorted(set(manifest.files) - present)]
    bad += [f"{rel}: not in the manifest" for rel in sorted(present - set(manifest.files))]
    bad += [f"{rel}: sha256 {digest[:12]}…, manifest {manifest.files[rel][:12]}…"
            for rel in sorted(present & set(manifest.files))
            if (digest := sha256_file(root / rel)) != manifest.files[rel]]
    if bad:
        return env_check(name, "fail", "; ".join(bad), f"{len(manifest.files)} files as in {path}",
                         f"{len(bad)} differ")
    return env_check(name, "pass", f"every file matches {path}", f"{len(manifest.files)} files",
                     f"{len(present)} files")
