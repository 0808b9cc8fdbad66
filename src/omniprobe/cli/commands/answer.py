"""`omniprobe answer`: on this card, with this much host RAM, which searched profile runs each
reference count, with what spare, at what speed, giving up what, and how sure: the report's
answer per card and host, asked for any card and RAM, from the committed evidence."""

from __future__ import annotations

import argparse

from omniprobe.cli.options import parser_of
from omniprobe.config.project import find_project
from omniprobe.harness.common.options import POOL_MIB, Bounds

HOST_RAM_GIB = Bounds("host_ram_gib", float, 0, 4096,
                      "a host RAM in GiB above 0 and at most 4096", low_open=True)


def run(args: argparse.Namespace) -> int:
    from omniprobe.evidence.validate import load_valid_project
    from omniprobe.report.answer_query import asked_answers, asked_card, host_need_words
    from omniprobe.report.model_search_view import unsearched_model_views

    project = find_project()
    loaded = load_valid_project(project)
    figures = asked_card(loaded.hosts, project.hosts_file, args.card, args.usable_mib)
    ram_mib = round(args.host_ram_gib * 1024)
    answers = asked_answers(loaded, project.root, figures, ram_mib, args.model_folder)
    for i, asked in enumerate(answers):
        row, basis = asked.row, asked.basis
        if i:
            print()
        print(f"{asked.model} ({asked.folder}) on the {figures.name}, usable pool "
              f"{figures.usable_mib:,} MiB, with {args.host_ram_gib:g} GiB host RAM:")
        print(f"  {row.said(basis.words)}")
        print(f"  what runs, by reference count: {row.what_runs}")
        print(f"  host RAM it needs (the most its runs held, page-locked included): "
              f"{host_need_words(row.answers)}")
        print(f"  giving nothing up: {row.giving_nothing_up}")
        print(f"  grade: {row.grade}" + (f" ({'; '.join(row.assumptions)})"
                                          if row.assumptions else ""))
        named = sorted(row.profiles)
        if named:
            print("  the profiles named: " + "; ".join(f"`{p}`, {basis.words[p]}"
                                                     for p in named))
        print(f"  fastest by {basis.speed_basis}")
    if answers:
        print("\nSpare: the usable pool less the band's A (MiB), at least the band's width. "
              "Times are relative, the measuring GPU's, never seconds for this card. Every "
              "band is of random weights: capacity, not quality.")
    else:
        print("no capacity search is on record: `omniprobe probe-capacity` makes one")
    if args.model_folder is None:
        for model in unsearched_model_views(loaded, project.root):
            print(f"\n{model.model} ({model.configs}): set up, not searched yet; "
                  f"`omniprobe probe-capacity --host {model.hosts[0]}` searches it")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("answer", help="on a card with a host RAM: which searched profile runs "
                                      "each reference count, from the committed evidence")
    card = p.add_mutually_exclusive_group(required=True)
    card.add_argument("--card", help="a card of hosts.toml's [cards] (e.g. rtx3090)")
    card.add_argument("--usable-mib", type=parser_of(POOL_MIB),
                      help="the pool torch can have on a card not listed: its memory less its "
                           "CUDA context and other processes' (MiB)")
    p.add_argument("--host-ram-gib", type=parser_of(HOST_RAM_GIB), required=True,
                   help="the host's RAM in GiB (swap never counts)")
    p.add_argument("--model-folder",
                   help="a model folder searched (e.g. models/flux2-klein/4b); default: every "
                        "model searched")
    p.set_defaults(func=run)
