"""hosts.toml: the pinned stack, the hosts, the serve invocation and the named run matrices."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from omniprobe.config.diffusers import DiffusersHost, DiffusersProfile
from omniprobe.config.fixtures import MAX_REFERENCE_PIXELS
from omniprobe.config.inside_path import InsidePath
from omniprobe.config.names import Name
from omniprobe.config.strict import STRICT
from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation
from omniprobe.limits import MAX_ISSUE, MAX_MIB, MAX_VRAM_GB, MAX_WAIT_S
from omniprobe.safe_io import load_toml


class UnknownHost(Refusal):
    """A host name (from --host, an env session, a manifest) that hosts.toml does not define."""


class _Input(BaseModel):
    # Strict when loaded (load_hosts): no coercion of "8091" or true to an int; finite floats.
    model_config = STRICT


Issue = Annotated[int, Field(ge=1, le=MAX_ISSUE)]
# A simulated capacity, size or cap in MiB: at most 2**40 bytes (omniprobe.limits).
Mib = Annotated[int, Field(ge=0, le=MAX_MIB)]
PositiveMib = Annotated[int, Field(gt=0, le=MAX_MIB)]


class Stack(_Input):
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
    def model_revision(self) -> str:
        return self.model_snapshot.split("@", 1)[1]

    @model_validator(mode="after")
    def _snapshot_has_revision(self) -> Stack:
        if "@" not in self.model_snapshot:
            raise ValueError("model_snapshot must be 'repo@revision'")
        return self


SERVE_PLACEHOLDERS = frozenset({"python", "model", "hosts_file", "host"})
OFFLINE_PLACEHOLDERS = frozenset({"python", "runner", "hosts_file", "host"})


def _check_placeholders(command: list[str] | None, known: frozenset[str]) -> list[str] | None:
    """A command's {name} placeholders must be ones the harness fills in; else a typo would reach
    the server verbatim. Braces around anything but a name (a JSON argument) are text."""
    for part in command or []:
        unknown = sorted(set(re.findall(r"\{([A-Za-z_]\w*)\}", part)) - known)
        if unknown:
            raise ValueError(f"{part!r} uses unknown placeholder(s) {unknown}; expected "
                             f"{sorted(known)}")
    return command


# What the harness passes the server itself (env/serve_command.py server_command): a flag set that
# gave one again would win, being later, and listen elsewhere or serve another name.
HARNESS_OPTIONS = ("--host", "--port", "--served-model-name", "--enforce-eager", "--deploy-config")


def harness_option(arg: str) -> str | None:
    """The harness option `arg` names, as argparse would read it: `--opt`, `--opt=value`, with
    `_` for `-`, or an abbreviation argparse expands (`--ho`)."""
    if not arg.startswith("--") or arg == "--":
        return None
    name = arg.split("=", 1)[0].replace("_", "-")
    return next((option for option in HARNESS_OPTIONS
                 if option == name or (len(name) > 3 and option.startswith(name))), None)


# Variables that change what code a process loads: a flag or kwarg set sets one only when
# hosts.toml marks it deliberate.
LOADER_ENV = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME",
                        "PYTHONSTARTUP"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh",
                    "busybox"})
# The prefix of every variable omniprobe itself defines.
OWN_ENV_PREFIX = "OMNIPROBE_"


def _not_a_shell(command: list[str] | None) -> list[str] | None:
    """A command is a program and its arguments: a shell would run its arguments as shell text
    (the harness never uses one), `env` in front of one included."""
    programs = list(command or [])[:1]
    if programs and Path(programs[0]).name == "env":
        programs = [part for part in command[1:] if "=" not in part and not part.startswith("-")][:1]
    for program in programs:
        if Path(program).name in SHELLS:
            raise ValueError(f"{program!r} is a shell, which would run its arguments as shell "
                             "text; give the program itself and its arguments")
    return command


def _not_the_harness_options(args: list[str] | None, what: str) -> list[str] | None:
    for arg in args or []:
        option = harness_option(arg)
        if option is not None:
            raise ValueError(f"{arg!r} gives {option}, which the harness passes itself (every "
                             f"server gets {', '.join(HARNESS_OPTIONS)} from it; {what})")
    return args


def _deliberate_env(env: dict[str, str], deliberate: list[str]) -> None:
    loaders = sorted(set(env) & LOADER_ENV - set(deliberate))
    if loaders:
        raise ValueError(f"env sets {', '.join(loaders)}, which change(s) what code the process "
                         "loads; list it in deliberate_env if that is meant")
    unset = sorted(set(deliberate) - set(env))
    if unset:
        raise ValueError(f"deliberate_env names {', '.join(unset)}, which env does not set")


def url_path(value: str) -> str:
    """A server path such as '/health': it starts with one '/', holds only letters, digits and
    `-._~/`, and no `..` segment (so no '@', scheme, host, query or escape can redirect it)."""
    if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value) or value.startswith("//") or ".." in (
            value.split("/")):
        raise ValueError(f"expected a path on the server such as '/health': starting with '/', "
                         f"of letters, digits and -._~/ only, no '//' or '..'; got {value!r}")
    return value


ServerPath = Annotated[str, AfterValidator(url_path)]


class ArgsCheck(_Input):
    """How the env preflight sees that the serve command's parser accepts a flag set's arguments
    without starting a server."""

    mode: Literal["help", "parse"] = Field(
        description="help: the command with `args` appended prints its help and exits 0, and "
                    "every option the probe passes must be listed in it; parse: the flag set's "
                    "full command with `args` appended parses and exits 0 only if it accepts it.")
    args: list[str] = Field(min_length=1, description="Appended to the serve command.")


class Serve(_Input):
    """How the server is started; {model} is replaced by the snapshot path or repo id."""

    command: list[str] = Field(min_length=1)
    # vLLM-Omni's serve help names it: "Use `--help=all` to show all available flags at once".
    args_check: ArgsCheck = ArgsCheck(mode="help", args=["--help=all"])
    bind_host: Literal["127.0.0.1"] = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    enforce_eager: bool
    served_model_name: str
    health_path: ServerPath = "/health"
    ready_path: ServerPath | None = Field(
        default=None, description="Optional readiness endpoint of newer builds (e.g. /ready)."
    )
    ready_timeout_s: float = Field(default=1200, gt=0, le=MAX_WAIT_S,
                                   description="Longer init: a timeout.")
    request_timeout_s: float = Field(default=900, gt=0, le=MAX_WAIT_S)
    stop_grace_s: float = Field(default=15, ge=0, le=3600, description="SIGTERM to SIGKILL.")

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, command: list[str]) -> list[str]:
        return _not_the_harness_options(_not_a_shell(_check_placeholders(
            command, SERVE_PLACEHOLDERS)), "a flag set's args add the rest")


class DeployConfig(_Input):
    """A deploy YAML a flag set passes with --deploy-config."""

    path: InsidePath = Field(pattern=r"^deploy/",
                             description="Path under deploy/, relative to hosts.toml.")
    content_known: bool = Field(
        description="False when the source names the file but does not give its content."
    )
    description: str
    knob: str | None = Field(
        default=None, description="The setting it changes, e.g. 'extras.prefix_kv_cache_dtype': "
                                  "what a propagation check of it names.")


class FlagSet(_Input):
    """One row of a run matrix: extra server arguments, environment and deploy configs."""

    description: str
    args: list[str] = []
    env: dict[str, str] = {}
    deliberate_env: list[str] = Field(
        default=[], description="Variables of env that change what code the server loads "
                                "(LD_PRELOAD, PYTHONPATH, ...), set on purpose.")
    deploy_config: str | None = Field(
        default=None, description="Name of a [deploy_configs] entry passed as --deploy-config."
    )

    @field_validator("args")
    @classmethod
    def _no_harness_option(cls, args: list[str]) -> list[str]:
        return _not_the_harness_options(args, "deploy_config names a deploy config")

    @model_validator(mode="after")
    def _loader_env_deliberate(self) -> FlagSet:
        _deliberate_env(self.env, self.deliberate_env)
        return self


class OfflineKwargSet(_Input):
    """Keyword arguments for an offline `Omni(...)` engine, plus environment."""

    description: str
    kwargs: dict | None = Field(
        default=None,
        description="Omni(...) kwargs; absent when the source does not state them (not runnable).",
    )
    env: dict[str, str] = {}
    deliberate_env: list[str] = Field(
        default=[], description="Variables of env that change what code the runner loads "
                                "(LD_PRELOAD, PYTHONPATH, ...), set on purpose.")

    @model_validator(mode="after")
    def _loader_env_deliberate(self) -> OfflineKwargSet:
        _deliberate_env(self.env, self.deliberate_env)
        return self


class SimCapacity(_Input):
    """The simulated server's capacity model (MiB and seconds); only a simulated host has one."""

    vram_mib: PositiveMib = Field(description="Memory of the modelled card.")
    context_mib: Mib = Field(description="CUDA context and other non-PyTorch memory.")
    init_chunk_mib: PositiveMib = Field(description="Size of each parameter allocation at init.")
    dit_mib: dict[str, Mib] = Field(description="Resident DiT weights by precision (bf16, ...).")
    encoder_mib: dict[str, Mib] = Field(
        description="Text-encoder weights by precision; off the GPU under --enable-cpu-offload."
    )
    activation_mib: Mib = Field(description="Working memory of every request.")
    reference_mib: Mib = Field(description="Conditioning cache per reference image.")
    spike_mib: PositiveMib = Field(description="The per-step activation spike (image MLP).")
    kv_reference_mib: Mib = Field(
        default=0, description="Of reference_mib, the conditioning KV cache that "
                               "prefix_kv_cache_dtype quantizes (fp8_v: its V half).")
    layerwise_mib: Mib = Field(description="Extra staging under --enable-layerwise-offload.")
    collapsed: list[str] = Field(default=[], description="Precisions whose outputs collapse.")
    init_s: float = Field(ge=0, description="Modelled init time.")
    reference_s: float = Field(ge=0, description="Modelled prefill time per reference.")
    step_s: float = Field(ge=0, description="Modelled time per denoise step.")

    @model_validator(mode="after")
    def _precisions_match(self) -> SimCapacity:
        if set(self.dit_mib) != set(self.encoder_mib):
            raise ValueError("dit_mib and encoder_mib must list the same precisions")
        if "bf16" not in self.dit_mib:
            raise ValueError("dit_mib needs a 'bf16' entry (the precision without --quantization)")
        if self.kv_reference_mib > self.reference_mib:
            raise ValueError("kv_reference_mib is part of reference_mib and cannot exceed it")
        return self


class Emulation(_Input):
    """What an emulated host stands in for, and how its capacity is imposed on the GPU it runs on.

    The host entry itself describes the physical GPU (gpu, compute_capability and vram_gb are what
    the env checks compare NVML against); this table names the card it emulates.
    """

    emulates: str | None = Field(
        default=None, description="The host entry it emulates; its flag sets and offline kwarg "
                                  "sets are taken (and, for a simulated one, its capacity model).")
    capacity_mib: PositiveMib | None = Field(
        default=None, description="The emulated capacity; default: the emulated host's "
                                        "(vram_gb GiB, or a simulated host's vram_mib).")
    host_ram_gib: float | None = Field(
        default=None, gt=0, le=4096,
        description="The emulated card's host RAM, imposed on the offline runner's process tree "
                    "(cgroup v2 memory.max); null: host RAM is not emulated.")
    mechanism: Literal["memory-fraction", "sim-account"] = Field(
        description="memory-fraction: a startup hook on the server's PYTHONPATH caps PyTorch in "
                    "every server process (cap less its CUDA context), and the sampler checks "
                    "the process tree against the cap; sim-account: the simulated server's "
                    "accounted memory takes the cap as its total (no GPU).")

    @model_validator(mode="after")
    def _names_a_capacity(self) -> Emulation:
        if self.emulates is None and self.capacity_mib is None:
            raise ValueError("an emulation names the host it emulates ('emulates') or a "
                             "'capacity_mib'")
        return self


class Host(_Input):
    name: str = Field(description="Human name of the host, e.g. 'RTX 3090'.")
    hostname: str
    gpu: str
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    vram_gb: int = Field(gt=0, le=MAX_VRAM_GB, description="Nominal VRAM as marketed (GB).")
    host_ram_gib: float | None = Field(default=None, gt=0, le=MAX_MIB,
                                       description="null: not stated.")
    host_ram_note: str | None = None
    python_provider: str = Field(description="How the pinned Python is provided on this host.")
    idle_tolerance_mib: float = Field(
        default=256, ge=0,
        description="How far the GPU's used memory may sit above the run's first idle reading "
                    "when a server or runner is about to start: another program's VRAM moving "
                    "within it (a desktop's compositor, a browser) is recorded on the timeline "
                    "(idle_mib), not fatal. Chosen by omniprobe, not the seed.")
    simulated: bool = False
    serve_flag_sets: list[str]
    offline_kwarg_sets: list[str] = []
    serve_command: list[str] | None = Field(
        default=None, min_length=1,
        description="Replaces [serve] command on this host; {python}, {model}, {hosts_file} "
                    "and {host} are filled in.",
    )
    offline_command: list[str] | None = Field(
        default=None, min_length=1,
        description="Runs the offline runner on this host; {python}, {runner}, {hosts_file} and "
                    "{host} are filled in. Default: the host's pinned venv python and {runner}.",
    )
    args_check: ArgsCheck | None = Field(
        default=None, description="Replaces [serve] args_check on this host (with serve_command).")
    capacity: SimCapacity | None = Field(default=None, description="Simulated hosts only.")
    emulation: Emulation | None = Field(
        default=None, description="An emulated host: the card it emulates on this physical GPU.")
    model_code: list[str] = Field(
        # vLLM-Omni keeps its models' code under these trees; the rest of it is the server's.
        default=["vllm_omni/diffusion/models/", "vllm_omni/model_executor/models/"], min_length=1,
        description="Path fragments of the model's source files: an OOM's location is the "
                    "innermost traceback frame in them, and a crash there is the card's (a "
                    "traceback elsewhere in upstream code is the server software's).",
    )
    diffusers: DiffusersHost | None = Field(
        default=None, description="A Diffusers host: probe-offline runs the Diffusers engine over "
                                  "its diffusers_profiles, with these weights.")
    diffusers_profiles: list[str] = Field(
        default=[], description="The [diffusers_profiles] its offline runs build (Diffusers "
                                "hosts only).")
    memory_file_env: str | None = Field(
        default=None, pattern=rf"^{OWN_ENV_PREFIX}[A-Z0-9_]+$",
        description="The environment variable that tells the host's server (or offline runner) "
                    "the file to publish its memory in, where NVML cannot see it (a simulated "
                    "host); the sampler reads that file instead of NVML. null: NVML.",
    )

    @field_validator("serve_command")
    @classmethod
    def _serve_placeholders(cls, command: list[str] | None) -> list[str] | None:
        return _not_the_harness_options(_not_a_shell(_check_placeholders(
            command, SERVE_PLACEHOLDERS)), "a flag set's args add the rest")

    @field_validator("offline_command")
    @classmethod
    def _offline_placeholders(cls, command: list[str] | None) -> list[str] | None:
        return _not_a_shell(_check_placeholders(command, OFFLINE_PLACEHOLDERS))

    @model_validator(mode="after")
    def _capacity_iff_simulated(self) -> Host:
        if self.simulated and self.capacity is None:
            raise ValueError("a simulated host needs a [capacity] table")
        if not self.simulated and self.capacity is not None:
            raise ValueError("only a simulated host has a [capacity] table")
        if (self.diffusers is None) == bool(self.diffusers_profiles):
            if self.diffusers is not None:
                raise ValueError("a [diffusers] host needs diffusers_profiles")
            if self.diffusers_profiles:
                raise ValueError("diffusers_profiles need a [hosts.<name>.diffusers] table")
        if self.diffusers is not None and self.offline_kwarg_sets:
            raise ValueError("a Diffusers host runs diffusers_profiles, not offline_kwarg_sets")
        if self.emulation and self.emulation.mechanism == "sim-account" and not self.simulated:
            raise ValueError("the 'sim-account' mechanism needs a simulated server "
                             "(emulate a simulated host)")
        return self


class Report(_Input):
    """Identifiers the report cites (issue numbers in the downstream tracker)."""

    title: str
    downstream_repo: str
    serving_profile_issue: Issue
    topology_issue: Issue
    retention_issue: Issue
    upstream_issue: Issue
    earlier_probe_issue: Issue


class ProbeSettings(_Input):
    """hosts.toml [probe] (the serve probe itself is harness/probe.py's ServeProbe)."""

    target_reference_count: int = Field(ge=1)
    max_reference_pixels: int = Field(
        default=MAX_REFERENCE_PIXELS, gt=0, le=MAX_REFERENCE_PIXELS,
        description="The most pixels a reference image may hold; a larger one is refused before "
                    "it is decoded or sent.")


LAYOUT_PLACEHOLDERS = frozenset({"fixture", "source_name", "seed"})


class ImageChecks(_Input):
    """hosts.toml [quality]: the thresholds of the output-structure check (analysis/imaging.py)
    and how PSNR compares images with a baseline's (analysis/baseline_compare.py).

    Figures are on the 0-255 scale whatever the image's bit depth. The defaults are the values
    hosts.toml states; they apply where a table omits a key or no hosts.toml is found.
    """

    opaque_alpha: int = Field(
        default=255, ge=1, le=255, description="A pixel counts as opaque when its alpha is >= this."
    )
    min_opaque_fraction: float = Field(
        default=0.9, ge=0, le=1, description="Below this opaque fraction an image is broken."
    )
    flat_tile: int = Field(default=8, ge=2, description="Edge (px) of the flatness tiles.")
    flat_tolerance: int = Field(
        default=2, ge=0, le=255,
        description="A tile is near-constant when no RGB channel spans more than this many levels.",
    )
    max_flat_fraction: float = Field(
        default=0.98, ge=0, le=1,
        description="Above this fraction of near-constant tiles an image is broken (blank).",
    )
    min_rgb_std: float = Field(
        default=16, ge=0, le=255,
        description="Below this standard deviation of its RGB values an image is broken "
                    "(near-flat): the seed's collapse seen without alpha, which an RGB output "
                    "has, and whose grey noise no tile of the flatness check finds flat.",
    )
    comparator: Literal["rgba", "rgb"] = Field(
        default="rgba", description="Channels PSNR compares; rgba is the seed report's comparator."
    )
    convert_modes: bool = Field(
        default=False,
        description="Compare images of different modes after converting both to RGBA; "
        "false: a mode mismatch is an error.",
    )
    baseline_layout: str = Field(
        default="{fixture}/{seed}.png",
        description="Path of a baseline image under the baseline folder; placeholders {fixture} "
        "(fixture id), {source_name} (the source's name for it) and {seed}.",
    )

    @field_validator("baseline_layout")
    @classmethod
    def _layout_placeholders(cls, layout: str) -> str:
        fields = [(name, spec, conversion) for _, name, spec, conversion
                  in string.Formatter().parse(layout) if name is not None]
        for name, spec, conversion in fields:
            if spec or conversion or not name:
                raise ValueError(f"baseline_layout placeholders are bare names such as {{seed}}, "
                                 f"without a format spec or conversion; got {layout!r}")
        names = {name for name, _, _ in fields}
        unknown = names - LAYOUT_PLACEHOLDERS
        if unknown:
            raise ValueError(f"baseline_layout uses unknown placeholder(s) {sorted(unknown)}; "
                             f"expected {sorted(LAYOUT_PLACEHOLDERS)}")
        if "seed" not in names or not names & {"fixture", "source_name"}:
            raise ValueError("baseline_layout must name {seed} and {fixture} or {source_name}, "
                             f"got {layout!r}")
        if Path(layout).is_absolute() or ".." in Path(layout).parts:
            raise ValueError(f"baseline_layout must stay inside the baseline folder, "
                             f"got {layout!r}")
        return layout


class PinChoice(_Input):
    """Who chose something of an install step the seed does not state, and why."""

    chosen_by: Literal["omniprobe"] = Field(
        description="Who chose it: the seed does not state it.")
    reason: str = Field(min_length=1, description="Why, for the dry run, manifest and report.")


class StepOverride(PinChoice):
    """A step whose pin replaces every other package's requirement on it (uv `--override`), in
    the whole-plan resolution and every install step: where a package's own pin clashes with
    the seed's (vLLM-Omni 0.30.0 requires exactly diffusers==0.40.0; the seed pins a diffusers
    commit beside it)."""


class InstallStep(_Input):
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
                                  "(every [[baseline_env.install]] step); shown in the dry run "
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


class EnvChecks(_Input):
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


class _InstallPlan(_Input):
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
        description="Outside git: venvs go to <root>/envs/<host> (the baseline env to "
                    "<root>/envs/<host>-baseline), clones to <root>/git. OMNIPROBE_ENV_ROOT "
                    "overrides it.",
    )
    checks: EnvChecks = EnvChecks()


class BaselineEnv(_InstallPlan):
    """The Diffusers engine's own environment (`omniprobe env build --host NAME --env baseline`),
    apart from the probe env: vLLM-Omni 0.30.0 requires diffusers==0.40.0, which lacks
    QwenImage21Pipeline. The seed states none of its pins: each step records who chose it."""


class UpstreamPin(_Input):
    """The registry's vLLM-Omni that `nox -s upstream` holds the harness against (read, not run)."""

    package: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+-]*$")
    vllm: str | None = Field(
        default=None, pattern=r"^[0-9][0-9A-Za-z.+-]*$",
        description="The registry's vLLM whose serve parser (vLLM-Omni's starts from it) the "
                    "serve-flag checks read; null: vLLM's own flags are NOT FOUND.")


class HostsConfig(_Input):
    stack: Stack
    serve: Serve
    probe: ProbeSettings
    report: Report
    hosts: dict[Name, Host]
    flag_sets: dict[Name, FlagSet]
    deploy_configs: dict[Name, DeployConfig] = {}
    offline_kwarg_sets: dict[Name, OfflineKwargSet] = {}
    diffusers_profiles: dict[Name, DiffusersProfile] = {}
    quality: ImageChecks = ImageChecks()
    env: EnvConfig | None = Field(
        default=None, description="The probe environment build; null: not configured."
    )
    baseline_env: BaselineEnv | None = Field(
        default=None, description="The Diffusers engine's environment (probe-baseline's, and "
                                  "probe-offline's on a Diffusers host whose runner_env is "
                                  "'baseline'); null: not configured.")
    upstream: UpstreamPin | None = Field(
        default=None, description="The registry's upstream the contract checks run against.")

    @model_validator(mode="before")
    @classmethod
    def _inherit_emulated(cls, data):
        """An emulated host takes the matrix of the host it emulates: its flag sets, offline
        kwarg sets and, for a simulated one, the capacity model its server runs."""
        hosts = data.get("hosts") if isinstance(data, dict) else None
        if not isinstance(hosts, dict):
            return data
        filled = dict(hosts)
        for name, host in hosts.items():
            emulation = host.get("emulation") if isinstance(host, dict) else None
            emulates = emulation.get("emulates") if isinstance(emulation, dict) else None
            if emulates is None:
                continue
            target = hosts.get(emulates)
            if not isinstance(target, dict):
                raise ValueError(f"[hosts.{name}.emulation] key 'emulates': host {emulates!r} "
                                 "is not defined under [hosts]")
            if target.get("emulation") is not None:
                raise ValueError(f"[hosts.{name}.emulation] key 'emulates': host {emulates!r} "
                                 "is itself emulated; name a real or simulated host")
            inherited = {key: target[key] for key in _INHERITED if key in target}
            filled[name] = {**inherited, **host}
        return {**data, "hosts": filled}

    def host(self, name: str, where: str = "the command") -> Host:
        """The host called `name`; UnknownHost, saying who named it and listing the hosts."""
        if name not in self.hosts:
            raise UnknownHost(f"{where} names host {name!r}, which hosts.toml does not define; "
                              f"hosts: {self.hosts_list()}")
        return self.hosts[name]

    def hosts_list(self) -> str:
        return ", ".join(f"{name} ({'simulated' if h.simulated else h.hostname})"
                         for name, h in self.hosts.items())

    def real_hosts(self) -> dict[str, Host]:
        return {k: h for k, h in self.hosts.items() if not h.simulated}

    def emulated_cap_mib(self, name: str) -> int | None:
        """The capacity an emulated host imposes (MiB); None for a host that is not emulated."""
        emulation = self.host(name).emulation
        if emulation is None:
            return None
        if emulation.capacity_mib is not None:
            return emulation.capacity_mib
        target = self.host(emulation.emulates)
        return target.capacity.vram_mib if target.capacity else target.vram_gb * 1024


# What an emulated host takes from the host it emulates, unless it sets them itself.
_INHERITED = ("serve_flag_sets", "offline_kwarg_sets", "simulated", "capacity")


def _toml_loc(loc) -> str:
    """A pydantic location as the TOML table and key a user would look for."""
    parts = [str(p) for p in loc]
    if len(parts) == 3 and parts[2] == "[key]":  # the table's name itself
        return f"[{parts[0]}] name {parts[1]!r}"
    if len(parts) >= 3 and parts[0] in {"env", "baseline_env"} and parts[1] == "install":
        item = f"[[{parts[0]}.install]] item {parts[2]}"
        return f"{item} key '{'.'.join(parts[3:])}'" if len(parts) > 3 else item
    if len(parts) >= 2 and parts[0] in {"hosts", "flag_sets", "deploy_configs", "offline_kwarg_sets",
                                        "diffusers_profiles"}:
        table = f"[{parts[0]}.{parts[1]}]"  # one named table; a rule across its keys names it alone
        return f"{table} key '{'.'.join(parts[2:])}'" if len(parts) > 2 else table
    if len(parts) >= 2:
        return f"[{parts[0]}] key '{'.'.join(parts[1:])}'"
    return f"key '{parts[0]}'" if parts else ""


def _cross_references(cfg: HostsConfig, file: str) -> list[Problem]:
    problems = []
    for name, host in cfg.hosts.items():
        for flag_set in host.serve_flag_sets:
            if flag_set not in cfg.flag_sets:
                problems.append(Problem(file, f"[hosts.{name}] key 'serve_flag_sets'",
                                        f"flag set {flag_set!r} is not defined under [flag_sets]"))
        for profile in host.diffusers_profiles:
            if profile not in cfg.diffusers_profiles:
                problems.append(Problem(
                    file, f"[hosts.{name}] key 'diffusers_profiles'",
                    f"Diffusers profile {profile!r} is not defined under [diffusers_profiles]"))
        for kwarg_set in host.offline_kwarg_sets:
            if kwarg_set not in cfg.offline_kwarg_sets:
                problems.append(Problem(
                    file, f"[hosts.{name}] key 'offline_kwarg_sets'",
                    f"offline kwarg set {kwarg_set!r} is not defined under [offline_kwarg_sets]"))
    for name, flag_set in cfg.flag_sets.items():
        if flag_set.deploy_config and flag_set.deploy_config not in cfg.deploy_configs:
            problems.append(Problem(file, f"[flag_sets.{name}] key 'deploy_config'",
                                    f"deploy config {flag_set.deploy_config!r} is not defined "
                                    "under [deploy_configs]"))
    problems.extend(_env_against_stack(cfg, file))
    problems.extend(_baseline_choices(cfg, file))
    return problems


def _baseline_choices(cfg: HostsConfig, file: str) -> list[Problem]:
    """The seed states no pin of the baseline env, so each one says who chose it and why."""
    steps = cfg.baseline_env.install if cfg.baseline_env else []
    return [Problem(file, f"[[baseline_env.install]] item {i} ({step.name}) key 'chosen'",
                    "the seed states no pin of the baseline env: record who chose it and why, "
                    'chosen = { chosen_by = "omniprobe", reason = "..." }')
            for i, step in enumerate(steps) if step.chosen is None]


# Install steps that [stack] also pins: step field -> [stack] key that must hold the same value.
_STACK_PINS = {
    "torch": {"version": "torch", "index": "torch_index"},
    "transformers": {"version": "transformers"},
    "diffusers": {"git": "diffusers_repo", "commit": "diffusers_commit"},
    "vllm-omni": {"git": "upstream_repo", "commit": "upstream_commit"},
}


def _env_against_stack(cfg: HostsConfig, file: str) -> list[Problem]:
    """[stack] is what the report cites; [env] may not install anything else under those names."""
    if cfg.env is None:
        return []
    problems = []
    for i, step in enumerate(cfg.env.install):
        for field, stack_key in _STACK_PINS.get(step.name, {}).items():
            want, got = getattr(cfg.stack, stack_key), getattr(step, field)
            if got != want:
                problems.append(Problem(file, f"[[env.install]] item {i} key '{field}'",
                                        f"{step.name}: expected [stack] {stack_key} {want!r}, "
                                        f"got {got!r}"))
    manifest = cfg.env.checks.snapshot_manifest
    if manifest is not None and not (Path(file).parent / manifest).is_file():
        problems.append(Problem(file, "[env.checks] key 'snapshot_manifest'",
                                f"file {manifest!r} not found next to {Path(file).name}"))
    return problems


def load_hosts(path: str | Path) -> HostsConfig:
    """Load and check hosts.toml; raise InputError listing every problem."""
    path = Path(path)
    try:
        cfg = HostsConfig.model_validate(load_toml(path), strict=True)
    except ValidationError as exc:
        raise InputError(problems_from_validation(path, exc, _toml_loc)) from None
    problems = _cross_references(cfg, str(path))
    if problems:
        raise InputError(problems)
    return cfg
