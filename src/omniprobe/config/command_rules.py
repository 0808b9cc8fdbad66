"""What a command, an argument list or an environment in hosts.toml may hold: known
placeholders, no shell, none of the options the harness sets itself, loader variables only when
marked deliberate, server paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

SERVE_PLACEHOLDERS = frozenset({"python", "model", "hosts_file", "host"})
OFFLINE_PLACEHOLDERS = frozenset({"python", "runner", "hosts_file", "host"})


def placeholder_problems(command: list[str] | None, known: frozenset[str]) -> list[str] | None:
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


def not_a_shell(command: list[str] | None) -> list[str] | None:
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


def not_the_harness_options(args: list[str] | None, what: str) -> list[str] | None:
    for arg in args or []:
        option = harness_option(arg)
        if option is not None:
            raise ValueError(f"{arg!r} gives {option}, which the harness passes itself (every "
                             f"server gets {', '.join(HARNESS_OPTIONS)} from it; {what})")
    return args


def deliberate_loader_env(env: dict[str, str], deliberate: list[str]) -> None:
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
