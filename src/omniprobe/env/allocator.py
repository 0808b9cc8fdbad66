"""Which variable the env's torch reads its CUDA allocator setting from.

torch read it from PYTORCH_CUDA_ALLOC_CONF and now also from PYTORCH_ALLOC_CONF, and a release
ignored the new name: a flag set that sets the wrong one (`-expandable`) silently measures the
plain configuration. So the env check sets `expandable_segments:True` through each variable in a
fresh interpreter of the env, reads the setting back from torch, and records the variable it
honours (`torch.allocator_env`, its `actual`); the harness hands a flag set's setting to the
server and the runner under that name.
"""

from __future__ import annotations

import json
import os

from omniprobe.config.hosts import HostsConfig
from omniprobe.env.state import EnvPaths, Runner
from omniprobe.evidence.models.environment import EnvCheck

ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # the newer name first
CHECK = "torch.allocator_env"
_PROBE_SETTING = "expandable_segments:True"

# Runs inside the venv's interpreter: the allocator setting torch parsed, as it reads it back.
_READBACK = r"""
import json
import torch
get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
if get is not None:
    print(json.dumps({"api": "torch._C._accelerator_getAllocatorSettings()", "settings": get()}))
elif torch.cuda.is_available():
    torch.empty(1, device="cuda")  # the CUDA allocator parses its setting at first use
    snapshot = torch.cuda.memory._snapshot()
    if "allocator_settings" in snapshot:
        settings = snapshot["allocator_settings"].get("expandable_segments")
        api = "torch.cuda.memory._snapshot()['allocator_settings']"
    else:  # the segments say it themselves (seen on the H200's torch 2.11)
        flags = [s["is_expandable"] for s in snapshot.get("segments", []) if "is_expandable" in s]
        settings = bool(flags) and all(flags)
        api = "torch.cuda.memory._snapshot()['segments'][*]['is_expandable']"
    print(json.dumps({"api": api, "settings": "expandable_segments:%s" % settings}))
else:
    print(json.dumps({"api": None, "settings": None}))
"""


def uses_allocator_env(cfg: HostsConfig, host_name: str) -> bool:
    """Whether a flag set or offline kwarg set of the host sets the allocator's variable."""
    host = cfg.host(host_name)
    envs = [cfg.flag_sets[f].env for f in host.serve_flag_sets]
    envs += [cfg.offline_kwarg_sets[k].env for k in host.offline_kwarg_sets]
    return any(var in env for env in envs for var in ALLOC_VARS)


def honoured(readbacks: dict[str, dict | None]) -> list[str]:
    """The variables whose `expandable_segments:True` torch read back, newer name first."""
    def took(back: dict | None) -> bool:
        settings = (back or {}).get("settings") or ""
        return "expandable_segments:true" in settings.replace(" ", "").lower()
    return [var for var in ALLOC_VARS if took(readbacks.get(var))]


def allocator_check(readbacks: dict[str, dict | None]) -> EnvCheck:
    """The check from what torch read back under each variable (None: the interpreter failed)."""
    found = honoured(readbacks)
    apis = sorted({b["api"] for b in readbacks.values() if b and b.get("api")})
    if found:
        return EnvCheck(name=CHECK, status="pass", expected="one of " + ", ".join(ALLOC_VARS),
                        actual=found[0],
                        detail=f"torch reads {_PROBE_SETTING} back through {' and '.join(found)} "
                               f"({', '.join(apis)}); the harness sets {found[0]}")
    if not apis:
        why = "; ".join(f"{var}: " + ("the interpreter failed" if b is None
                                      else "no readback API and no CUDA")
                        for var, b in readbacks.items())
        return EnvCheck(name=CHECK, status="fail", expected="one of " + ", ".join(ALLOC_VARS),
                        detail=f"the allocator setting cannot be read back from torch ({why}): "
                               "the flag sets that set it could measure the plain configuration")
    return EnvCheck(name=CHECK, status="fail", expected="one of " + ", ".join(ALLOC_VARS),
                    actual="neither",
                    detail=f"torch reads {_PROBE_SETTING} back through neither variable "
                           f"({', '.join(apis)}): the flag sets that set it would measure the "
                           "plain configuration")


def read_back(python: str, runner: Runner, env: dict[str, str]) -> EnvCheck:
    """Set the setting through each variable in a fresh `python` and read it back (the env check
    of a venv, and the offline runner's own Python on a Diffusers host, alike)."""
    base = {k: v for k, v in env.items() if k not in ALLOC_VARS}
    readbacks: dict[str, dict | None] = {}
    for var in ALLOC_VARS:
        proc = runner.run([python, "-I", "-c", _READBACK], env={**base, var: _PROBE_SETTING})
        try:
            readbacks[var] = json.loads(proc.stdout) if proc.returncode == 0 else None
        except ValueError:
            readbacks[var] = None
    return allocator_check(readbacks)


def check_allocator_env(cfg: HostsConfig, host_name: str, paths: EnvPaths, runner: Runner,
                        torch_pinned: bool) -> EnvCheck:
    """Set the setting through each variable in a fresh interpreter of the env and read it back;
    skipped where no flag set of the host sets it, or torch is not pinned."""
    if not torch_pinned or not uses_allocator_env(cfg, host_name):
        return EnvCheck(name=CHECK, status="skip",
                        detail="no flag set of this host sets the allocator's variable"
                        if torch_pinned else "torch is not among this env's pins")
    if not paths.python.exists():
        return EnvCheck(name=CHECK, status="fail", detail=f"no interpreter at {paths.python}")
    return read_back(str(paths.python), runner, {**os.environ, **cfg.stack.offline_env})


def honoured_var(checks: list[EnvCheck]) -> str | None:
    """The variable the env check found torch honours; None where it did not look."""
    found = [c.actual for c in checks if c.name == CHECK and c.status == "pass"]
    return found[0] if found else None


def allocator_env(env: dict[str, str], var: str | None) -> dict[str, str]:
    """`env` with a setting given under either allocator variable moved to `var`, the one the
    env's torch honours (None: as given)."""
    given = [name for name in ALLOC_VARS if name in env]
    if var is None or not given:
        return env
    value = env[given[0]]
    out = {k: v for k, v in env.items() if k not in ALLOC_VARS}
    out[var] = value
    return out
