"""`omniprobe select-host`: select the probe host without building its env, or show the probe's choice."""

from __future__ import annotations

import argparse

from omniprobe.config.project import find_project


def run(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.selection import record_selection, resolve_host

    project = find_project()
    cfg = load_hosts(project.hosts_file)
    if args.name is None:
        name, why = resolve_host(project, cfg, args.host)
        print(f"host {name} ({why})")
        return 0
    cfg.host(args.name, "select-host")
    selected = record_selection(project, args.name, [])
    print(f"selected host {args.name} for the probe sessions of this nox run (its env is checked "
          "when a probe starts)" if selected else
          "not in a nox run: nothing handed on; pass --host to the probe instead")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("select-host", help="select the probe host without building its env "
                       "(env-<host> builds and selects); without NAME, show the probe's choice")
    p.add_argument("name", nargs="?", help="select this host; without it, show the probe's choice")
    p.add_argument("--host", help="as the probe sessions take it, when NAME is not given")
    p.set_defaults(func=run)
