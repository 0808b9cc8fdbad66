"""The serve command as configuration gives it: the argument list and the environment a flag
set's server is started with. Pure functions of hosts.toml, below the process lifecycle
(harness/common/process.py starts what they build; env/preflight.py checks it parses in the env)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from omniprobe.config.command_rules import HARNESS_OPTIONS
from omniprobe.config.hosts import HostsConfig
from omniprobe.env.allocator import ALLOC_VARS, allocator_env
from omniprobe.errors import EnvironmentFailure, Refusal
from omniprobe.safe_io import confine


class FlagSetNotRunnable(Refusal):
    """A flag set needs something the source does not give (e.g. a deploy config's content)."""


class NotInEnv(EnvironmentFailure):
    """The serve command's program is not in the host's probe environment."""


# The options the harness adds itself, from their one list (config/command_rules.py HARNESS_OPTIONS).
HOST, PORT, SERVED_MODEL_NAME, ENFORCE_EAGER, DEPLOY_CONFIG = HARNESS_OPTIONS
_PLACEHOLDER = re.compile(r"\{(python|model|hosts_file|host)\}")


def in_env(program: str, bin_dir: Path | None) -> str:
    """A bare program name resolved in the env's bin folder, so the server is the env's `vllm`
    and never another one on PATH; a path, or no env, leaves it as it is."""
    if bin_dir is None or "/" in program:
        return program
    path = bin_dir / program
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise NotInEnv(f"the serve command's program {program!r} is not in the probe env: "
                       f"{path} is missing or not executable (hosts.toml [serve] command; "
                       "the env's packages should provide it)")
    return str(path)


def base_command(cfg: HostsConfig, host_name: str, *, model: str, hosts_file: Path,
                 bin_dir: Path | None = None) -> list[str]:
    """The host's serve command with its placeholders filled and its program resolved in the env."""
    host = cfg.host(host_name)
    fill = {"python": sys.executable, "model": model, "hosts_file": str(hosts_file),
            "host": host_name}
    program, *args = [_PLACEHOLDER.sub(lambda m: fill[m[1]], part)
                      for part in (host.serve_command or cfg.serve.command)]
    return [in_env(program, bin_dir), *args]


def server_command(cfg: HostsConfig, host_name: str, flag_set: str, *, port: int, model: str,
                   hosts_file: Path, bin_dir: Path | None = None) -> list[str]:
    """The argument list for one flag set: the host's command, the serve options, the flags."""
    command = base_command(cfg, host_name, model=model, hosts_file=hosts_file, bin_dir=bin_dir)
    command += [HOST, cfg.serve.bind_host, PORT, str(port)]
    if cfg.serve.enforce_eager:
        command.append(ENFORCE_EAGER)
    command += [SERVED_MODEL_NAME, cfg.serve.served_model_name]
    flags = cfg.flag_sets[flag_set]
    command += flags.args
    if flags.deploy_config:
        refused = flag_set_refusal(cfg, flag_set, hosts_file)
        if refused is not None:
            raise FlagSetNotRunnable(refused)
        command += [DEPLOY_CONFIG, str(deploy_path(cfg, flags.deploy_config, hosts_file))]
    return command


def deploy_path(cfg: HostsConfig, name: str, hosts_file: Path) -> Path:
    """A deploy config's file, inside the project (InputError naming hosts.toml's key if not)."""
    return confine(hosts_file.parent, cfg.deploy_configs[name].path, file=hosts_file,
                   field=f"[deploy_configs.{name}] key 'path'")


def flag_set_refusal(cfg: HostsConfig, flag_set: str, hosts_file: Path) -> str | None:
    """Why a flag set cannot run (its deploy config's content is not given, or its file is
    missing); None when it can. A run refuses such a flag set, so it asks nothing of an attempt."""
    name = cfg.flag_sets[flag_set].deploy_config
    if name is None:
        return None
    deploy = cfg.deploy_configs[name]
    path = deploy_path(cfg, name, hosts_file)
    if not deploy.content_known:
        return (f"flag set {flag_set!r} needs {deploy.path}, whose content the source does not "
                f"give ([deploy_configs.{name}] content_known = false)")
    if not path.is_file():
        return f"flag set {flag_set!r} needs {path}, which does not exist"
    return None


def server_env(cfg: HostsConfig, flag_set: str, base: dict[str, str],
               bin_dir: Path | None = None, *, alloc_var: str | None = None) -> dict[str, str]:
    """The environment: ours, the stack's offline variables, the flag set's, CUDA's bus order,
    and with an env, its bin folder first on PATH. A flag set's allocator setting goes under
    `alloc_var`, the variable the env check found torch honours (env/allocator.py), and ours
    of either name is dropped, so the one torch reads is the flag set's."""
    flags = allocator_env(cfg.flag_sets[flag_set].env, alloc_var)
    if any(var in flags for var in ALLOC_VARS):
        base = {k: v for k, v in base.items() if k not in ALLOC_VARS}
    # PCI bus order makes CUDA number the GPUs as NVML does, so the sampler watches the right one.
    env = {**base, **cfg.stack.offline_env, **flags, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if bin_dir is not None:
        # What the server starts by name (its own workers, compilers) comes from the env too.
        env["PATH"] = os.pathsep.join(filter(None, [str(bin_dir), base.get("PATH")]))
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env
