"""The answer for one card and host RAM asked on the command line (`omniprobe answer`): the
report's answer per card and host, for a card of hosts.toml or a usable pool the user gives, at
any host RAM, from the committed evidence. Every decision is analysis/card_answers.py's and every
phrase the report's answer table's, so the two never disagree."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path, PurePosixPath

from omniprobe.analysis.capacity_bands import (
    newest_searches,
    searched_configs,
    unsearched_models,
)
from omniprobe.analysis.card_answers import RUNS, Answer, CardFigures
from omniprobe.analysis.diffusers_capacity import model_sweep_runs
from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.hosts import HostsConfig
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.validate import Loaded
from omniprobe.report.answers_view import AnswerBasis, AnswerRow, answer_basis, card_figures
from omniprobe.report.filters import count_range


@dataclass(frozen=True)
class AskedAnswer:
    """One model's answer for the card and host RAM asked."""

    model: str
    folder: str
    row: AnswerRow
    basis: AnswerBasis


def asked_card(hosts: HostsConfig, hosts_file: Path, card: str | None,
               usable_mib: int | None) -> CardFigures:
    """The card asked: hosts.toml's [cards] `card`, or a pool of `usable_mib` the user gives (an
    assumption the answer names, since omniprobe has no source for it)."""
    if usable_mib is not None:
        return CardFigures("card given", usable_mib, (f"usable pool {usable_mib:,} MiB as given",))
    cards = hosts.cards
    if card not in cards:
        raise InputError([Problem(str(hosts_file), "[cards]",
                                  f"no card {card!r}; expected one of {', '.join(cards)}, or "
                                  "--usable-mib for a card not listed")])
    return card_figures(cards[card])


def asked_answers(loaded: Loaded, root: Path, figures: CardFigures, ram_mib: int,
                  folder: str | None = None) -> list[AskedAnswer]:
    """The answer of each searched model (or of the model folder `folder`) for the card
    `figures` with `ram_mib` of host RAM; the emulated cards' sweeps count toward the host needs
    of the model they ran, as they do in the report."""
    folders = searched_configs(loaded.evidence)
    if folder is not None:
        folder = PurePosixPath(folder).as_posix()  # as written: "./models/x/" is "models/x"
        if folder not in folders:
            set_up = unsearched_models(loaded.evidence, loaded.hosts).get(folder)
            raise InputError([Problem(folder, "", (
                f"set up on {', '.join(set_up)} and not searched yet: `omniprobe "
                f"probe-capacity --host {set_up[0]}` searches it" if set_up else
                "no capacity search of this model folder is on record") + "; expected one of "
                + ", ".join(folders))])
    hosts = loaded.hosts
    default_resolution = hosts.diffusers_profile_defaults.output_resolution
    out = []
    for searched in [folder] if folder is not None else folders:
        searches = newest_searches(loaded.evidence, searched)
        if not searches:
            continue
        runs = model_sweep_runs(hosts, loaded.evidence, loaded.fixtures, searched)
        basis = answer_basis(hosts, searches, runs, default_resolution)
        row = AnswerRow(figures.name, (ram_mib,), False, *basis.answers(figures, ram_mib))
        out.append(AskedAnswer(load_model_configs(root, searched).manifest.model, searched, row,
                               basis))
    return out


def host_need_words(answers: tuple[Answer, ...]) -> str:
    """The host RAM each running answer's profile needs, counts that need the same together
    ('0–2: 41.6 GiB; 3–4: 41.9 GiB'); "—" where nothing runs."""
    running = [a for a in answers if a.status == RUNS and a.host_need_mib is not None]
    return "; ".join(f"{count_range([a.count for a in group])}: {gib:.1f} GiB"
                     for gib, group in groupby(running,
                                               key=lambda a: round(a.host_need_mib / 1024, 1))
                     ) or "—"
