"""Checks of a host's probe environment, each recorded as pass, fail or skip with its detail.

The interpreter and every pin are read inside the venv; the GPU through NVML (the `nvml`
argument stands in for pynvml, so tests fake the GPU at that layer only); the model snapshot
through huggingface_hub's cache scan, which reads the filesystem and never downloads; the
reference suite against the digests the fixtures record.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omniprobe.config.fixtures import MAX_REFERENCE_PIXELS, load_fixtures, reference_problems
from omniprobe.config.hosts import Host, HostsConfig, InstallStep, load_hosts
from omniprobe.config.project import Project, find_project
from omniprobe.digests import sha256_file
from omniprobe.env.allocator import ALLOC_VARS, check_allocator_env, uses_allocator_env
from omniprobe.env.fetch_model import fetch_hint, hf_cache_dir
from omniprobe.env.preflight import preflight_plan, serve_preflight
from omniprobe.env.state import (
    EnvName,
    EnvNotReady,
    EnvPaths,
    Runner,
    build_command,
    env_config,
    env_paths,
    install_steps,
    pins_hash,
    stamp_state,
    uv_command,
)
from omniprobe.errors import InputError, problems_from_validation
from omniprobe.evidence.models.common import CheckStatus
from omniprobe.evidence.models.environment import EnvCheck, EnvPin, EnvPython, GpuFacts, HostFacts
from omniprobe.evidence.upstream import UpstreamContract
from omniprobe.safe_io import confine, load_json
from omniprobe.upstream.contract import check_clone

if TYPE_CHECKING:
    from huggingface_hub import CachedRevisionInfo

# Runs inside the venv's interpreter (any Python 3.8+): what is installed, and what torch sees.
_PROBE = r"""
import json, sys
from importlib import metadata
names, want_torch = json.loads(sys.argv[1])
out = {"version": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "dists": {}}
for name in names:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        out["dists"][name] = None
        continue
    out["dists"][name] = {"version": dist.version, "direct_url": dist.read_text("direct_url.json")}
if want_torch:
    try:
        import torch
        info = {"version": torch.__version__, "cuda": torch.version.cuda,
                "available": torch.cuda.is_available()}
        if info["available"]:
            info["name"] = torch.cuda.get_device_name(0)
            info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    except Exception as exc:
        info = {"error": "%s: %s" % (type(exc).__name__, exc)}
    out["torch"] = info
print(json.dumps(out))
"""


def _check(name: str, status: CheckStatus, detail: str, expected: object = None,
           actual: object = None) -> EnvCheck:
    return EnvCheck(name=name, status=status, detail=detail,
                    expected=None if expected is None else str(expected),
                    actual=None if actual is None else str(actual))


@dataclass
class Verification:
    """Everything one check pass found; the manifest is made from it."""

    host: str
    paths: EnvPaths
    pins_hash: str
    model_snapshot: str
    complete: bool  # the stamp records a complete build of exactly these pins
    uv_version: str | None
    python: EnvPython
    facts: HostFacts
    pins: list[EnvPin]
    freeze: list[str]
    checks: list[EnvCheck]
    phases: dict[str, float]
    upstream: UpstreamContract | None = None  # the contract check against the env's own clone
    upstream_note: str | None = None  # why it was not read, where it was not
    env: EnvName = "probe"

    @property
    def failed(self) -> list[EnvCheck]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed


# --- the GPU, through NVML --------------------------------------------------------------


def load_nvml() -> Any:
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_gpu(nvml: Any, index: int = 0) -> GpuFacts:
    """Device `index` as NVML reports it; raises whatever NVML raises when it cannot."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
        return GpuFacts(
            index=index,
            device_count=nvml.nvmlDeviceGetCount(),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            compute_capability=f"{major}.{minor}",
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
    finally:
        nvml.nvmlShutdown()


def _memory_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        return None
    return None


def host_facts(nvml: Any) -> HostFacts:
    gpu, error = None, None
    try:
        gpu = read_gpu(load_nvml() if nvml is None else nvml)
    except Exception as exc:  # NVML raises its own error classes, or the library is missing
        error = f"{type(exc).__name__}: {exc}"
    return HostFacts(hostname=socket.gethostname(), platform=platform.platform(),
                     machine=platform.machine(), cpu_count=os.cpu_count(),
                     memory_total_gib=_memory_total_gib(), gpu=gpu, nvml_error=error)


def gpu_checks(host: Host, facts: HostFacts, tolerance: float) -> list[EnvCheck]:
    """NVML against hosts.toml; an emulated host's entry describes its physical GPU."""
    if host.simulated and host.emulation is None:
        return [_check("gpu.nvml", "skip", "simulated host: its GPU is modelled, not checked")]
    gpu = facts.gpu
    if gpu is None:
        return [_check("gpu.nvml", "fail", f"NVML cannot read a GPU: {facts.nvml_error}",
                       expected=host.gpu)]
    gib = gpu.memory_total_mib / 1024
    off = abs(gib - host.vram_gb) / host.vram_gb
    return [
        _check("gpu.nvml", "pass", f"{gpu.device_count} device(s); checked index {gpu.index}"),
        _check("gpu.name", "pass" if gpu.name == host.gpu else "fail",
               "NVML's device name against hosts.toml gpu", host.gpu, gpu.name),
        _check("gpu.compute_capability",
               "pass" if gpu.compute_capability == host.compute_capability else "fail",
               "NVML's compute capability against hosts.toml", host.compute_capability,
               gpu.compute_capability),
        _check("gpu.memory", "pass" if off <= tolerance else "fail",
               f"NVML total {gpu.memory_total_mib} MiB is {off:.1%} from the nominal "
               f"{host.vram_gb} GB (tolerance {tolerance:.0%})",
               f"{host.vram_gb} GiB", f"{gib:.2f} GiB"),
        _check("gpu.driver", "pass", f"recorded; driver supports CUDA {gpu.cuda_driver_version}",
               actual=gpu.driver_version),
    ]


def emulation_check(cap_mib: int, facts: HostFacts) -> EnvCheck:
    """An emulated host's cap must fit the physical GPU; it is recorded either way."""
    gpu = facts.gpu
    if gpu is None:
        return _check("emulation.cap", "fail", f"NVML cannot read the physical GPU: "
                      f"{facts.nvml_error}", expected=f"a GPU of more than {cap_mib} MiB")
    fits = cap_mib < gpu.memory_total_mib
    return _check("emulation.cap", "pass" if fits else "fail",
                  f"the emulated {cap_mib:,} MiB against the physical {gpu.name}'s "
                  f"{gpu.memory_total_mib:,} MiB", f"< {gpu.memory_total_mib} MiB",
                  f"{cap_mib} MiB")


def torch_check(host: Host, probe: dict | None, torch_pinned: bool) -> EnvCheck:
    if not torch_pinned:
        return _check("torch.cuda", "skip", "torch is not among this env's pins")
    if host.simulated:
        return _check("torch.cuda", "skip", "simulated host: no GPU is expected")
    if probe is None:
        return _check("torch.cuda", "fail", "no venv interpreter to import torch with")
    info = probe.get("torch") or {}
    if "error" in info:
        return _check("torch.cuda", "fail", f"import torch failed: {info['error']}")
    if not info.get("available"):
        return _check("torch.cuda", "fail",
                      f"torch {info.get('version')} (CUDA {info.get('cuda')}) sees no CUDA device",
                      host.gpu)
    seen = f"{info['name']} sm {info['capability']}"
    good = info["name"] == host.gpu and info["capability"] == host.compute_capability
    return _check("torch.cuda", "pass" if good else "fail",
                  f"torch {info['version']} with CUDA {info['cuda']} sees device 0",
                  f"{host.gpu} sm {host.compute_capability}", seen)


# --- the venv: interpreter and pins -----------------------------------------------------


def _probe_venv(paths: EnvPaths, names: list[str], want_torch: bool, runner: Runner,
                offline_env: dict[str, str]) -> tuple[dict | None, str]:
    if not paths.python.exists():
        return None, f"no interpreter at {paths.python}: the venv is not built"
    # PCI bus order makes torch's device 0 NVML's device 0.
    env = {**os.environ, **offline_env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = runner.run([str(paths.python), "-I", "-c", _PROBE, json.dumps([names, want_torch])],
                      env=env)
    if proc.returncode != 0:
        return None, f"the venv interpreter failed: {proc.stderr.strip()[-500:]}"
    return json.loads(proc.stdout), ""


def _python_check(pinned: str, probe: dict | None, why: str) -> EnvCheck:
    if probe is None:
        return _check("python.version", "fail", why, pinned)
    version = probe["version"]
    good = version == pinned or version.startswith(pinned + ".")
    return _check("python.version", "pass" if good else "fail",
                  f"the venv interpreter {probe['executable']}", pinned, version)


def _git_head(folder: Path, runner: Runner) -> tuple[str | None, str]:
    head = runner.run(["git", "-C", str(folder), "rev-parse", "HEAD"])
    if head.returncode != 0:
        return None, f"{folder} is not a git checkout: {head.stderr.strip()}"
    dirty = runner.run(["git", "-C", str(folder), "status", "--porcelain",
                        "--untracked-files=no"])
    if dirty.stdout.strip():
        changed = ", ".join(line[3:] for line in dirty.stdout.splitlines()[:5])
        return head.stdout.strip(), f"tracked files changed in {folder}: {changed}"
    return head.stdout.strip(), ""


def _pin_check(step: InstallStep, dist: dict | None, runner: Runner
               ) -> tuple[EnvCheck, EnvPin]:
    name = f"package.{step.name.lower()}"
    source = (step.git or step.index or "default index")
    pin = EnvPin(name=step.name, kind=step.kind, pin=step.pin, source=source,
                 editable=step.editable,
                 installed_version=dist["version"] if dist else None,
                 override=(f"chosen by {step.override.chosen_by}: {step.override.reason}"
                           if step.override else None),
                 chosen=(f"chosen by {step.chosen.chosen_by}: {step.chosen.reason}"
                         if step.chosen else None))
    if dist is None:
        return _check(name, "fail", f"{step.name} is not installed", step.pin), pin
    if step.kind == "index":
        pin = pin.model_copy(update={"resolved": dist["version"]})
        good = dist["version"] == step.version
        return _check(name, "pass" if good else "fail", "installed version against the pin",
                      step.version, dist["version"]), pin
    url = json.loads(dist["direct_url"]) if dist["direct_url"] else {}
    if step.editable:
        if not url.get("dir_info", {}).get("editable"):
            return _check(name, "fail", f"not an editable install (from {url.get('url')})",
                          step.commit), pin
        folder = Path(unquote(urlparse(url["url"]).path))
        commit, problem = _git_head(folder, runner)
        detail = f"HEAD of the editable source {folder}"
    else:
        commit = url.get("vcs_info", {}).get("commit_id")
        problem = "" if commit else f"installed from {url.get('url') or 'an index'}, not git"
        detail = "the commit uv recorded at install"
    pin = pin.model_copy(update={"resolved": commit})
    good = bool(commit) and commit.startswith(step.pin) and not problem
    return _check(name, "pass" if good else "fail", problem or detail, step.commit,
                  commit), pin


# --- the model snapshot -----------------------------------------------------------------


class SnapshotManifest(BaseModel):
    """The snapshot's files and their sha256, for [env.checks] snapshot_manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        snapshot = _check("model.snapshot", "fail", f"missing: no Hugging Face cache at {cache}; "
                          f"{fetch_hint(cfg)}", cfg.stack.model_snapshot)
    else:
        info = scan_cache_dir(cache)
        cached = [r for r in info.repos if r.repo_id == repo and r.repo_type == "model"]
        revisions = [rev for r in cached for rev in r.revisions]
        matching = _at_revision(revisions, revision)
        if not cached:
            broken = [str(w) for w in info.warnings if repo.replace("/", "--") in str(w)]
            snapshot = _check("model.snapshot", "fail",
                              f"missing: {repo} is not in the cache {cache}"
                              + (f" ({'; '.join(broken)})" if broken else "")
                              + f"; {fetch_hint(cfg)}", cfg.stack.model_snapshot)
        elif len(matching) != 1:
            held = ", ".join(f"{rev.commit_hash[:12]} (refs: {', '.join(sorted(rev.refs)) or '-'})"
                             for rev in revisions) or "no complete revision"
            snapshot = _check("model.snapshot", "fail",
                              f"{repo} is cached at {held}, not at the pinned {revision}; "
                              f"{fetch_hint(cfg)}", revision,
                              ", ".join(rev.commit_hash for rev in revisions) or None)
        else:
            found = matching[0]
            snapshot = _check("model.snapshot", "pass", f"in {found.snapshot_path}", revision,
                              found.commit_hash)
    if manifest_file is None:
        return [snapshot, _check("model.snapshot_files", "skip",
                                 "no snapshot_manifest configured: the file digests are unknown")]
    try:
        path = confine(project.hosts_file.parent, manifest_file, file=project.hosts_file,
                       field="[env.checks] key 'snapshot_manifest'")
    except InputError as exc:
        return [snapshot, _check("model.snapshot_files", "fail", str(exc))]
    return [snapshot, _manifest_check(path, cfg.stack.model_snapshot, found)]


def _manifest_check(path: Path, model_snapshot: str, revision: CachedRevisionInfo | None
                    ) -> EnvCheck:
    name = "model.snapshot_files"
    try:
        manifest = SnapshotManifest.model_validate(load_json(path), strict=True)
    except (InputError, ValidationError) as exc:
        problems = (problems_from_validation(path, exc) if isinstance(exc, ValidationError)
                    else exc.problems)
        return _check(name, "fail", f"unusable manifest: {'; '.join(map(str, problems))}")
    if manifest.model_snapshot != model_snapshot:
        return _check(name, "fail", f"{path} lists the files of another snapshot",
                      model_snapshot, manifest.model_snapshot)
    if revision is None:
        return _check(name, "fail", "no snapshot at the pinned revision to compare")
    root = Path(revision.snapshot_path)
    present = {Path(f.file_path).relative_to(root).as_posix() for f in revision.files}
    bad = [f"{rel}: missing" for rel in sorted(set(manifest.files) - present)]
    bad += [f"{rel}: not in the manifest" for rel in sorted(present - set(manifest.files))]
    bad += [f"{rel}: sha256 {digest[:12]}…, manifest {manifest.files[rel][:12]}…"
            for rel in sorted(present & set(manifest.files))
            if (digest := sha256_file(root / rel)) != manifest.files[rel]]
    if bad:
        return _check(name, "fail", "; ".join(bad), f"{len(manifest.files)} files as in {path}",
                      f"{len(bad)} differ")
    return _check(name, "pass", f"every file matches {path}", f"{len(manifest.files)} files",
                  f"{len(present)} files")


# --- the reference suite ----------------------------------------------------------------


def references_check(project: Project, *, simulated: bool = False,
                     max_pixels: int = MAX_REFERENCE_PIXELS) -> EnvCheck:
    """The reference images of the fixtures this host can run: every fixture's but the simulated
    ones, which only a simulated host runs; each within `max_pixels` (hosts.toml [probe]
    max_reference_pixels)."""
    name = "fixtures.references"
    try:
        suite = load_fixtures(project.fixtures_file)
    except InputError as exc:
        return _check(name, "fail", f"cannot read the fixtures: {exc}")

    def runs_here(fixture) -> bool:
        return simulated or not fixture.simulated

    known = {ref.file for fixture in suite.fixtures if runs_here(fixture)
             for ref in fixture.references or []}
    if not known:
        return _check(name, "skip", f"the fixtures record no reference digests "
                                    f"({suite.reference_suite} bindings unknown)")
    bad = sorted({p.message for p in reference_problems(suite, project.fixtures_file, max_pixels,
                                              runs_here)})
    return _check(name, "fail" if bad else "pass",
                  "; ".join(bad) or f"{len(known)} files match the fixtures' sha256",
                  f"{len(known)} files", f"{len(known) - len(bad)} match")


# --- everything together ----------------------------------------------------------------


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


def contract_warnings(verification: Verification) -> list[str]:
    """One line per upstream contract check the env's clone fails (or why none was read)."""
    contract = verification.upstream
    if contract is None:
        note = verification.upstream_note
        return [f"upstream contract not checked: {note}"] if note else []
    return [f"upstream contract check {c.name} FAILS at {c.where or '(no location)'}: {c.detail}"
            for c in contract.checks if c.status == "fail"]


def _pipelines(cfg: HostsConfig, host: Host) -> list[str]:
    """The pipelines of the profiles the host runs; of every profile where it runs none."""
    profiles = [cfg.diffusers_profiles[p] for p in host.diffusers_profiles] or list(
        cfg.diffusers_profiles.values())
    return sorted({profile.pipeline for profile in profiles})


def pipeline_check(cfg: HostsConfig, host: Host, paths: EnvPaths, runner: Runner) -> EnvCheck:
    """The baseline env exists for the Diffusers engine: its diffusers must hold the pipeline of
    every profile the host runs (diffusers 0.40.0, vLLM-Omni 0.30.0's, has none)."""
    names = _pipelines(cfg, host)
    if not names:
        return _check("diffusers.pipeline", "skip", "hosts.toml has no Diffusers profile")
    if not paths.python.exists():
        return _check("diffusers.pipeline", "fail", f"no interpreter at {paths.python}",
                      ", ".join(names))
    code = "import diffusers, sys; [getattr(diffusers, n) for n in sys.argv[1:]]"
    proc = runner.run([str(paths.python), "-I", "-c", code, *names])
    return _check("diffusers.pipeline", "pass" if proc.returncode == 0 else "fail",
                  "the venv's diffusers holds the profiles' pipeline" if proc.returncode == 0
                  else f"the venv's diffusers lacks it: {proc.stderr.strip()[-300:]}",
                  ", ".join(names))


def verify_env(cfg: HostsConfig, project: Project, host_name: str, paths: EnvPaths, *,
               runner: Runner, nvml: Any = None, which: EnvName = "probe") -> Verification:
    """Run every check of `host_name`'s environment `which` at `paths`; never changes anything.
    The baseline env runs no server: no serve preflight or upstream contract, but the pipeline."""
    host = cfg.host(host_name)
    env = env_config(cfg, project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    want = pins_hash(cfg, project, which)
    phases: dict[str, float] = {}
    checks: list[EnvCheck] = []

    def timed(phase: str, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            phases[phase] = round(time.perf_counter() - start, 4)

    current, why = stamp_state(paths, want)
    checks.append(_check("env.stamp", "pass" if current else "fail", why))

    facts = timed("host", host_facts, nvml)
    if host.simulated:
        checks.append(_check("host.hostname", "skip", "simulated host: runs anywhere"))
    elif host.emulation is not None:
        checks.append(_check("host.hostname", "skip", "emulated host: runs on any machine with "
                             f"its physical GPU ({host.gpu})"))
    else:
        checks.append(_check("host.hostname", "pass" if facts.hostname == host.hostname
                             else "fail", "this machine's name against hosts.toml",
                             host.hostname, facts.hostname))

    names = [step.name for step in steps]
    torch_pinned = "torch" in names
    probe, why = timed("venv", _probe_venv, paths, names, torch_pinned, runner,
                       cfg.stack.offline_env)
    checks.append(_python_check(cfg.stack.python, probe, why))
    pins = []
    for step in steps:
        dist = probe["dists"].get(step.name) if probe else None
        check, pin = timed(f"pin:{step.name}", _pin_check, step, dist, runner)
        checks.append(check)
        pins.append(pin)

    # The model argument the probe will give: the pinned snapshot's folder where it is cached.
    snapshot = None if host.simulated else pinned_snapshot(cfg)
    model = None if snapshot is None else str(snapshot.snapshot_path)
    if which == "probe":
        checks.extend(timed("preflight", lambda: serve_preflight(
            cfg, host_name, project.hosts_file, python=str(paths.python), bin_dir=paths.bin_dir,
            runner=runner, model=model)))
    else:
        checks.append(timed("pipeline", pipeline_check, cfg, host, paths, runner))
    checks.extend(gpu_checks(host, facts, env.checks.vram_tolerance))
    if host.emulation is not None:
        checks.append(emulation_check(cfg.emulated_cap_mib(host_name), facts))
    checks.append(torch_check(host, probe, torch_pinned))
    checks.append(timed("allocator", check_allocator_env, cfg, host_name, paths, runner,
                        torch_pinned))
    checks.extend(timed("snapshot", snapshot_checks, cfg, project))
    checks.append(timed("references", lambda: references_check(
        project, simulated=host.simulated, max_pixels=cfg.probe.max_reference_pixels)))

    upstream, upstream_note = (None, None) if host.simulated or which != "probe" else timed(
        "upstream", clone_contract, cfg, project, paths)
    uv = uv_command()
    freeze: list[str] = []
    if paths.python.exists():
        proc = timed("freeze", runner.run, [uv, "pip", "freeze", "--python", str(paths.python)])
        freeze = proc.stdout.splitlines() if proc.returncode == 0 else []
    version = runner.run([uv, "--version"])
    uv_version = version.stdout.strip() if version.returncode == 0 else None
    python = EnvPython(pinned=cfg.stack.python, version=probe["version"] if probe else None,
                       executable=probe["executable"] if probe else None)
    return Verification(host=host_name, paths=paths, pins_hash=want,
                        model_snapshot=cfg.stack.model_snapshot, complete=current,
                        uv_version=uv_version,
                        python=python, facts=facts, pins=pins, freeze=freeze, checks=checks,
                        phases=phases, upstream=upstream, upstream_note=upstream_note, env=which)


def check_plan(cfg: HostsConfig, project: Project, host_name: str, paths: EnvPaths,
               which: EnvName = "probe") -> list[str]:
    """Every check verify_env runs, in its order, for a dry run: `name: what it looks at`."""
    host = cfg.host(host_name)
    env = env_config(cfg, project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    repo, revision = cfg.stack.model_repo, cfg.stack.model_revision
    lines = [f"env.stamp: {paths.stamp} records a complete build of exactly these pins",
             f"host.hostname: this machine is {host.hostname}" if host.emulation is None else
             "host.hostname: skipped (an emulated host runs on any machine with its GPU)",
             f"python.version: {paths.python} is Python {cfg.stack.python}"]
    lines += [f"package.{step.name.lower()}: {step.name} {step.pin} is what the venv holds"
              for step in steps]
    if which == "probe":
        lines += preflight_plan(cfg, host_name, project.hosts_file, paths,
                                model=snapshot_folder(cfg))
    else:
        lines.append(f"diffusers.pipeline: the venv's diffusers holds "
                     f"{', '.join(_pipelines(cfg, host)) or 'no pipeline (no profile)'}")
    lines.append(f"gpu.nvml, gpu.name, gpu.compute_capability, gpu.memory, gpu.driver: NVML's "
                 f"device against {host.gpu}, sm {host.compute_capability}, {host.vram_gb} GB")
    if host.emulation is not None:
        lines.append(f"emulation.cap: {cfg.emulated_cap_mib(host_name):,} MiB fits the "
                     f"physical {host.gpu}")
    lines.append(f"torch.cuda: the venv's torch sees {host.gpu} sm {host.compute_capability}")
    lines.append("torch.allocator_env: the allocator variable the venv's torch honours "
                 f"({' or '.join(ALLOC_VARS)}), read back from torch"
                 if uses_allocator_env(cfg, host_name) else
                 "torch.allocator_env: skipped (no flag set of this host sets it)")
    lines.append(f"model.snapshot: {repo} at the commit starting {revision} in the hub cache "
                 f"{hf_cache_dir()}; where it is missing, {fetch_hint(cfg)}")
    lines.append("model.snapshot_files: " + (
        f"every file against {env.checks.snapshot_manifest}" if env.checks.snapshot_manifest
        else "skipped (no snapshot_manifest: the seed states no file digests)"))
    lines.append("fixtures.references: the reference images of the fixtures this host runs "
                 "against their sha256 in fixtures/fixtures.json")
    if which == "probe":
        lines.append(f"upstream contract: the env's clone of {cfg.stack.upstream_repo} held "
                     "against the harness (a warning per failed check)")
    return lines


def expected_and_got(check: EnvCheck) -> str:
    if check.expected is None and check.actual is None:
        return ""
    return f" (expected {check.expected or 'nothing'}, got {check.actual or 'nothing'})"


def check_lines(heading: str, checks: list[EnvCheck]) -> list[str]:
    """The heading with the pass/fail/skip counts, then one line per check."""
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skip")}
    lines = [f"{heading}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip"]
    for c in checks:
        seen = expected_and_got(c) if c.status == "fail" else (f" [{c.actual}]" if c.actual else "")
        lines.append(f"  {c.status.upper():4} {c.name}: {c.detail}{seen}")
    return lines


def failure_lines(checks: list[EnvCheck]) -> list[str]:
    """One line per failed check, naming it."""
    return [f"{c.name} failed: {c.detail}{expected_and_got(c)}"
            for c in checks if c.status == "fail"]


def describe_failures(verification: Verification) -> str:
    return "\n".join(f"  {line}" for line in failure_lines(verification.checks))


def require_env_ok(host: str, *, project: Project | None = None, venv: str | Path | None = None,
                   nvml: Any = None, runner: Runner | None = None,
                   out: TextIO | None = None, which: EnvName = "probe") -> Verification:
    """For probe sessions: the verified env `which` of `host`, or EnvNotReady naming each failed
    check and the command that builds it.
    Each upstream contract check its clone fails is a warning to `out` (a probe may still be
    worth its GPU time: the check may fail because upstream really behaves so)."""
    project = project or find_project()
    cfg = load_hosts(project.hosts_file)
    paths = env_paths(cfg, project, host, venv, which)
    verification = verify_env(cfg, project, host, paths, runner=runner or Runner(), nvml=nvml,
                              which=which)
    if not verification.ok:
        raise EnvNotReady(
            f"the {which} environment of host {host!r} at {paths.venv} is not usable:\n"
            f"{describe_failures(verification)}\n"
            f"run `{build_command(host, which)}` (it repairs an incomplete build)")
    for line in contract_warnings(verification):
        print(f"warning: {line}", file=out or sys.stderr)
    return verification
