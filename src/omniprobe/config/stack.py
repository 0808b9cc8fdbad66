"""hosts.toml's pins: [stack] (the model snapshot and upstream), the probe env's [env] and the
Diffusers env's [diffusers_env] install plans, their steps and checks, and [upstream]."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from omniprobe.config.hosts_common import HostsTable
from omniprobe.config.inside_path import InsidePath


class Stack(HostsTable):
    """The software every host pins, as the seed report states it."""

    upstream_repo: str = Field(description="Git URL of vLLM-Omni.")
    upstream_commit: str = Field(description="Pinned vLLM-Omni commit (abbreviated as stated).")
    recipe_version: str
    python: str = Field(description="Python version of the probe venv, e.g. '3.13'.")
    torch: str = Field(description="torch build, e.g. '2.13.0+cu130'.")
    torch_index: str = Field(description="Package index that serves the torch build.")
    transformers: str
    diffusers_repo: str
    diffusers_commit: str
    model_snapshot: str = Field(description="'repo@revision' of the digest-pinned snapshot.")
    offline_env: dict[str, str] = Field(description="Environment that keeps the hub offline.")

    @property
    def model_repo(self) -> str:
        return self.model_snapshot.split("@", 1)[0]

    @property
    def model_name(self) -> str:
        """The model's own name: its repo without the owner (e.g. 'Qwen-Image-2.1')."""
        return self.model_repo.split("/")[-1]

    @property
    def model_revision(self) -> str:
        return self.model_snapshot.split("@", 1)[1]

    @model_validator(mode="after")
    def _snapshot_has_revision(self) -> Stack:
        # Both halves become folder names in the hub cache (models--<owner>--<name>/snapshots/).
        if "@" not in self.model_snapshot:
            raise ValueError("model_snapshot must be 'repo@revision'")
        if not _REPO.fullmatch(self.model_repo) or ".." in self.model_repo:
            raise ValueError(f"model_snapshot's repo must be 'owner/name' (letters, digits, '.', "
                             f"'_', '-'), got {self.model_repo!r}")
        if not _REVISION.fullmatch(self.model_revision):
            raise ValueError(f"model_snapshot's revision must be a commit or its prefix, 8 to 40 "
                             f"lower-case hex digits, got {self.model_revision!r}")
        return self


_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_REVISION = re.compile(r"[0-9a-f]{8,40}")


class PinChoice(HostsTable):
    """Who chose something of an install step the seed does not state, and why."""

    chosen_by: Literal["omniprobe"] = Field(
        description="Who chose it: the seed does not state it.")
    reason: str = Field(min_length=1, description="Why, for the dry run, manifest and report.")


class StepOverride(PinChoice):
    """A step whose pin replaces every other package's requirement on it (uv `--override`), in
    the whole-plan resolution and every install step: where a package's own pin clashes with
    the seed's (vLLM-Omni 0.30.0 requires exactly diffusers==0.40.0; the seed pins a diffusers
    commit beside it)."""


class InstallStep(HostsTable):
    """One `uv pip install` of the probe environment; [[env.install]] runs in file order."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Distribution name.")
    version: str | None = Field(default=None, description="Exact version from an index (==).")
    index: str | None = Field(
        default=None, description="Index of this step's package only (an explicit uv index, in the "
                                  "resolution and the install), every other package from the "
                                  "default index; null: uv's default."
    )
    git: str | None = Field(default=None, description="Repository URL, cloned into the git cache.")
    commit: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{7,40}$", description="Pinned commit, may be abbreviated."
    )
    editable: bool = Field(default=False, description="Install the clone in place (git only).")
    recipe: str | None = Field(
        default=None,
        description="Where the version comes from: a file of the upstream clone ([stack] "
                    "upstream_repo at upstream_commit) that names it; `env build` checks the pin "
                    "against it, and says so when the file is not there.")
    seed_says: str | None = Field(
        default=None, description="What the seed states about how it installed this pin, quoted "
                                  "when the install plan does not resolve.")
    override: StepOverride | None = Field(
        default=None, description="This pin overrides every other package's requirement on it "
                                  "(uv --override); null: a clash stops the build.")
    chosen: PinChoice | None = Field(
        default=None, description="Who chose this pin, and why, where the seed states none "
                                  "(every [[diffusers_env.install]] step); shown in the dry run "
                                  "and filed in the env manifest.")

    @model_validator(mode="after")
    def _one_source(self) -> InstallStep:
        if (self.version is None) == (self.git is None):
            raise ValueError("give either 'version' (from an index) or 'git' with 'commit'")
        if self.git is not None and self.commit is None:
            raise ValueError("a git step needs 'commit'")
        if self.git is None and (self.commit is not None or self.editable):
            raise ValueError("'commit' and 'editable' apply to git steps only")
        if self.git is not None and self.index is not None:
            raise ValueError("'index' applies to version steps only")
        if self.git is not None and self.recipe is not None:
            raise ValueError("'recipe' applies to version steps only (a git step pins a commit)")
        if self.override is not None and self.editable:
            raise ValueError("'override' applies to non-editable steps (uv takes no editable "
                             "override)")
        return self

    @property
    def kind(self) -> Literal["index", "git"]:
        return "git" if self.git is not None else "index"

    @property
    def pin(self) -> str:
        return str(self.commit if self.git is not None else self.version)


class EnvChecks(HostsTable):
    """Settings of the checks run after an environment build."""

    vram_tolerance: float = Field(
        default=0.05, ge=0, lt=1,
        description="Allowed relative difference between NVML's total memory (GiB) and vram_gb.",
    )
    snapshot_manifest: InsidePath | None = Field(
        default=None,
        description="JSON of the snapshot's file sha256 digests, relative to hosts.toml; "
                    "null: not known (the seed states none).",
    )


class _InstallPlan(HostsTable):
    install: list[InstallStep] = Field(min_length=1, description="Install steps, in order.")

    @model_validator(mode="after")
    def _unique_names(self) -> _InstallPlan:
        names = [step.name for step in self.install]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"install steps name a package twice: {', '.join(dupes)}")
        return self


class EnvConfig(_InstallPlan):
    """How `omniprobe env build` makes each host's probe environment."""

    root: str = Field(
        default="~/.cache/omniprobe", pattern=r"^[~/]",
        description="Outside git: venvs go to <root>/envs/<host> (the Diffusers env to "
                    "<root>/envs/<host>-diffusers), clones to <root>/git. OMNIPROBE_ENV_ROOT "
                    "overrides it.",
    )
    checks: EnvChecks = EnvChecks()


class DiffusersEnv(_InstallPlan):
    """The Diffusers engine's own environment (`omniprobe env build --host NAME --env diffusers`),
    apart from the probe env: vLLM-Omni 0.30.0 requires diffusers==0.40.0, which lacks
    QwenImage21Pipeline. The seed states none of its pins: each step records who chose it."""


class UpstreamPin(HostsTable):
    """The registry's vLLM-Omni that `nox -s upstream` holds the harness against (read, not run)."""

    package: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+-]*$")
    vllm: str | None = Field(
        default=None, pattern=r"^[0-9][0-9A-Za-z.+-]*$",
        description="The registry's vLLM whose serve parser (vLLM-Omni's starts from it) the "
                    "serve-flag checks read; null: vLLM's own flags are NOT FOUND.")
