"""The serve preflight, before any GPU time: the host's serve command resolves in its env, its
entry point imports, and its argument parser accepts every flag set's arguments.

Each is a named env check (`serve.command`, `serve.entry_point`, `serve.args:<flag set>`), so
`omniprobe env check|build` shows it and the probe sessions refuse with it. A failure names its
cause as the failure classifier reads it (a missing module, an unknown flag, a missing program).
The arguments are checked as the host's `args_check` says: by the help text every option the
probe passes must appear in (vLLM), or by the server's own parse-only mode (the sim). In that
mode every parse runs the entry point, so its separate import runs only when a parse fails, to
name the cause.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.log_text import plain_log
from omniprobe.config.hosts import HostsConfig
from omniprobe.env.check_record import env_check
from omniprobe.env.serve_command import (
    FlagSetNotRunnable,
    NotInEnv,
    base_command,
    server_command,
    server_env,
)
from omniprobe.env.state import Runner
from omniprobe.evidence.models.environment import EnvCheck

# Importing vLLM imports torch: generous, but bounded.
TIMEOUT_S = 300.0

# Runs in the serve command's interpreter: import what `python -m MODULE` or the console script
# PROGRAM would run, without running it.
_ENTRY = r"""
import importlib, importlib.util, sys
from importlib import metadata
kind, name = sys.argv[1], sys.argv[2]
if kind == "module":
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError("No module named %r" % name)
    if spec.submodule_search_locations is not None:
        name += ".__main__"
    importlib.import_module(name)
    print(name)
else:
    found = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == name]
    if not found:
        sys.exit("ModuleNotFoundError: no console script named %r in this environment" % name)
    found[0].load()
    print(found[0].value)
"""


def _why(proc, model_code: tuple[str, ...]) -> str:
    """What a failed command says, as the failure classifier reads it (else its last line)."""
    text = plain_log(f"{proc.stdout}\n{proc.stderr}")
    cause = classify_failure(text, model_code)
    if cause is not None:
        return f"{cause.kind}: {cause.reason}"
    last = [line.strip() for line in text.splitlines() if line.strip()][-1:]
    return f"exit {proc.returncode}" + (f": {last[0][:300]}" if last else "")


def _entry_point(command: list[str], python: str) -> tuple[str, str, str]:
    """(interpreter, 'module', 'code' or 'script', name) of what the command runs."""
    program, *args = command
    if args[:1] == ["-m"] and len(args) > 1:
        return program, "module", args[1]
    if args[:1] == ["-c"]:
        return program, "code", ""
    return python, "script", Path(program).name


def _program_check(command: list[str]) -> EnvCheck:
    program = command[0]
    found = program if "/" in program else shutil.which(program)
    if found is None or not (Path(found).is_file() and os.access(found, os.X_OK)):
        return env_check("serve.command", "fail", f"command not found: {program} is missing or not "
                      "executable", "an executable", program)
    return env_check("serve.command", "pass", "the serve command's program resolves", actual=program)


def _entry_point_check(command: list[str], python: str, runner: Runner,
                       model_code: tuple[str, ...]) -> EnvCheck:
    interpreter, kind, name = _entry_point(command, python)
    if kind == "code":
        return env_check("serve.entry_point", "skip", "the command runs inline code (`-c`), no "
                      "entry point: its argument check shows whether it starts")
    proc = runner.run([interpreter, "-c", _ENTRY, kind, name], timeout_s=TIMEOUT_S)
    if proc.returncode != 0:
        return env_check("serve.entry_point", "fail",
                      f"{interpreter} cannot import {kind} {name}: {_why(proc, model_code)}",
                      f"{name} imports")
    lines = proc.stdout.strip().splitlines()
    return env_check("serve.entry_point", "pass", f"{kind} {name} imports",
                  actual=lines[-1] if lines else None)


def _options(argv: list[str]) -> list[str]:
    """The long options of an argument list, without their `=value`."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def serve_preflight(cfg: HostsConfig, host_name: str, hosts_file: Path, *, python: str,
                    bin_dir: Path | None, runner: Runner, model: str | None = None,
                    base_env: dict[str, str] | None = None,
                    flag_sets: tuple[str, ...] = ()) -> list[EnvCheck]:
    """The preflight checks of the host's serve command; runs the command's parser, never a
    server. `python`: the env's interpreter (a console script's entry point is read with it);
    `flag_sets`: the ones to check (empty: all of the host's)."""
    host = cfg.host(host_name)
    model = model or cfg.stack.model_repo
    model_code = tuple(host.model_code)
    try:
        base = base_command(cfg, host_name, model=model, hosts_file=hosts_file, bin_dir=bin_dir)
    except NotInEnv as exc:
        return [env_check("serve.command", "fail", f"command not found: {exc}")]
    program = _program_check(base)
    if program.status == "fail":
        return [program]
    args_check = host.args_check or cfg.serve.args_check
    env = dict(os.environ if base_env is None else base_env)
    commands: list[tuple[str, list[str] | None, str]] = []  # flag set, command, why not runnable
    for flag_set in [f for f in host.serve_flag_sets if not flag_sets or f in flag_sets]:
        try:
            commands.append((flag_set, server_command(
                cfg, host_name, flag_set, port=cfg.serve.port, model=model,
                hosts_file=hosts_file, bin_dir=bin_dir), ""))
        except FlagSetNotRunnable as exc:
            commands.append((flag_set, None, str(exc)))

    if args_check.mode == "parse":
        parsed = _parses(commands, args_check.args, cfg, env, bin_dir, runner, model_code)
        _, kind, name = _entry_point(base, python)
        ran = [c for c in parsed if c.status != "skip"]
        if ran and all(c.status == "pass" for c in ran) and kind != "code":
            # Each parse ran the entry point: a separate import would only repeat it.
            entry = env_check("serve.entry_point", "pass",
                           f"{kind} {name} imports (each flag set's parse ran it)")
            return [program, entry, *parsed]
        entry = _entry_point_check(base, python, runner, model_code)
        return [program, entry] + ([] if entry.status == "fail" else parsed)

    entry = _entry_point_check(base, python, runner, model_code)
    if entry.status == "fail":
        return [program, entry]
    argv = [*base, *args_check.args]
    proc = runner.run(argv, env=server_env(cfg, host.serve_flag_sets[0], env, bin_dir),
                      timeout_s=TIMEOUT_S)
    if proc.returncode != 0:
        return [program, entry, env_check("serve.args", "fail",
                                       f"`{shlex.join(argv)}` failed: {_why(proc, model_code)}")]
    help_text = plain_log(proc.stdout + proc.stderr)
    checks = [program, entry]
    for flag_set, command, why_not in commands:
        name = f"serve.args:{flag_set}"
        if command is None:
            checks.append(env_check(name, "skip", f"not runnable, so not checked: {why_not}"))
            continue
        unlisted = [o for o in _options(command[len(base):])
                    if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", help_text)]
        checks.append(env_check(
            name, "fail" if unlisted else "pass",
            f"argument error: the serve help does not list {', '.join(unlisted)}" if unlisted
            else f"every option is listed by `{shlex.join(args_check.args)}`",
            "every option listed", ", ".join(unlisted) or None))
    return checks


def _parses(commands, args: list[str], cfg: HostsConfig, env: dict[str, str],
            bin_dir: Path | None, runner: Runner, model_code: tuple[str, ...]) -> list[EnvCheck]:
    """Each flag set's full command run in the server's parse-only mode (`args`), side by side:
    each is an interpreter start and nothing else."""
    runnable = [(f, [*command, *args]) for f, command, _ in commands if command is not None]
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = dict(zip([f for f, _ in runnable], pool.map(lambda item: runner.run(
            item[1], env=server_env(cfg, item[0], env, bin_dir), timeout_s=TIMEOUT_S), runnable),
            strict=True))
    checks = []
    for flag_set, command, why_not in commands:
        name = f"serve.args:{flag_set}"
        if command is None:
            checks.append(env_check(name, "skip", f"not runnable, so not checked: {why_not}"))
        elif procs[flag_set].returncode == 0:
            checks.append(env_check(name, "pass", "the serve command's parser accepts the arguments"))
        else:
            checks.append(env_check(name, "fail", "the parser refuses the arguments: "
                                 f"{_why(procs[flag_set], model_code)}", "exit 0",
                                 f"exit {procs[flag_set].returncode}"))
    return checks


def preflight_plan(cfg: HostsConfig, host_name: str, hosts_file: Path, paths,
                   model: str | None = None) -> list[str]:
    """What the serve preflight will run in the env at `paths` with `model` (default: the repo
    id), for a dry run; runs nothing."""
    host = cfg.host(host_name)
    fill = {"python": str(paths.python), "model": model or cfg.stack.model_repo,
            "hosts_file": str(hosts_file), "host": host_name}
    program, *args = [re.sub(r"\{(\w+)\}", lambda m: fill.get(m[1], m[0]), part)
                      for part in (host.serve_command or cfg.serve.command)]
    program = program if "/" in program else str(paths.bin_dir / program)
    interpreter, kind, name = _entry_point([program, *args], str(paths.python))
    args_check = host.args_check or cfg.serve.args_check
    lines = [f"serve.command: {program} exists and is executable",
             f"serve.entry_point: {interpreter} imports the {kind} {name}"]
    if args_check.mode == "help":
        lines.append(f"serve.args: {shlex.join([program, *args, *args_check.args])}, which "
                     "must list every option of each flag set: "
                     + ", ".join(host.serve_flag_sets))
    else:
        lines.append(f"serve.args:<flag set>: each flag set's full command with "
                     f"{shlex.join(args_check.args)} must exit 0: "
                     + ", ".join(host.serve_flag_sets))
    return lines
