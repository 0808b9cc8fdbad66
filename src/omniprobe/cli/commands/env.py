"""`omniprobe env build|check|fetch-model`: a host's pinned probe environment, and its model."""

from __future__ import annotations

import argparse
import sys

from omniprobe.config.project import find_project


def _env_command(args: argparse.Namespace) -> list[str]:
    return ["omniprobe", "env", args.env_command, "--host", args.host,
            *(["--env", args.env] if args.env != "probe" else []),
            *(["--venv", args.venv] if args.venv else [])]


def _sim_env(args: argparse.Namespace, project) -> tuple[int, list[str], str | None]:
    """`env build|check` of a simulated host: no build, the checks of what its server runs on;
    (exit status, failed checks, no venv)."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.simulated import check_sim_env, format_sim_env

    if args.dry_run:
        print(f"# omniprobe env build --host {args.host}: a simulated host; nothing to build "
              f"(dry run: nothing was run)\n# checks: {sys.executable} imports omniprobe.sim; "
              "the references of the fixtures it runs (simulated and stand-in)")
        return 0, [], None
    env = check_sim_env(load_hosts(project.hosts_file), project, args.host)
    print(format_sim_env(env), end="")
    return (0 if env.ok else 1), env.problems, None


def _pinned_env(args: argparse.Namespace, project) -> tuple[int, list[str], str | None]:
    """`env build|check` of a real host: (exit status, failed checks, venv)."""
    from omniprobe.env.build import build_env, check_env, dry_run, format_result
    from omniprobe.env.check_record import failure_lines

    if args.dry_run:
        print(dry_run(project, args.host, venv=args.venv, which=args.env), end="")
        return 0, [], None
    run = build_env if args.env_command == "build" else check_env
    result = run(args.host, project=project, venv=args.venv, command=_env_command(args),
                 which=args.env)
    print(format_result(result, project), end="")
    problems = failure_lines(result.verification.checks)
    # The probe sessions run on the probe env's venv; the Diffusers env is found at its own folder.
    venv = str(result.paths.venv) if args.env == "probe" else None
    return (1 if problems else 0), problems, venv


def _fetch_model(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.fetch_model import fetch_model

    fetch_model(load_hosts(find_project().hosts_file), revision=args.revision)
    return 0


def run(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.selection import INVOCATION_ENV, record_env_failure, record_selection
    from omniprobe.env.state import EnvError

    project = find_project()
    host = load_hosts(project.hosts_file).host(args.host, "--host")
    simulated = host.simulated
    if args.env is None:  # the env the host's runs need: its runner's, where that is the Diffusers env
        from omniprobe.harness.offline.env import runner_env_name

        args.env = runner_env_name(host) or "probe"
    select = args.select and not args.dry_run
    if args.select and args.dry_run:
        record_env_failure(project, args.host, "it was a dry run (--dry-run): nothing was built "
                                               "or checked")
    elif select:  # until it ends well, this session has failed: a crash selects nothing either
        record_env_failure(project, args.host, "it did not finish (see its output)")
    try:
        code, problems, venv = (_sim_env if simulated else _pinned_env)(args, project)
    except EnvError as exc:
        if select:  # the probe sessions after refuse, saying why
            record_selection(project, args.host, [" ".join(str(exc).split())])
        raise
    if select:
        selected = record_selection(project, args.host, problems, venv=venv)
        if not selected:
            print(f"--select: not in a nox run ({INVOCATION_ENV} unset); nothing handed on")
        elif problems:
            print(f"env-{args.host} failed: no host selected; the probe sessions of this nox run "
                  "refuse")
        else:
            print(f"selected host {args.host} for the probe sessions of this nox run")
    return code


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="build or check a host's pinned probe environment")
    env_sub = p.add_subparsers(dest="env_command", required=True)
    for name, text in (
        ("build", "build the env from hosts.toml (only verifies when nothing changed); a "
                  "simulated host's env is omniprobe itself: only checked, nothing installed"),
        ("check", "check the env and file its manifest; builds nothing"),
    ):
        q = env_sub.add_parser(name, help=text)
        q.add_argument("--host", required=True, help="a hosts.toml host")
        q.add_argument("--venv", help="venv path (default: <[env] root>/envs/<host>, the "
                                      "Diffusers env's <[env] root>/envs/<host>-diffusers)")
        q.add_argument("--env", choices=("probe", "diffusers"), default=None,
                       help="which env: the probe's ([env]) or the Diffusers engine's own "
                            "([diffusers_env]), each with its own venv and manifest (default: "
                            "the Diffusers env for a host whose runner runs in it, else the "
                            "probe's)")
        if name == "build":
            q.add_argument("--dry-run", action="store_true",
                           help="print the commands a build runs; run nothing")
            q.add_argument("--select", action="store_true",
                           help="then select the host, and this env, for the probe sessions of "
                                "the same nox run (env-<host>); failed checks make them refuse")
        q.set_defaults(func=run, dry_run=False, select=False)

    q = env_sub.add_parser("fetch-model", help="download the pinned model snapshot ([stack] "
                           "model_snapshot) into the hub cache: the commit its short revision "
                           "names, found in the repository's commit list")
    q.add_argument("--revision", help="the full commit (default: the one of the main branch's "
                                      "commits that starts with the pinned revision)")
    q.set_defaults(func=_fetch_model)
