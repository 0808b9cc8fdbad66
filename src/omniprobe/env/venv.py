"""What a venv holds, read inside its own interpreter: the Python, each pin (a git pin at its
commit, clean), and the Diffusers pipelines the Diffusers env needs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.stack import InstallStep
from omniprobe.env.check_record import env_check
from omniprobe.env.state import EnvPaths, Runner
from omniprobe.evidence.models.environment import EnvCheck, EnvPin

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




def probe_venv(paths: EnvPaths, names: list[str], want_torch: bool, runner: Runner,
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


def python_check(pinned: str, probe: dict | None, why: str) -> EnvCheck:
    if probe is None:
        return env_check("python.version", "fail", why, pinned)
    version = probe["version"]
    good = version == pinned or version.startswith(pinned + ".")
    return env_check("python.version", "pass" if good else "fail",
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


def pin_check(step: InstallStep, dist: dict | None, runner: Runner
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
        return env_check(name, "fail", f"{step.name} is not installed", step.pin), pin
    if step.kind == "index":
        pin = pin.model_copy(update={"resolved": dist["version"]})
        good = dist["version"] == step.version
        return env_check(name, "pass" if good else "fail", "installed version against the pin",
                         step.version, dist["version"]), pin
    url = json.loads(dist["direct_url"]) if dist["direct_url"] else {}
    if step.editable:
        if not url.get("dir_info", {}).get("editable"):
            return env_check(name, "fail", f"not an editable install (from {url.get('url')})",
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
    return env_check(name, "pass" if good else "fail", problem or detail, step.commit,
                     commit), pin


def pipelines(cfg: HostsConfig, host: Host) -> list[str]:
    """The pipelines of the profiles the host runs; of every profile where it runs none."""
    profiles = [cfg.diffusers_profiles[p] for p in host.diffusers_profiles] or list(
        cfg.diffusers_profiles.values())
    return sorted({profile.pipeline for profile in profiles})


def pipeline_check(cfg: HostsConfig, host: Host, paths: EnvPaths, runner: Runner) -> EnvCheck:
    """The Diffusers env exists for the Diffusers engine: its diffusers must hold the pipeline of
    every profile the host runs (diffusers 0.40.0, vLLM-Omni 0.30.0's, has none)."""
    names = pipelines(cfg, host)
    if not names:
        return env_check("diffusers.pipeline", "skip", "hosts.toml has no Diffusers profile")
    if not paths.python.exists():
        return env_check("diffusers.pipeline", "fail", f"no interpreter at {paths.python}",
                         ", ".join(names))
    code = "import diffusers, sys; [getattr(diffusers, n) for n in sys.argv[1:]]"
    proc = runner.run([str(paths.python), "-I", "-c", code, *names])
    return env_check("diffusers.pipeline", "pass" if proc.returncode == 0 else "fail",
                     "the venv's diffusers holds the profiles' pipeline" if proc.returncode == 0
                     else f"the venv's diffusers lacks it: {proc.stderr.strip()[-300:]}",
                     ", ".join(names))
