"""The upstream contract checks held against the env's own clone of [stack] upstream_repo."""

from __future__ import annotations

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.env.state import EnvPaths, env_config
from omniprobe.errors import InputError
from omniprobe.evidence.models.environment import EnvManifest
from omniprobe.evidence.upstream import UpstreamContract
from omniprobe.upstream.contract import check_clone


def clone_contract(cfg: HostsConfig, project: Project,
                   paths: EnvPaths) -> tuple[UpstreamContract | None, str | None]:
    """The upstream contract check against the env's own clone of [stack] upstream_repo; (None,
    why) where there is no clone to read, (None, None) where the env clones no upstream."""
    step = next((s for s in env_config(cfg, project.hosts_file).install
                 if s.git == cfg.stack.upstream_repo), None)
    if step is None:
        return None, None
    clone = paths.clone_dir(step)
    if not clone.is_dir():
        return None, f"no clone of {step.name} at {clone}"
    # vLLM-Omni's serve parser starts from vLLM's: read vLLM's flags off the env's own vllm.
    installed = sorted(paths.venv.glob("lib/python3*/site-packages/vllm/__init__.py"))
    try:
        return check_clone(cfg, clone, project.root,
                           installed[0].parent.parent if installed else None), None
    except InputError as exc:
        return None, f"the clone at {clone} could not be read: {exc}"


def contract_warnings(manifest: EnvManifest) -> list[str]:
    """One line per upstream contract check the env's clone fails (or why none was read)."""
    contract = manifest.upstream
    if contract is None:
        note = manifest.upstream_note
        return [f"upstream contract not checked: {note}"] if note else []
    return [f"upstream contract check {c.name} FAILS at {c.where or '(no location)'}: {c.detail}"
            for c in contract.checks if c.status == "fail"]
