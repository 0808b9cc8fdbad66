"""The report's answer per card and host, one table per model: for each card in hosts.toml and
each host RAM (the card's own host's where stated, else [probe] answer_host_ram_gib), which
searched profile runs each reference count, and the opening's line per card in plain words. Every
decision is analysis/card_answers.py's."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from omniprobe.analysis.capacity_bands import Searched
from omniprobe.analysis.card_answers import (
    HOST_SHORT,
    HOST_UNKNOWN,
    MARGIN,
    NO_FIT,
    NOT_SEARCHED,
    RUNS,
    Answer,
    Candidate,
    CardFigures,
    answer,
    candidates_at,
    host_needs,
    settings_words,
    timed_basis,
    untimed_at,
)
from omniprobe.analysis.diffusers_capacity import ProfileRun
from omniprobe.config.cards import Card
from omniprobe.config.hosts import HostsConfig
from omniprobe.report.filters import count_range, names

GRADES = {
    "measured": "measured on the card itself",
    "emulated": "measured on the H200 with its memory capped like the card's",
    "derived": "derived from a band of the capacity search and the card's sourced figures",
    "assumed": "derived, with some of the figures assumed",
}


def card_figures(card: Card) -> CardFigures:
    return CardFigures(card.name, card.usable_pool_mib, card.assumed)


def group_text(answers: list[Answer]) -> str:
    """One run of counts with the same answer, in words (spare in MiB, as the table's header
    says): the least margin over them, the largest relative time; where nothing runs, the least
    host need or the least shortfall over them."""
    first, counts = answers[0], count_range([a.count for a in answers])
    p = f"`{first.profile}`"
    if first.status == RUNS:
        spare = min(a.margin_mib for a in answers)
        slow = max((a.relative_speed or 1.0) for a in answers)
        return (f"{counts}: {p}, {spare:,} spare"
                + (f", {slow:g}× the fastest GPU fit's time" if slow > 1.0 else ""))
    if first.status == MARGIN:
        return f"{counts}: {p} at the margin"
    if first.status == HOST_SHORT:
        need = max(a.host_need_mib for a in answers)
        return f"{counts}: none, each needs {need / 1024:.1f} GiB host RAM or more"
    if first.status == HOST_UNKNOWN:
        return f"{counts}: {p} fits the GPU, its host need not measured"
    if first.status == NO_FIT:
        short = [-a.margin_mib for a in answers if a.margin_mib is not None]
        return f"{counts}: none" + (f", {min(short):,} or more short of A" if short else "")
    return f"{counts}: {NOT_SEARCHED}"


def _same_answer(a: Answer) -> tuple:
    """What a run of counts shares: where something runs, the profile; where nothing does, why."""
    return (a.status, a.profile if a.status in (RUNS, MARGIN, HOST_UNKNOWN) else None)


def row_text(answers: list[Answer]) -> str:
    return "; ".join(group_text(list(g)) for _, g in groupby(answers, key=_same_answer))


def _gib(rams: tuple[int, ...]) -> str:
    return " or ".join(f"{r / 1024:g}" for r in rams) + " GiB"


# The answers whose profile a cell names (where nothing runs it names the reason instead).
NAMES_ITS_PROFILE = (RUNS, MARGIN, HOST_UNKNOWN)


@dataclass(frozen=True)
class AnswerRow:
    """One card at one or more host RAM sizes that answer alike: the answers by count, and the
    same asked of the profiles that give nothing up."""

    card: str
    ram_mib: tuple[int, ...]
    stated: bool  # the card's own host's RAM, not a size chosen by omniprobe
    answers: tuple[Answer, ...]
    whole: tuple[Answer, ...]

    @property
    def host_ram(self) -> str:
        return f"{_gib(self.ram_mib)} (its host's)" if self.stated else _gib(self.ram_mib)

    @property
    def what_runs(self) -> str:
        return row_text(list(self.answers))

    @property
    def giving_nothing_up(self) -> str:
        return row_text(list(self.whole))

    @property
    def assumptions(self) -> list[str]:
        return list(dict.fromkeys(x for a in (*self.answers, *self.whole)
                                  for x in a.assumptions))

    @property
    def grade(self) -> str:
        return "assumed" if self.assumptions else "derived"

    @property
    def profiles(self) -> set[str]:
        return {a.profile for a in (*self.answers, *self.whole)
                if a.status in NAMES_ITS_PROFILE}

    def said(self, words: dict[str, str]) -> str:
        """The row's answer in the opening's words."""
        ram = f"its host's {_gib(self.ram_mib)}" if self.stated else _gib(self.ram_mib)
        return f"with {ram} RAM, {plain_answer(list(self.answers), words)}"

    @property
    def host_short_everywhere(self) -> bool:
        """No count from one reference on runs, each for want of host RAM."""
        edits = [a for a in self.answers if a.count > 0]
        return bool(edits) and all(a.status == HOST_SHORT for a in edits)


@dataclass(frozen=True)
class AnswerTable:
    model: str
    counts: list[int]
    speed_basis: str  # what the relative times ran at, in words
    rows: list[AnswerRow]
    profiles: list[tuple[str, str]]  # each profile the table names, with its settings in words
    grades: dict[str, str]
    seed_cards: dict[str, str]  # by card key: a seed card's answer in one line of plain words
    other_cards: list[tuple[str, str]]  # the other cards, those that read alike together
    nothing_runs: list[str]  # host RAM sizes where nothing runs on any other card
    model_line: str  # the opening's one line for a model beside the seed's

    @property
    def grades_in_use(self) -> dict[str, str]:
        used = {r.grade for r in self.rows}
        return {g: text for g, text in self.grades.items() if g in used}

    @property
    def assumptions(self) -> list[str]:
        """Each assumption once, with the cards it holds for ("every card" where all)."""
        cards = list(dict.fromkeys(r.card for r in self.rows))
        held: dict[str, list[str]] = {}
        for r in self.rows:
            for x in r.assumptions:
                held.setdefault(x, [])
                if r.card not in held[x]:
                    held[x].append(r.card)
        return [f"{x} ({'every card' if on == cards else ', '.join(on)})"
                for x, on in held.items()]


def plain_answer(answers: list[Answer], words: dict[str, str]) -> str:
    """A row's answer for the opening, from one reference on: each run of counts in words with
    the profile's id after it, its speed against the fastest GPU fit, and its grade."""
    parts = []
    edits = [a for a in answers if a.count > 0]
    for (status, _), group in groupby(edits, key=_same_answer):
        group = list(group)
        profile = group[0].profile
        counts = count_range([a.count for a in group])
        refs = "reference" if counts == "1" else "references"
        grade = "assumed" if any(a.assumptions for a in group) else "derived"
        if status == RUNS:
            slow = max((a.relative_speed or 1.0) for a in group)
            speed = "" if slow == 1.0 else f"{slow:g}× the fastest GPU fit's time; "
            parts.append(f"{counts} {refs} with {words[profile]} (`{profile}`; {speed}{grade})")
        elif status == HOST_SHORT:
            parts.append("nothing searched runs" if len(group) == len(edits)
                         else f"{counts} {refs}: nothing searched runs, for want of host RAM")
        elif status == MARGIN:
            parts.append(f"{counts} {refs} only at the margin")
        else:
            parts.append(f"{counts} {refs}: nothing searched fits the GPU")
    return "; ".join(parts)


def model_line(rows: list[AnswerRow], words: dict[str, str]) -> str:
    """A model's answer on every card in one line, for the opening: each answer from one
    reference on, with the cards it holds for, each at the least host RAM it holds with (a card
    whose larger host runs more says so in the table, not here); the cards where nothing runs."""
    by_answer: dict[str, dict[str, list[str]]] = {}
    nowhere = []
    for card in dict.fromkeys(r.card for r in rows):
        runs = [r for r in rows if r.card == card and not r.host_short_everywhere]
        if not runs:
            nowhere.append(card)
            continue
        least = runs[0]
        ram = (f"its host's {_gib(least.ram_mib)}" if least.stated
               else f"{_gib(least.ram_mib[:1])} RAM")
        said = plain_answer(list(least.answers), words)
        by_answer.setdefault(said, {}).setdefault(ram, []).append(card)
    parts = [f"{said} on the " + ", and the ".join(f"{names(cards)} with {ram}"
                                                   for ram, cards in by_ram.items())
             for said, by_ram in by_answer.items()]
    if nowhere:
        parts.append(f"nothing searched runs on the {', '.join(nowhere)} with any host RAM asked")
    return "; ".join(parts)


@dataclass(frozen=True)
class AnswerBasis:
    """What every answer of one model's searched profiles is judged from."""

    counts: list[int]
    at: dict[int, list[Candidate]]  # the candidates at each reference count
    speed_basis: str  # what the relative times ran at, in words
    words: dict[str, str]  # each searched profile's settings in words

    def answers(self, figures: CardFigures, ram_mib: int) -> tuple[tuple[Answer, ...],
                                                                   tuple[Answer, ...]]:
        """The answers by count for one card and host RAM, and the same asked of the profiles
        that give nothing up (full-size references, the cache on the GPU, nothing quantised or
        tiled): what a user keeps everything with."""
        return (tuple(answer(figures, ram_mib, n, self.at[n]) for n in self.counts),
                tuple(answer(figures, ram_mib, n, [c for c in self.at[n] if not c.gives_up])
                      for n in self.counts))


def answer_basis(hosts: HostsConfig, searches: dict[str, Searched], runs: list[ProfileRun],
                 default_resolution: int) -> AnswerBasis:
    """The candidates at each count of `searches` (host needs from them and the sweep `runs`),
    ranked by the timed requests most of them share, else by their trials."""
    profiles = hosts.diffusers_profiles
    counts = sorted({b.reference_count for s in searches.values() for b in s.search.bands})
    timed = timed_basis(searches)
    at = {n: candidates_at(n, searches, profiles, host_needs(runs, profiles, searches, up_to=n),
                           default_resolution, timed)
          for n in counts}
    if timed is None:
        steps = next(iter(searches.values())).search.num_inference_steps
        speed_basis = f"each profile's fastest {steps}-step trial per count"
    else:
        host, steps, refs = timed
        untimed = untimed_at(timed, searches)
        speed_basis = (f"one request per profile at {steps} steps, {refs} "
                       f"reference{'' if refs == 1 else 's'} on the {hosts.host(host).gpu}"
                       + (f" ({', '.join(f'`{p}`' for p in untimed)} untimed: ranked last)"
                          if untimed else ""))
    return AnswerBasis(counts, at, speed_basis,
                       {p: settings_words(profiles[p], default_resolution) for p in searches})


def answer_table(model: str, hosts: HostsConfig, searches: dict[str, Searched],
                 runs: list[ProfileRun], host_ram_of: dict[str, int | None],
                 default_resolution: int, seed_cards: set[str]) -> AnswerTable | None:
    """The table for one model's searched profiles, and the opening's lines: each of the seed's
    cards in full; the other cards grouped where their answers read alike, with the host RAM
    sizes where nothing runs on any of them said once. None where nothing was searched."""
    if not searches:
        return None
    basis = answer_basis(hosts, searches, runs, default_resolution)
    counts, words = basis.counts, basis.words
    rows: list[AnswerRow] = []
    by_card: dict[str, list[AnswerRow]] = {}
    for key, card in hosts.cards.items():
        figures = card_figures(card)
        stated = host_ram_of.get(key)
        rams = [stated] if stated else [g * 1024 for g in hosts.probe.answer_host_ram_gib]
        asked = {ram: basis.answers(figures, ram) for ram in rams}
        # Host RAM sizes with the same answers share a row.
        for _, group in groupby(rams, key=lambda r: tuple(row_text(list(a)) for a in asked[r])):
            group = tuple(group)
            row = AnswerRow(card.name, group, bool(stated), *asked[group[-1]])
            rows.append(row)
            by_card.setdefault(key, []).append(row)
    seed = {key: "; ".join(r.said(words) for r in mine)
            for key, mine in by_card.items() if key in seed_cards}
    others: dict[str, list[str]] = {}
    short: dict[tuple[int, ...], None] = {}  # RAM sizes where nothing runs on a card, in order
    for key, mine in by_card.items():
        if key in seed_cards:
            continue
        said = [r.said(words) for r in mine if not r.host_short_everywhere]
        short.update(dict.fromkeys(r.ram_mib for r in mine if r.host_short_everywhere))
        if said:
            others.setdefault("; ".join(said), []).append(hosts.cards[key].name)
    named = set().union(*(r.profiles for r in rows))
    return AnswerTable(
        model, counts, basis.speed_basis, rows,
        [(p, words[p]) for p in searches if p in named], GRADES, seed,
        [(", ".join(cards), line) for line, cards in others.items()],
        [f"with {_gib(ram)} RAM nothing searched runs on them" for ram in short],
        model_line(rows, words))
