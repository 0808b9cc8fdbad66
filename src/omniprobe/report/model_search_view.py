"""The report's part for each model searched beside the seed's (issue 50): its bands and figure,
what its searches cost, its answer per card and host, and what others publish of its memory
beside what omniprobe found, each labelled with whose it is and how it was obtained. Every figure
from evidence and hosts.toml; every decision analysis/'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniprobe.analysis.capacity_bands import (
    Searched,
    newest_searches,
    searched_configs,
    unsearched_models,
)
from omniprobe.analysis.diffusers_capacity import model_sweep_runs
from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.published import OBTAINED
from omniprobe.evidence.validate import Loaded
from omniprobe.report.answers_view import AnswerTable, answer_table
from omniprobe.report.capacity_view import CapacitySearchView, capacity_search_view
from omniprobe.report.paths import CAPACITY_DIR


@dataclass(frozen=True)
class PublishedRow:
    whose: str
    figure: str  # as written: "~13 GB"
    obtained: str
    conditions: str
    quote: str
    source: str  # with whether omniprobe read it there or in a copy


@dataclass(frozen=True)
class ModelSearchView:
    model: str
    configs: str  # its committed model folder
    capacity: CapacitySearchView
    answers: AnswerTable | None
    published: list[PublishedRow]
    least: list[str]  # the least A the search found at its first and last count, in words


@dataclass(frozen=True)
class UnsearchedModel:
    model: str
    configs: str  # its committed model folder
    hosts: list[str]  # the GPU hosts built from it


def unsearched_model_views(loaded: Loaded, root: Path) -> list[UnsearchedModel]:
    """Each model set up on a GPU host and not searched yet, so the report says it is ready
    rather than leaving it out."""
    return [UnsearchedModel(load_model_configs(root, folder).manifest.model, folder, hosts)
            for folder, hosts in unsearched_models(loaded.evidence, loaded.hosts).items()]


def figure_path(folder: str) -> Path:
    """models/flux2-klein/4b -> report/capacity/flux2-klein-4b-min-pool.svg"""
    return CAPACITY_DIR / f"{'-'.join(folder.split('/')[1:])}-min-pool.svg"


def published_rows(hosts: HostsConfig, model: str) -> list[PublishedRow]:
    return [PublishedRow(f.publisher, f.text(), OBTAINED[f.obtained], f.conditions, f.quote,
                         f.source + ("" if f.read == "primary" else " (read in a copy)"))
            for f in hosts.published_figures.values() if f.model == model]


def least_pools(searches: dict[str, Searched]) -> list[str]:
    """At the first and the last count searched, the least A of any profile, with its profile."""
    counts = sorted({b.reference_count for s in searches.values() for b in s.search.bands})
    out = []
    for n in dict.fromkeys((counts[0], counts[-1]) if counts else ()):
        found = [(b.fits_at_mib, name) for name, s in searches.items()
                 if (b := s.band(n)) is not None and b.fits_at_mib is not None]
        if found:
            a, name = min(found)
            out.append(f"{a:,} MiB at {n} reference{'' if n == 1 else 's'} (`{name}`)")
    return out


def model_search_views(loaded: Loaded, root: Path, seed_folder: str | None,
                       host_ram_of: dict[str, int | None],
                       default_resolution: int) -> list[ModelSearchView]:
    """One view per model searched other than the seed's (`seed_folder`), in the order first
    searched; its cards' answers are judged as the seed model's are."""
    out = []
    for folder in searched_configs(loaded.evidence):
        if folder == seed_folder:
            continue
        searches = newest_searches(loaded.evidence, folder)
        if not searches:
            continue
        model = load_model_configs(root, folder).manifest.model
        runs = model_sweep_runs(loaded.hosts, loaded.evidence, loaded.fixtures, folder)
        capacity = capacity_search_view(loaded, runs, host_ram_of, searches, model, folder,
                                        figure_path(folder))
        out.append(ModelSearchView(
            model, folder, capacity,
            answer_table(model, loaded.hosts, searches, runs, host_ram_of, default_resolution,
                         frozenset()),
            published_rows(loaded.hosts, model), least_pools(searches)))
    return out
