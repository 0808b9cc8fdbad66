"""Render REPORT.md from templates/ and the evidence; check that the committed one is fresh."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from omniprobe.analysis.capacity_curve import CapacityCurve, capacity_curve
from omniprobe.analysis.derived import (
    ImageStructure,
    KvDelta,
    PsnrGroup,
    StatedDisagreement,
    common_init_oom,
    image_structures,
    kv_deltas,
    psnr_groups,
    stated_disagreements,
    target_ooms,
)
from omniprobe.analysis.emulation_compare import (
    CellPair,
    InitPair,
    TransferCaveat,
    compare_cells,
    compare_inits,
    transfer_caveat,
)
from omniprobe.analysis.estimates import EstimateCheck, estimate_checks
from omniprobe.analysis.summaries import RunView, manifest_summary, run_views
from omniprobe.analysis.verdicts import (
    CapacityUnlock,
    HistoryEntry,
    HostVerdict,
    UnreachedKnob,
    all_verdicts,
    verdict_attempts,
    verdict_history,
)
from omniprobe.atomic import write_text_atomic
from omniprobe.config.hosts import Host, HostsConfig
from omniprobe.config.project import Project
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.models import Cell, EmulationCheck, LoadedAttempt, StatedFigure
from omniprobe.evidence.quantities import Range, size_mib
from omniprobe.evidence.validate import Loaded, load_valid_project
from omniprobe.report.capacity_svg import render_curve_svg
from omniprobe.report.diffusers_view import diffusers_section
from omniprobe.report.timeline_svg import render_svg

TEMPLATE = "report.md.j2"
TIMELINES_DIR = Path("report") / "timelines"
CAPACITY_DIR = Path("report") / "capacity"


# --- formatting: every figure passes through one of these, so templates hold no numbers ----

def num(value: float | int | None) -> str:
    """A figure as the source wrote it: thousands separators, no invented precision."""
    if value is None:
        return "unknown"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,}"


def fixed(value: float | None, digits: int) -> str:
    return "unknown" if value is None else f"{value:,.{digits}f}"


def span(r: Range | None, digits: int | None = None) -> str:
    """'34.62–35.05', or a single figure when min == max."""
    if r is None:
        return "unknown"
    fmt = num if digits is None else (lambda v: fixed(v, digits))
    return fmt(r.min) if r.single or fmt(r.min) == fmt(r.max) else f"{fmt(r.min)}–{fmt(r.max)}"


def seeds_text(seeds: list[int] | None) -> str:
    if not seeds:
        return "seeds not stated"
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def cell_text(cell: Cell | None) -> str:
    """A run-matrix cell: 'OK 34.2 s', '**OOM**', 'OK 44.06–44.35 s — **output broken**';
    one measured on stand-in inputs says so."""
    if cell is None:
        return "—"
    if cell.emulation_breach is not None:
        breach = cell.emulation_breach
        return (f"**EMULATION BREACHED** ({num(breach.held_mib)} MiB held, "
                f"cap {num(breach.cap_mib)} MiB)")
    if cell.outcome != "ok":
        return f"**{cell.outcome.upper()}**" + standin_mark(cell)
    text = "OK" + (f" {span(cell.wall_s)} s" if cell.wall_s else "")
    if cell.quality == "broken":
        text += " — **output broken**"
    elif cell.quality == "unchecked":
        text += " (output not checked)"
    return text + standin_mark(cell)


def standin_mark(cell: Cell) -> str:
    return " (stand-in)" if cell.inputs == "stand-in" else ""


def mib_as_gib(size: str) -> str:
    return fixed(size_mib(size) / 1024, 2)


def sentence(text: str) -> str:
    """The first letter upper case, the rest as written (Jinja's capitalize lowers the rest)."""
    return text[:1].upper() + text[1:]


def _flat_items(kwargs: dict, prefix: str = ""):
    for key, value in kwargs.items():
        if isinstance(value, dict):
            yield from _flat_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _kwarg_value(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_kwarg_value(v) for v in value) + "]"
    return str(value)


def kwargs_text(kwargs: dict) -> str:
    """Engine kwargs as `key=value` items, nested keys dotted: never a Python repr."""
    return " ".join(f"`{key}={_kwarg_value(value)}`" for key, value in _flat_items(kwargs))


# --- the context ------------------------------------------------------------------------

@dataclass(frozen=True)
class TimelineFigure:
    """One server lifetime's GPU memory series, drawn as an SVG beside the report."""

    path: str
    title: str
    svg: str
    summary: object


def timeline_figures(view: RunView, capacity_mib: float | None) -> list[TimelineFigure]:
    figures = []
    for index, life in enumerate(view.run.lifetimes):
        if life.timeline is None:
            continue
        markers = [(r.started_s, f"{r.fixture} seed {r.seed}: {r.outcome}")
                   for r in view.attempt.requests
                   if r.flag_set == view.flag_set and r.lifetime == index and r.started_s is not None]
        title = f"{view.attempt.host} {view.attempt.id} {view.flag_set} #{index} ({life.session})"
        svg = render_svg(life.timeline.points, title=title, capacity_mib=capacity_mib,
                         markers=markers, note=life.timeline.reason)
        path = TIMELINES_DIR / view.attempt.host / view.attempt.id / f"{view.flag_set}-{index}.svg"
        figures.append(TimelineFigure(path.as_posix(), title, svg, life.timeline))
    return figures


@dataclass
class RunRow:
    view: RunView
    flags: str
    cells: dict[int, Cell | None]


@dataclass(frozen=True)
class ConfigGroup:
    """A flag set as the report names it: with the flag sets that ran as it (their knob never
    reached the model), or, when its base is not among the names, the base it ran as."""

    name: str
    aliases: tuple[UnreachedKnob, ...] = ()
    ran_as: UnreachedKnob | None = None


@dataclass
class HostSection:
    key: str
    host: Host
    verdict: HostVerdict
    attempts: list[LoadedAttempt]
    views: list[RunView]
    ref_columns: list[int]
    rows: list[RunRow]
    kv: list[KvDelta]
    psnr: list[PsnrGroup]
    target_ooms: list[tuple[str, Cell]]
    init_oom: object
    stated_figures: dict[str, StatedFigure] = field(default_factory=dict)
    timelines: list[TimelineFigure] = field(default_factory=list)
    images: list[ImageStructure] = field(default_factory=list)
    disagreements: list[StatedDisagreement] = field(default_factory=list)
    estimates: dict[str, EstimateCheck] = field(default_factory=dict)
    history: list[HistoryEntry] = field(default_factory=list)

    def collect(self, section: str) -> list:
        return [item for a in self.attempts for item in getattr(a, section)]

    @property
    def baseline(self):
        ids = {a.meta.baseline for a in self.attempts if a.meta.baseline}
        return sorted(ids)[0] if ids else None

    @property
    def environment(self) -> dict | None:
        """The latest environment manifest filed for this host, summarised."""
        filed = [a for a in self.attempts if a.environment is not None]
        if not filed:
            return None
        latest = max(filed, key=lambda a: (a.meta.date, a.id))
        return {"attempt": latest.id, **manifest_summary(latest.environment)}

    @property
    def kv_range(self) -> Range | None:
        return Range.of(d.delta_mb for d in self.kv) if self.kv else None

    def config_groups(self, names) -> list[ConfigGroup]:
        """Names as configurations: a flag set whose knob never reached the model is its base."""
        unreached = {u.flag_set: u for u in self.verdict.unreached}
        names = list(names)
        groups = []
        for name in names:
            alias = unreached.get(name)
            if alias is not None and alias.base in names:
                continue
            groups.append(ConfigGroup(
                name, tuple(u for u in self.verdict.unreached if u.base == name and u.flag_set in names),
                alias))
        return groups

    def failed_inits(self, names) -> list[tuple[str, object]]:
        """(flag set, its init result) for every run of the named flag sets that failed init."""
        return [(v.flag_set, v.run.init) for v in self.views
                if v.flag_set in names and v.run.init.outcome != "ready"]

    def findings(self, placement: str) -> list:
        return [f for f in self.collect("findings") if f.placement == placement]

    def speedup_of(self, unlock: CapacityUnlock):
        """The speed-up of exactly the unlock's cell (attempt, flag set, fixture), if any."""
        found = [x for x in self.verdict.speedups if (x.attempt, x.flag_set, x.fixture)
                 == (unlock.attempt, unlock.flag_set, unlock.fixture)]
        return found[0] if found else None

    def speedup_for(self, flag_set: str, refs: int, quality: str):
        found = [x for x in self.verdict.speedups
                 if x.flag_set == flag_set and x.reference_count == refs and x.quality == quality]
        return found[0] if found else None

    @property
    def ceiling_speedup(self):
        v = self.verdict
        return self.speedup_for(v.served_by[0], v.highest_served_refs, "sound") if v.served_by else None

    @property
    def detailed_views(self) -> list[RunView]:
        """Runs whose cells carry per-seed detail worth listing under the table."""
        return [v for v in self.views if any(c.seeds for c in v.cells) or v.run.note]


def flags_text(hosts: HostsConfig, flag_set: str) -> str:
    fs = hosts.flag_sets[flag_set]
    parts = list(fs.args)
    if fs.deploy_config:
        parts += ["--deploy-config", Path(hosts.deploy_configs[fs.deploy_config].path).name]
    parts += [f"{k}={v}" for k, v in fs.env.items()]
    return " ".join(f"`{p}`" for p in parts) if parts else "(none)"


def serve_text(hosts: HostsConfig, host_key: str) -> str:
    """The serve invocation as a person would type it, with the model as a placeholder."""
    serve, host = hosts.serve, hosts.host(host_key)
    command = " ".join(host.serve_command or serve.command)
    for name, shown in (("{model}", "<snapshot>"), ("{python}", "python"),
                        ("{hosts_file}", "hosts.toml"), ("{host}", host_key)):
        command = command.replace(name, shown)
    return (f"{command} --port {serve.port}" + (" --enforce-eager" if serve.enforce_eager else "")
            + f" --served-model-name {serve.served_model_name}")


def _cap_of(attempt: LoadedAttempt, capacity_mib: int | None) -> int | None:
    """The capacity line of an attempt's timelines: its emulated cap, else the modelled card's."""
    prov = attempt.meta.provenance
    return prov.cap_mib if prov.kind == "emulated" else capacity_mib


def host_section(key: str, loaded: Loaded, verdict: HostVerdict) -> HostSection:
    hosts, fixtures = loaded.hosts, loaded.fixtures
    host = hosts.host(key)
    attempts = verdict_attempts(key, hosts, loaded.evidence)
    views = [v for a in attempts for v in run_views(a)]
    kv = kv_deltas(views, fixtures)
    refs = sorted({fixtures.get(c.fixture).reference_count for v in views for c in v.cells})
    rows = []
    for view in views:
        cells: dict[int, Cell | None] = dict.fromkeys(refs)
        for cell in view.cells:
            cells[fixtures.get(cell.fixture).reference_count] = cell
        rows.append(RunRow(view, flags_text(hosts, view.flag_set), cells))
    stated_figures = {f.key: f for a in attempts for f in a.figures}
    capacity = host.capacity.vram_mib if host.capacity else None
    timelines = [t for v in views for t in timeline_figures(v, _cap_of(v.attempt, capacity))]
    return HostSection(
        key=key, host=host, verdict=verdict, attempts=attempts, views=views, ref_columns=refs,
        rows=rows, kv=kv, psnr=psnr_groups(attempts),
        target_ooms=target_ooms(views, fixtures, hosts.probe.target_reference_count),
        init_oom=common_init_oom([v.run for v in views]), stated_figures=stated_figures,
        timelines=timelines,
        images=image_structures(attempts),
        disagreements=stated_disagreements(c for v in views for c in v.cells),
        estimates=estimate_checks(stated_figures, kv, views, hosts, host.serve_flag_sets,
                                  [o for a in attempts for o in a.structure]),
        history=verdict_history(key, hosts, fixtures, loaded.evidence),
    )


@dataclass
class CurveFigure:
    path: str
    svg: str
    caps_gib: list[str]
    rows: list[tuple[str, list[str]]]  # flag set, minimum GiB per reference count


def curve_figure(curve: CapacityCurve, host: Host) -> CurveFigure:
    def gib(mib: int) -> str:
        return f"{mib / 1024:g}"

    rows = [(flag_set, [gib(cap) if (cap := curve.min_cap(flag_set, count)) is not None
                        else f"none ≤ {gib(max(curve.caps_mib))}"
                        for count in curve.reference_counts])
            for flag_set in curve.flag_sets]
    svg = render_curve_svg(curve, title=f"{host.name}: minimum VRAM (GiB) per reference count")
    return CurveFigure((CAPACITY_DIR / f"{curve.host}.svg").as_posix(), svg,
                       [gib(c) for c in curve.caps_mib], rows)


@dataclass(frozen=True)
class GuardRow:
    """One emulated server lifetime as its guard saw it."""

    attempt: str
    flag_set: str
    check: EmulationCheck


@dataclass
class EmulationSection:
    """An emulated host beside the host it emulates."""

    section: HostSection
    target: HostSection | None
    cap_mib: int
    caveat: TransferCaveat
    inits: list[InitPair]
    pairs: list[CellPair]
    curve: CapacityCurve | None
    figure: CurveFigure | None
    guards: list[GuardRow]


def emulation_section(section: HostSection, by_key: dict[str, HostSection],
                      loaded: Loaded) -> EmulationSection:
    hosts, key = loaded.hosts, section.key
    curve = capacity_curve(key, hosts, loaded.fixtures, loaded.evidence)
    target = section.host.emulation.emulates
    return EmulationSection(
        section=section, target=by_key.get(target) if target else None,
        cap_mib=hosts.emulated_cap_mib(key), caveat=transfer_caveat(hosts, key),
        inits=compare_inits(hosts, key, loaded.evidence),
        pairs=compare_cells(hosts, key, loaded.fixtures, loaded.evidence), curve=curve,
        figure=curve_figure(curve, section.host) if curve else None,
        guards=[GuardRow(v.attempt.id, v.flag_set, life.timeline.emulation)
                for a in loaded.evidence.for_host(key, include_simulated=section.host.simulated,
                                                  include_emulated=True)
                for v in run_views(a) for life in v.run.lifetimes
                if life.timeline and life.timeline.emulation])


def newest_upstream(attempts: list[LoadedAttempt]) -> LoadedAttempt | None:
    """The most recently run `upstream check` attempt, if any."""
    checked = [a for a in attempts if a.upstream is not None and a.meta.provenance.kind == "measured"]
    return max(checked, key=lambda a: a.meta.provenance.started_at, default=None)


def build_context(loaded: Loaded, root: Path) -> dict:
    verdicts = all_verdicts(loaded.hosts, loaded.fixtures, loaded.evidence)
    # Diffusers hosts have a section of their own (report/diffusers_view.py).
    sections = [host_section(k, loaded, verdicts[k]) for k, h in loaded.hosts.hosts.items()
                if h.diffusers is None]
    by_key = {s.key: s for s in sections}
    emulated = [s for s in sections if s.host.emulation is not None]
    baselines = [a for a in loaded.evidence.attempts if a.baseline is not None]
    return {
        "cfg": loaded.hosts,
        "stack": loaded.hosts.stack,
        "serve": loaded.hosts.serve,
        "fixtures": loaded.fixtures,
        "target": loaded.hosts.probe.target_reference_count,
        "sections": sections,
        "real": [s for s in sections if not s.host.simulated and s.host.emulation is None],
        # An emulated simulated host is simulated: it goes to the appendix with the others.
        "simulated": [s for s in sections if s.host.simulated],
        "emulated": [s for s in emulated if not s.host.simulated],
        "emulations": {s.key: emulation_section(s, by_key, loaded) for s in emulated if s.attempts},
        "by_key": by_key,
        "baselines": baselines,
        "attempts": loaded.evidence.attempts,
        "upstream": newest_upstream(loaded.evidence.attempts),
        "diffusers": diffusers_section(loaded, root),
    }


class CompiledTemplates(jinja2.BytecodeCache):
    """Compiled templates kept for the life of the process, found by template name: jinja checks
    each against its source's checksum and compiles anew when the source differs, so a project
    whose templates were edited (or another copy of them) never renders stale code. Compiling
    costs more than rendering; a process that renders twice (`report` then `report --check`,
    the tests) compiles once."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        return name

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_COMPILED = CompiledTemplates()


def environment(project: Project) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(project.templates_dir),
        bytecode_cache=_COMPILED,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(num=num, fixed=fixed, span=span, seeds=seeds_text, cell=cell_text,
                       gib=mib_as_gib, kwargs=kwargs_text, sentence=sentence)
    env.globals["flags"] = lambda flag_set: flags_text(env.globals["cfg"], flag_set)
    env.globals["serve_text"] = lambda host_key: serve_text(env.globals["cfg"], host_key)
    return env


def render_outputs(project: Project) -> dict[Path, str]:
    """Every file the report consists of, relative to the project root: REPORT.md and its figures."""
    loaded = load_valid_project(project)
    env = environment(project)
    env.globals["cfg"] = loaded.hosts
    context = build_context(loaded, project.root)
    try:
        text = env.get_template(TEMPLATE).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise InputError([Problem(str(project.templates_dir / exc.name), "",
                                  "template not found (templates/ holds the report's layout)")]
                         ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise InputError([Problem(str(project.templates_dir / (exc.name or TEMPLATE)),
                                  f"line {exc.lineno}", f"not a valid template: {exc.message}")]
                         ) from None
    outputs = {Path("REPORT.md"): text}
    for section in context["sections"]:
        outputs.update({Path(t.path): t.svg for t in section.timelines})
    outputs.update({Path(e.figure.path): e.figure.svg for e in context["emulations"].values()
                    if e.figure})
    return outputs


def render_report(project: Project) -> str:
    return render_outputs(project)[Path("REPORT.md")]


def _committed_figures(project: Project) -> set[Path]:
    folders = [project.root / TIMELINES_DIR, project.root / CAPACITY_DIR]
    return {p.relative_to(project.root) for folder in folders if folder.is_dir()
            for p in folder.rglob("*.svg")}


def write_report(project: Project) -> Path:
    """Write REPORT.md and its figures; figures no longer rendered are removed."""
    outputs = render_outputs(project)
    for rel, text in outputs.items():
        write_text_atomic(project.root / rel, text)
    for stale in _committed_figures(project) - set(outputs):
        (project.root / stale).unlink()
    return project.report_file


def check_report(project: Project) -> str:
    """A unified diff between the committed report files and a fresh render; empty when fresh."""
    outputs = render_outputs(project)
    diffs = []
    for rel in sorted(set(outputs) | _committed_figures(project)):
        path = project.root / rel
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        fresh = outputs.get(rel, "")
        if fresh != committed:
            diffs.append("".join(difflib.unified_diff(
                committed.splitlines(True), fresh.splitlines(True),
                f"{rel} (committed)", f"{rel} (fresh render)")) or f"{rel} differs\n")
    return "".join(diffs)
