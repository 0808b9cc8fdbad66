"""The report's view models: every decision the report makes, prepared for the templates.

Templates loop over the items here and test whether one is present; which flag sets block, which
OOMs came early, which code-read facts are seams, what an estimate's judgement is and how the
run-matrix rows are labelled are all decided here, from the evidence.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from omniprobe.analysis.derived import (
    common_init_oom,
    image_structures,
    kv_deltas,
    psnr_groups,
    stated_disagreements,
    target_ooms,
)
from omniprobe.analysis.estimates import estimate_checks
from omniprobe.analysis.summaries import ServeRunView, run_views
from omniprobe.analysis.verdicts import (
    HostVerdict,
    all_verdicts,
    verdict_attempts,
    verdict_history,
)
from omniprobe.config.report_settings import ReportSettings
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.validate import Loaded
from omniprobe.report import verdict_lines as vl
from omniprobe.report.diffusers_view import diffusers_section
from omniprobe.report.emulation_view import emulation_section
from omniprobe.report.filters import count_range, flags_text, names, num
from omniprobe.report.follow_through import follow_through
from omniprobe.report.host_section import HostSection, ServeRunRow, TimelineFigure
from omniprobe.report.paths import DETAILS_FILE, HARNESS_FILE, TIMELINES_DIR
from omniprobe.report.provenance_view import (
    contract,
    is_harness_attempt,
    newest_upstream,
    provenance_rows,
    provenance_text,
)
from omniprobe.report.safe_text import made_safe, safe_evidence
from omniprobe.report.timeline_svg import render_svg


def timeline_figures(view: ServeRunView, capacity_mib: float | None) -> list[TimelineFigure]:
    figures = []
    for index, life in enumerate(view.run.lifetimes):
        if life.timeline is None:
            continue
        markers = [
            (r.started_s, f"{r.fixture} seed {r.seed}: {r.outcome}")
            for r in view.attempt.requests
            if r.flag_set == view.flag_set and r.lifetime == index and r.started_s is not None
        ]
        title = f"{view.attempt.host} {view.attempt.id} {view.flag_set} #{index} ({life.session})"
        svg = render_svg(
            life.timeline.points,
            title=title,
            capacity_mib=capacity_mib,
            markers=markers,
            note=life.timeline.reason,
        )
        path = TIMELINES_DIR / view.attempt.host / view.attempt.id / f"{view.flag_set}-{index}.svg"
        figures.append(TimelineFigure(path.as_posix(), title, svg, life.timeline))
    return figures


def _cap_of(attempt: LoadedAttempt, capacity_mib: int | None) -> int | None:
    """The capacity line of an attempt's timelines: its emulated cap, else the modelled card's."""
    prov = attempt.meta.provenance
    return prov.cap_mib if prov.kind == "emulated" else capacity_mib


def _row_labels(views: list[ServeRunView]) -> list[str]:
    """A row is its flag set; where a flag set ran in several attempts, the attempt says which."""
    counts: dict[str, int] = {}
    for v in views:
        counts[v.flag_set] = counts.get(v.flag_set, 0) + 1
    first: set[str] = set()
    labels = []
    for v in views:
        if counts[v.flag_set] > 1 and v.flag_set in first:
            labels.append(f"{v.flag_set} ({v.attempt.id})")
        else:
            labels.append(v.flag_set)
        first.add(v.flag_set)
    return labels


def host_section(key: str, loaded: Loaded, verdict: HostVerdict) -> HostSection:
    hosts, fixtures = loaded.hosts, loaded.fixtures
    host = hosts.host(key)
    attempts = verdict_attempts(key, hosts, loaded.evidence)
    views = [v for a in attempts for v in run_views(a)]
    kv = kv_deltas(views, fixtures)
    refs_seen = sorted({fixtures.get(c.fixture).reference_count for v in views for c in v.cells})
    rows = []
    for view, label in zip(views, _row_labels(views), strict=True):
        cells: dict[int, Cell | None] = dict.fromkeys(refs_seen)
        for cell in view.cells:
            cells[fixtures.get(cell.fixture).reference_count] = cell
        rows.append(ServeRunRow(view, label, flags_text(hosts, view.flag_set),
                                vl.init_text(view.run.init), cells))
    stated_figures = {f.key: f for a in attempts for f in a.figures}
    capacity = host.capacity.vram_mib if host.capacity else None
    timelines = [t for v in views for t in timeline_figures(v, _cap_of(v.attempt, capacity))]
    baseline_ids = {a.meta.baseline for a in attempts if a.meta.baseline}
    baseline = next(
        (a for a in loaded.evidence.attempts if a.baseline is not None and a.id in baseline_ids), None
    )
    return HostSection(
        key=key,
        host=host,
        hosts=hosts,
        fixtures=fixtures,
        verdict=verdict,
        attempts=attempts,
        views=views,
        ref_columns=refs_seen,
        rows=rows,
        kv=kv,
        psnr=psnr_groups(attempts),
        target_ooms=target_ooms(views, fixtures, hosts.probe.target_reference_count),
        init_oom=common_init_oom([v.run for v in views]),
        stated_figures=stated_figures,
        baseline_name=(
            f"{baseline.baseline.engine}{'' if baseline.baseline.kv_cache else ' nocache'}"
            if baseline
            else "baseline"
        ),
        timelines=timelines,
        images=image_structures(attempts),
        disagreements=stated_disagreements(c for v in views for c in v.cells),
        estimates=estimate_checks(
            stated_figures, kv, views, hosts, host.serve_flag_sets, [o for a in attempts for o in a.structure]
        ),
        history=verdict_history(key, hosts, fixtures, loaded.evidence),
        baseline_attempt=baseline,
        steps=fixtures.sampling.num_inference_steps,
    )


def build_context(loaded: Loaded, settings: ReportSettings, root: Path) -> dict:
    """Everything the templates read; `settings`: templates/report.toml's; `root`: the project's,
    where the committed model configs are (the Diffusers section reads them). Every string of
    the evidence, hosts.toml and the fixtures reaches the templates made safe for Markdown
    (safe_text.py): a description, a host's or card's name, a GPU string are text, never markup."""
    loaded = replace(loaded, evidence=safe_evidence(loaded.evidence),
                     hosts=made_safe(loaded.hosts), fixtures=made_safe(loaded.fixtures))
    hosts = loaded.hosts
    verdicts = all_verdicts(hosts, loaded.fixtures, loaded.evidence)
    sections = [host_section(k, loaded, verdicts[k]) for k in hosts.hosts]
    by_key = {s.key: s for s in sections}
    # Diffusers hosts (a [diffusers] table) are the real-model section's, not the seed's study's.
    study = [s for s in sections if s.host.diffusers is None]
    emulated = [s for s in study if s.host.emulation is not None]
    real = [s for s in study if not s.host.simulated and s.host.emulation is None]
    diffusers = {s.key for s in sections if s.host.diffusers is not None}
    # The seed's cards: their answers in Diffusers go in their own verdicts.
    real_cards = frozenset(s.host.card for s in real if s.has_evidence and s.host.card)
    baselines = [a for a in loaded.evidence.attempts if a.baseline is not None]
    attempts = loaded.evidence.attempts
    study_attempts = [a for a in attempts
                      if not is_harness_attempt(a, hosts) and a.host not in diffusers]
    fixtures = loaded.fixtures
    diffusers_attempts = [a for a in attempts
                          if a.host in diffusers and not is_harness_attempt(a, hosts)
                          and (hosts.host(a.host).emulation is not None or a.capacity)]
    return {
        "report": settings,
        # The cards come from the hosts: the title's words from templates/report.toml.
        "title": f"{settings.title} on "
                 + names([f"{s.host.name} ({num(s.host.vram_gb)} GB)" for s in real]),
        "stack": hosts.stack,
        "serve": hosts.serve,
        "fixtures": loaded.fixtures,
        "target": hosts.probe.target_reference_count,
        # An edit takes one reference image at least.
        "edit_counts": count_range(list(range(1, hosts.probe.target_reference_count + 1))),
        "sections": sections,
        "real": [s for s in real if s.has_evidence],
        "real_cards": real_cards,
        "unprobed": [s for s in study if not s.has_evidence and not s.host.simulated],
        # An emulated simulated host is simulated: it goes to HARNESS.md with the others.
        "simulated": [s for s in sections if s.host.simulated and s.has_evidence],
        "emulated": [s for s in emulated if not s.host.simulated and s.has_evidence],
        "emulations": {s.key: emulation_section(s, by_key, loaded) for s in emulated if s.attempts},
        "baseline": baselines[0] if baselines else None,
        "attempts": study_attempts,
        "harness_attempts": [a for a in attempts if is_harness_attempt(a, hosts)],
        "study_provenance": provenance_rows(study_attempts, hosts),
        "diffusers_provenance": provenance_rows(diffusers_attempts, hosts),
        "diffusers_provenance_brief": provenance_rows(diffusers_attempts, hosts, per_host=False),
        "diffusers": diffusers_section(loaded, root, real_cards),
        "follow": follow_through([s for s in real if s.has_evidence], hosts, settings),
        "upstream": newest_upstream(attempts),
        "contract": contract(newest_upstream(attempts)),
        "harness_file": HARNESS_FILE.as_posix(),
        "details_file": DETAILS_FILE.as_posix(),
        "provenance": {a.id: provenance_text(a.meta.provenance) for a in attempts},
        "seed_cite": next(
            (a.meta.provenance.source.cite() for a in attempts if a.meta.provenance.kind == "transcribed"),
            "not recorded",
        ),
        "seed_fixtures": [f for f in fixtures.fixtures if not f.simulated and not f.stands_in_for],
        "standins": [f for f in fixtures.fixtures if f.stands_in_for],
        "unknown_fixtures": [f for f in fixtures.fixtures if not f.simulated and f.missing_fields()],
        "unknown_deploy": [(n, d) for n, d in hosts.deploy_configs.items() if not d.content_known],
        "unknown_kwargs": [n for n, k in hosts.offline_kwarg_sets.items() if k.kwargs is None],
        "no_snapshot_manifest": hosts.env.checks.snapshot_manifest is None,
    }
