"""The report's section on Qwen-Image-2.1 in Diffusers: the view models its template loops over,
every figure from evidence and the committed configs, every comparison made here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniprobe.analysis.capacity_bands import newest_searches, searched_configs
from omniprobe.analysis.diffusers_capacity import (
    CapacityCell,
    CardCapacity,
    ProfileRun,
    card_capacity,
    gpu_runs,
    host_runs,
    kv_measures,
    kv_per_reference,
    min_caps,
    model_sweep_runs,
)
from omniprobe.analysis.estimates import stated_range
from omniprobe.analysis.kv_compare import CrossRatio, KvBySize, cross_ratio, kv_by_size
from omniprobe.config.diffusers import load_model_configs
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.config.pinned_cache import DTYPE_BYTES, architecture_bytes_per_token
from omniprobe.evidence.load import Evidence
from omniprobe.evidence.models.statements import StatedFigure
from omniprobe.evidence.quantities import Range
from omniprobe.evidence.validate import Loaded
from omniprobe.report.answers_view import AnswerTable, answer_table
from omniprobe.report.calibration_view import CalibrationView, calibration_views, card_host_ram_mib
from omniprobe.report.capacity_view import CapacitySearchView, capacity_search_view
from omniprobe.report.model_search_view import (
    ModelSearchView,
    UnsearchedModel,
    model_search_views,
    unsearched_model_views,
)

GIB = 2**30


def cell_text(cell: CapacityCell | None) -> str:
    if cell is None:
        return "—"
    peak = f"{cell.peak_mib:,.0f} MiB" if cell.peak_mib is not None else "no GPU peak"
    breach = "; the process tree went over the cap" if cell.breached else ""
    if cell.outcome == "oom":
        return "**OOM**" + (f" (asked {cell.oom_requested}{breach})" if cell.oom_requested
                            else f" ({breach[2:]})" if breach else "")
    if cell.breached:
        return f"ran, {peak}, but the process tree went over the cap: **not a fit**"
    if cell.fits:
        return f"fits, {peak}"
    return cell.outcome


@dataclass(frozen=True)
class ProfileRow:
    profile: str
    description: str
    cells: list[str]  # by reference count, the table's columns
    init: str  # "" when the build succeeded, else how it ended


@dataclass(frozen=True)
class CapTable:
    cap_gib: str | None  # None: not capped (the CPU host)
    rows: list[ProfileRow]
    host_ram_gib: str | None = None  # the host RAM cap its runs ran under; None: not emulated


@dataclass(frozen=True)
class SweepRow:
    profile: str
    caps_gib: str  # the caps it ran at
    needs: list[str]  # by reference count: "≤ 16", "16–24", "> 24"


@dataclass(frozen=True)
class KvRow:
    profile: str
    output_resolution: int
    reference_count: int
    prefix_tokens: int
    prompt_text_tokens: int | None
    bytes: int
    kib_per_token: float


@dataclass(frozen=True)
class KvSizeRow:
    """What every cache of one condition size shows, in words."""

    output_resolution: int
    requests: int
    kib_per_token: str
    tokens_per_reference: str  # "not recorded" where no record counts its prompt's tokens
    gib_per_reference: str


@dataclass(frozen=True)
class Comparison:
    """A Diffusers figure beside one the seed states, with what the numbers support."""

    what: str
    measured: str
    seed: str
    seed_about: str
    reading: str


@dataclass(frozen=True)
class ProfileFit:
    profile: str
    refs: tuple[int, ...]  # the reference counts that fit
    asked: tuple[int, ...]


@dataclass(frozen=True)
class DiffusersHostView:
    key: str
    host: Host
    emulates: str | None  # the emulated card's name
    capacity: CardCapacity

    @property
    def emulation_verdict(self) -> str:
        return emulation_verdict(self.capacity)
    tables: list[CapTable]
    parameters_b: dict[str, float]
    attempts: list[str]
    emulated: bool
    fitting: list[ProfileFit]
    cap_text: str  # e.g. "24 GiB"
    host_ram_text: str
    settings_text: str  # which runs recorded their profile's settings, and what the rest show


@dataclass(frozen=True)
class DiffusersSection:
    hosts: list[DiffusersHostView]
    ref_columns: list[int]
    ref_headers: list[str]
    first_refs: int
    target: int
    model: str  # the model's name, from its folder's manifest (else the pinned snapshot's)
    cards: list[str]  # the emulated cards' names
    caps: list[str]  # their capacities, in the same order
    gpus: list[str]  # the physical GPUs the emulations ran on
    pipeline: str
    dtype: str
    dtype_bytes: int
    arch_kib_per_token: float | None
    kv: list[KvRow]
    kv_sizes: list[KvSizeRow]
    comparisons: list[Comparison]
    unconfirmed: list[str]  # components whose configs nothing public confirms
    steps: list[int]  # the steps the capacity cells ran
    sweep: list[SweepRow]  # over every full-size emulated host's caps together
    calibrations: list[CalibrationView]  # the seed's real Diffusers runs against the emulation
    capacity: CapacitySearchView | None  # the capacity search's bands, cards and figure
    answers: AnswerTable | None  # what runs on each card and host
    outside_pool: str | None  # the measuring GPU's own memory outside torch's pool, in words
    kv_counted: str | None  # Diffusers' own count per reference at the default condition size
    other_models: list[ModelSearchView]  # each model searched beside the seed's
    unsearched_models: list[UnsearchedModel]  # set up on a GPU host, not searched yet


def _gib(mib: int) -> str:
    return f"{mib / 1024:g}"


def emulation_verdict(capacity: CardCapacity) -> str:
    """The emulation's own answer at the card's cap, graded emulated: the H200 capped like the
    card, its own overhead inside the cap, never the card's answer (REPORT.md's table is)."""
    target = f"{capacity.target} references"
    if capacity.verdict == "fits":
        return f"{target} fit under " + ", ".join(f"`{f.profile}`" for f in capacity.fits)
    if capacity.verdict == "fits the GPU only":
        return (f"{target} fit the cap under " + ", ".join(f"`{f.profile}`"
                                                          for f in capacity.gpu_only)
                + f", each holding more than the host's {capacity.host_ram_mib / 1024:g} GiB "
                "of RAM")
    if capacity.verdict == "does not fit":
        return f"{target} fit under no profile run"
    return f"{target} not measured"


def host_ram_text(runs: list[ProfileRun], host_ram_gib: float | None, note: str | None) -> str:
    """What the runs held in host memory beside the emulated card's host: the runs under a
    cgroup cap and the kills at it, and what the runs without one held (the H200's host held what
    offload moved) against the real card's host's RAM where it is stated."""
    capped = [r for r in runs if r.host_ram.cap_mib is not None]
    free = [r.host_ram.peak_mib for r in runs
            if r.host_ram.cap_mib is None and r.host_ram.peak_mib is not None]
    parts = []
    if capped:
        killed = sum(r.host_ram.killed for r in capped)
        whole = sum(r.killed_by_whole_build for r in capped)
        parts.append(f"host RAM capped at {_gib(capped[0].host_ram.cap_mib)} GiB by a cgroup in "
                     f"{len(capped)} profile run(s), {killed} of them killed at the cap"
                     + (f" ({whole} under the random build that held the whole bf16 model at "
                        "once, not the card's answer)" if whole else "")
                     + " (zram not emulated)")
    if free or not capped:
        held = (f"the runner held up to {max(free) / 1024:.1f} GiB of host RAM" if free
                else "the runner's host RAM was not recorded")
        lead = "without a host RAM cap " if capped else "host RAM not emulated: "
        if host_ram_gib is None:
            parts.append(f"{lead}{held}, and the card's host RAM is not stated")
        else:
            over = bool(free) and max(free) / 1024 > host_ram_gib
            said = f" (the seed: \"{note}\"; zram is never counted)" if note else ""
            parts.append(f"{lead}{held}, " + ("**more than**" if over else "within")
                         + f" the real card's host's {host_ram_gib:g} GiB of RAM{said}")
    return "; ".join(parts)


def _figure(evidence: Evidence, key: str) -> StatedFigure | None:
    return next((f for a in evidence.attempts for f in a.figures if f.key == key), None)


def _stated(fig: StatedFigure) -> str:
    if fig.range is not None:
        return f"{fig.range.min:g}–{fig.range.max:g} {fig.unit}"
    return f"{fig.value:g} {fig.unit}"


def ratio_reading(ratio: CrossRatio, basis: str) -> str:
    """A ratio between two methods, with what they are (`basis`) in the same words: never a
    check."""
    if ratio.overlaps:
        return f"overlaps ({basis})"
    r = ratio.ratio
    times = f"{r.min:.1f}×" if f"{r.min:.1f}" == f"{r.max:.1f}" else f"{r.min:.1f}–{r.max:.1f}×"
    return f"{times} ({basis})"


OTHER_ENGINE = "different engine and method"
SAME_ENGINE = "same engine, different method: retention, not the cache counted"


def _gib_text(r: Range) -> str:
    low, high = f"{r.min / GIB:.2f}", f"{r.max / GIB:.2f}"
    return f"{low} GiB" if low == high else f"{low}–{high} GiB"


def per_reference(size: int) -> str:
    """A cache figure's label at a condition size (the seed's are at the default size)."""
    return f"per {size}² reference"


def comparisons(evidence: Evidence, sizes: list[KvBySize], size: int) -> list[Comparison]:
    """Diffusers' own byte count beside each figure the seed states of the cache, both sides
    named: the seed's are vLLM-Omni's estimates from server-peak deltas, or the helper system's
    measurement of what Diffusers retained."""
    out = []
    per_token = _figure(evidence, "kv_per_prefix_token")
    if per_token is not None and stated_range(per_token) is not None and sizes:
        measured = Range.of(v for s in sizes for v in (s.bytes_per_token.min,
                                                       s.bytes_per_token.max))
        kib = Range(min=measured.min / 1024, max=measured.max / 1024)
        out.append(Comparison(
            "per prefix token", f"{kib.min:g} KiB" if kib.min == kib.max
            else f"{kib.min:g}–{kib.max:g} KiB", _stated(per_token),
            "vLLM-Omni's, from server-peak deltas",
            ratio_reading(cross_ratio(kib, stated_range(per_token)), OTHER_ENGINE)))
    default = next((s for s in sizes if s.output_resolution == size and s.bytes_per_reference),
                   None)
    if default is not None:
        gib = Range(min=default.bytes_per_reference.min / GIB,
                    max=default.bytes_per_reference.max / GIB)
        for key, about, basis in (
                ("kv_per_reference", "vLLM-Omni's, from server-peak deltas", OTHER_ENGINE),
                ("diffusers_retention_per_reference", "Diffusers' retention, measured by the "
                 "helper system (#160)", SAME_ENGINE)):
            fig = _figure(evidence, key)
            if fig is not None and stated_range(fig) is not None:
                out.append(Comparison(per_reference(size), _gib_text(default.bytes_per_reference),
                                      _stated(fig), about,
                                      ratio_reading(cross_ratio(gib, stated_range(fig)), basis)))
    return out


def settings_text(attempts) -> str:
    """Which profiles' settings their attempts recorded (format 5 on), and for the others what
    the attempt shows of them: the allocator setting read back after the build."""
    recorded = sorted({r.profile for a in attempts for r in a.offline if r.settings is not None})
    ran = {r.configuration for a in attempts for r in a.offline if r.ran}
    bare = sorted(ran - set(recorded))
    parts = []
    if recorded:
        parts.append("recorded in full with the runs of " + ", ".join(f"`{p}`" for p in recorded))
    if bare:
        read = {r.configuration: r.build.expandable_segments for a in attempts for r in a.offline
                if r.build is not None and r.configuration in bare}
        groups = {"on": [p for p in bare if read.get(p) is True],
                  "off": [p for p in bare if read.get(p) is False],
                  "not read back (no build)": [p for p in bare if read.get(p) is None]}
        shown = "; ".join(f"{what} under {', '.join(f'`{p}`' for p in names)}"
                          for what, names in groups.items() if names)
        parts.append(f"not recorded for {len(bare)} profile(s), run before the evidence "
                     "recorded them; what their attempts show is the allocator read back after "
                     f"the build, expandable segments {shown}")
    return "; ".join(parts)


def build_note(run: ProfileRun) -> str:
    """How a profile's build ended where it did not: a kill at the host's RAM says so."""
    if run.init_outcome == "ready":
        return ""
    if run.host_ram.killed and run.host_ram.cap_mib is not None:
        killed = f"build: the kernel killed the runner at the {_gib(run.host_ram.cap_mib)} GiB host RAM cap"
        if run.killed_by_whole_build:
            return (f"{killed}, under the random build that held the whole bf16 model on the "
                    "host at once, not the load path's: not the card's answer until re-run")
        return killed
    return f"build: {run.init_outcome}"


def diffusers_section(loaded: Loaded, root: Path,
                      seed_cards: frozenset[str] = frozenset()) -> DiffusersSection | None:
    """The section, or None where hosts.toml has no Diffusers host; `root`: the project's, where
    the committed model configs are; `seed_cards`: the cards of the seed's probed hosts, whose
    answers the opening gives in their verdicts."""
    hosts: HostsConfig = loaded.hosts
    # A host whose evidence is only a capacity search shows in the search's part, not as a host.
    keys = [k for k, h in hosts.hosts.items() if h.diffusers is not None and not (
        h.emulation is None and loaded.evidence.for_host(k) and all(
            a.capacity and not a.offline_requests for a in loaded.evidence.for_host(k)))]
    if not keys:
        return None
    target = hosts.probe.target_reference_count
    views, all_runs, attempts, runs_by_host = [], [], [], {}
    for key in keys:
        host = hosts.host(key)
        runs = host_runs(key, loaded.evidence, loaded.fixtures)
        runs_by_host[key] = runs
        if host.emulation is not None:
            all_runs.extend(runs)
        mine = loaded.evidence.for_host(key, include_emulated=True)
        attempts.extend(mine)
        cap = hosts.emulated_cap_mib(key)
        tables = []
        for run_cap, ram_cap in dict.fromkeys((r.cap_mib, r.host_ram.cap_mib) for r in runs):
            rows = [ProfileRow(r.profile, hosts.diffusers_profiles[r.profile].description,
                               [cell_text(r.cell(n)) for n in range(target + 1)],
                               build_note(r))
                    for r in runs if (r.cap_mib, r.host_ram.cap_mib) == (run_cap, ram_cap)]
            tables.append(CapTable(_gib(run_cap) if run_cap else None, rows,
                                   _gib(ram_cap) if ram_cap else None))
        built = next((row.build for a in mine for row in a.offline if row.build), None)
        emulation = host.emulation
        card = hosts.host(emulation.emulates) if emulation and emulation.emulates else None
        capacity = card_capacity(key, runs, cap, target, card_host_ram_mib(card, emulation))
        views.append(DiffusersHostView(
            key, host, card.name if card else None, capacity, tables,
            built.parameters_b if built else {}, [a.id for a in mine], emulation is not None,
            [ProfileFit(r.profile, r.fitting, tuple(c.reference_count for c in r.cells))
             for r in runs], f"{_gib(cap)} GiB" if cap else "",
            host_ram_text(runs, card.host_ram_gib if card else None,
                          card.host_ram_note if card else None),
            settings_text(mine)))
    full = [v for v in views if v.emulated]
    resolutions = {name: hosts.output_resolution(name) for name in hosts.diffusers_profiles}
    measured = kv_measures([a for a in attempts if hosts.host(a.host).emulation is not None],
                           loaded.fixtures, resolutions)
    kv = [KvRow(m.profile, m.output_resolution, m.reference_count, m.prefix_tokens,
                m.prompt_text_tokens, m.bytes,
                round(m.bytes_per_token / 1024, 1)) for m in measured]
    sizes = kv_by_size(measured, kv_per_reference(measured))
    default_size = hosts.diffusers_profile_defaults.output_resolution
    compared = comparisons(loaded.evidence, sizes, default_size)
    arch = None
    configs_folder = next((hosts.host(v.key).diffusers.configs for v in full), None)
    unconfirmed: list[str] = []
    model = hosts.stack.model_name  # the seed's, where no folder names it
    if configs_folder is not None:
        configs = load_model_configs(root, configs_folder)
        model = configs.manifest.model
        arch = architecture_bytes_per_token(configs.components["transformer"].config) / 1024
        unconfirmed = list(configs.unconfirmed)
    steps = sorted({r.num_inference_steps for a in attempts for r in a.offline_requests
                    if r.num_inference_steps is not None})
    columns = list(range(target + 1))
    sweep, all_runs = [], gpu_runs(all_runs)
    for profile in hosts.diffusers_profiles:
        caps = sorted({r.cap_mib for r in all_runs if r.profile == profile and r.cap_mib})
        if caps:
            needs = min_caps(all_runs, profile)
            sweep.append(SweepRow(profile, ", ".join(_gib(c) for c in caps),
                                  [needs[n].text() if n in needs else "—" for n in columns]))
    calibrations = calibration_views(loaded, runs_by_host, target)
    host_ram_of = {key: card_host_ram_mib(card, None) for key, card in
                   ((h.card, h) for h in hosts.hosts.values() if h.card is not None)}
    # The seed's model: the emulations' configs, else those of the first host searched.
    model_configs = configs_folder or next(iter(searched_configs(loaded.evidence)), None)
    searches = newest_searches(loaded.evidence, model_configs) if model_configs else {}
    model_runs = (model_sweep_runs(hosts, loaded.evidence, loaded.fixtures, model_configs)
                  if model_configs else [])
    capacity = capacity_search_view(loaded, model_runs, host_ram_of, searches, model,
                                    model_configs)
    answers = answer_table(model, hosts,
                           searches, model_runs, host_ram_of, default_size, seed_cards)
    return DiffusersSection(
        views, columns, [f"{n} ref{'' if n == 1 else 's'}" for n in columns], columns[0], target,
        model, [v.emulates for v in full if v.emulates],
        [v.cap_text for v in full if v.emulates], sorted({v.host.gpu for v in full}),
        next(iter(hosts.diffusers_profiles.values())).pipeline, "bfloat16",
        DTYPE_BYTES["bfloat16"], arch, kv, [_size_row(z) for z in sizes],
        compared, unconfirmed, steps, sweep, calibrations,
        capacity, answers, outside_pool_text(all_runs, loaded.evidence),
        next((f"{c.measured} {c.what}" for c in compared
              if c.what == per_reference(default_size)), None),
        model_search_views(loaded, root, model_configs, host_ram_of, default_size),
        unsearched_model_views(loaded, root))


def outside_pool_text(runs: list[ProfileRun], evidence: Evidence) -> str | None:
    """What the measuring GPU held outside torch's pool: at a runner's start (a cap less the
    pool it left) and at most during a capacity trial; None where nothing recorded it."""
    start = sorted({r.cap_mib - r.pool_mib for r in runs
                    if r.cap_mib is not None and r.pool_mib is not None})
    during = max((t.outside_pool_mib for a in evidence.attempts if not a.simulated
                  for t in a.capacity_trials if t.outside_pool_mib is not None), default=None)
    if not start and during is None:
        return None
    parts = []
    if start:
        low, high = f"{start[0]:,.0f}", f"{start[-1]:,.0f}"
        parts.append(f"{low if low == high else low + '–' + high} MiB at a runner's start")
    if during is not None:
        parts.append(f"up to {during:,.0f} MiB during a search's requests")
    return " and ".join(parts)


def _size_row(z: KvBySize) -> KvSizeRow:
    kib = Range(min=z.bytes_per_token.min / 1024, max=z.bytes_per_token.max / 1024)
    tokens = ("not recorded" if z.tokens_per_reference is None
              else f"{z.tokens_per_reference.min:,.0f}" if z.tokens_per_reference.min
              == z.tokens_per_reference.max
              else f"{z.tokens_per_reference.min:,.0f}–{z.tokens_per_reference.max:,.0f}")
    return KvSizeRow(z.output_resolution, z.requests,
                     f"{kib.min:g}" if kib.min == kib.max else f"{kib.min:g}–{kib.max:g}", tokens,
                     "not recorded" if z.bytes_per_reference is None
                     else _gib_text(z.bytes_per_reference))
