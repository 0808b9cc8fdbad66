"""Check hosts.toml, fixtures/ and every evidence file, and how they refer to each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniprobe.config.fixtures import (
    MAX_REFERENCE_PIXELS,
    FixtureSuite,
    load_fixtures,
    reference_problems,
)
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.errors import InputError, Problem
from omniprobe.evidence import unpack_journal
from omniprobe.evidence.calibration_checks import calibration_problems
from omniprobe.evidence.capacity_checks import capacity_findings
from omniprobe.evidence.config_digests import config_problems, model_folder_problems
from omniprobe.evidence.consistency import consistency_problems
from omniprobe.evidence.files import ATTEMPT_FILE, SECTION_FILES
from omniprobe.evidence.load import Evidence, LoadedAttempt, load_evidence
from omniprobe.evidence.migrations import content_path
from omniprobe.evidence.repeats import repeat_problems
from omniprobe.evidence.upstream import UPSTREAM_HOST


@dataclass
class Loaded:
    hosts: HostsConfig
    fixtures: FixtureSuite
    evidence: Evidence


def _field(record) -> str:
    """Which field names an offline record's configuration."""
    return "profile" if record.profile is not None else "kwarg_set"


def _refs(attempt: LoadedAttempt, hosts: HostsConfig, fixtures: FixtureSuite,
          attempt_ids: set[str]) -> list[Problem]:
    """Names an evidence record uses must exist: host, flag sets, kwarg sets, fixtures, baselines."""
    problems: list[Problem] = []
    folder = attempt.path
    if attempt.host == UPSTREAM_HOST and UPSTREAM_HOST not in hosts.hosts:
        return _upstream_refs(attempt)
    host = hosts.hosts.get(attempt.host)
    if host is None:
        return [Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.host"),
                        f"host {attempt.host!r} is not defined in hosts.toml "
                        f"(hosts: {', '.join(hosts.hosts)})")]
    prov = attempt.meta.provenance
    if prov.kind == "measured" and prov.host != attempt.host:
        problems.append(Problem(str(folder / ATTEMPT_FILE),
                                content_path(ATTEMPT_FILE, "$.provenance.host"),
                                f"measured on {prov.host!r} but filed under {attempt.host!r}"))
    if (prov.kind == "emulated") != (host.emulation is not None):
        problems.append(Problem(str(folder / "attempt.json"), "$.provenance.kind",
                                f"host {attempt.host!r} is " + (
                                    "emulated; its evidence must be 'emulated'" if host.emulation
                                    else f"not emulated; '{prov.kind}' evidence belongs under an "
                                         "emulated host")))
    if prov.kind == "emulated" and prov.host != attempt.host:
        problems.append(Problem(str(folder / "attempt.json"), "$.provenance.host",
                                f"emulated as {prov.host!r} but filed under {attempt.host!r}"))
    if prov.kind == "emulated" and host.emulation is not None:
        problems.extend(_emulated_card(attempt, host.emulation.emulates, hosts))
    random_host = host.diffusers is not None and host.diffusers.weights == "random"
    if random_host and attempt.meta.weights != "random":
        problems.append(Problem(str(folder / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.weights"),
                                f"host {attempt.host!r} builds random weights: its attempts say "
                                "weights 'random'"))
    if attempt.meta.weights == "random":
        # Random weights count for capacity only: no record of theirs may claim more.
        for i, record in enumerate(attempt.offline_requests):
            if record.weights != "random":
                problems.append(Problem(str(folder / "offline-requests.json"),
                                        content_path("offline-requests.json",
                                                     f"$[{i}].weights"),
                                        "expected 'random' in a random-weight attempt"))
        for name, rows in (("psnr.json", attempt.psnr), ("structure.json", attempt.structure)):
            if rows:
                problems.append(Problem(str(folder / name), "", "a random-weight attempt has no "
                                        "PSNR or output structure: random weights count for "
                                        "capacity only"))
    if prov.kind == "measured" and host.simulated:
        problems.append(Problem(str(folder / ATTEMPT_FILE),
                                content_path(ATTEMPT_FILE, "$.provenance.kind"),
                                f"host {attempt.host!r} is simulated; its evidence must be "
                                "'simulated', not 'measured'"))

    def checker(known: list[str] | set[str], message):
        """A check that a name used at (file, path in its content) is one of `known`; None is
        always fine."""
        known = set(known)

        def check(file: str, path: str, name: str | None) -> None:
            if name is not None and name not in known:
                problems.append(Problem(str(folder / file), content_path(file, path),
                                        message(name)))
        return check

    flag_set = checker(host.serve_flag_sets, lambda name: (
        f"unknown flag set {name!r} for host {attempt.host!r} "
        f"(expected one of {', '.join(host.serve_flag_sets)})"))
    # On a Diffusers host the offline records are keyed by its Diffusers profiles.
    offline_names = host.diffusers_profiles or host.offline_kwarg_sets
    kind = "Diffusers profile" if host.diffusers is not None else "offline kwarg set"
    kwarg_set = checker(offline_names, lambda name: (
        f"unknown {kind} {name!r} for host {attempt.host!r} "
        f"(expected one of {', '.join(offline_names) or 'none'})"))
    fixture = checker(fixtures.ids, lambda name: (
        f"unknown fixture {name!r} (fixtures: {', '.join(fixtures.ids)})"))
    baseline = checker(attempt_ids, lambda name: f"baseline attempt {name!r} is not under evidence/")

    by_id = {f.id: f for f in fixtures.fixtures}

    def inputs(file: str, path: str, record) -> None:
        """A record says whose inputs it ran on, and says it as its fixture does."""
        known = by_id.get(record.fixture)
        if known is not None and record.inputs != known.inputs:
            problems.append(Problem(str(folder / file), content_path(file, f"{path}.inputs"),
                                    f"expected {known.inputs!r}, the inputs of fixture "
                                    f"{record.fixture!r}, got {record.inputs!r}"))

    def original(file: str, path: str, name: str | None, what: str) -> None:
        """PSNR and speed against the baseline need the baseline's own inputs: no stand-ins."""
        known = by_id.get(name or "")
        if known is not None and known.inputs == "stand-in":
            problems.append(Problem(str(folder / file), content_path(file, path),
                                    f"fixture {name!r} is a stand-in for {known.stands_in_for!r}: "
                                    f"{what} needs the baseline's own inputs"))

    def requests_of(file: str, rows, names, field) -> None:
        """Rows of one request each: the configuration its `field` names is one `names` knows,
        its fixture is known, and its inputs are the fixture's."""
        for i, row in enumerate(rows):
            key = field(row)
            names(file, f"$[{i}].{key}", getattr(row, key))
            fixture(file, f"$[{i}].fixture", row.fixture)
            inputs(file, f"$[{i}]", row)

    baseline("attempt.json", "$.baseline", attempt.meta.baseline)
    for i, run in enumerate(attempt.runs):
        flag_set("runs.json", f"$[{i}].flag_set", run.flag_set)
        for j, cell in enumerate(run.cells):
            fixture("runs.json", f"$[{i}].cells[{j}].fixture", cell.fixture)
            inputs("runs.json", f"$[{i}].cells[{j}]", cell)
    requests_of("requests.json", attempt.requests, flag_set, lambda _: "flag_set")
    diffusers = host.diffusers is not None
    for i, run in enumerate(attempt.offline):
        kwarg_set("offline.json", f"$[{i}].{_field(run)}", run.configuration)
        if (run.profile is not None) != diffusers:
            problems.append(Problem(str(folder / "offline.json"), content_path(
                "offline.json", f"$[{i}].{_field(run)}"), "a Diffusers host's cells name their "
                "profile, any other host's their offline kwarg set"))
        for j, cell in enumerate(run.cells):
            fixture("offline.json", f"$[{i}].cells[{j}].fixture", cell.fixture)
    for i, search in enumerate(attempt.capacity):
        kwarg_set("capacity.json", f"$[{i}].profile", search.profile)
        for j, band in enumerate(search.bands):
            fixture("capacity.json", f"$[{i}].bands[{j}].fixture", band.fixture)
    problems += [Problem(str(folder / file), content_path(file, path), why)
                 for file, path, why in capacity_findings(
                     attempt.capacity, attempt.capacity_trials,
                     {f.id: f.reference_count for f in fixtures.fixtures},
                     getattr(prov, "command", None))]
    requests_of("capacity-trials.json", attempt.capacity_trials, kwarg_set, lambda _: "profile")
    requests_of("offline-requests.json", attempt.offline_requests, kwarg_set, _field)
    for i, obs in enumerate(attempt.structure):
        flag_set("structure.json", f"$[{i}].flag_set", obs.flag_set)
        kwarg_set("structure.json", f"$[{i}].kwarg_set", obs.kwarg_set)
        for j, name in enumerate(obs.fixtures):
            fixture("structure.json", f"$[{i}].fixtures[{j}]", name)
    for i, row in enumerate(attempt.psnr):
        flag_set("psnr.json", f"$[{i}].flag_set", row.flag_set)
        fixture("psnr.json", f"$[{i}].fixture", row.fixture)
        original("psnr.json", f"$[{i}].fixture", row.fixture, "PSNR against the baseline")
        baseline("psnr.json", f"$[{i}].baseline_attempt", row.baseline_attempt)
    for i, group in enumerate(attempt.determinism):
        fixture("determinism.json", f"$[{i}].fixture", group.fixture)
        for j, name in enumerate(group.flag_sets):
            flag_set("determinism.json", f"$[{i}].flag_sets[{j}]", name)
    for i, check in enumerate(attempt.propagation):
        pair = kwarg_set if check.via == "offline" else flag_set
        pair("propagation.json", f"$[{i}].flag_set_with", check.flag_set_with)
        pair("propagation.json", f"$[{i}].flag_set_without", check.flag_set_without)
        fixture("propagation.json", f"$[{i}].fixture", check.fixture)
    if attempt.baseline is not None:
        for i, wall in enumerate(attempt.baseline.walls):
            fixture("baseline.json", f"$.walls[{i}].fixture", wall.fixture)
            original("baseline.json", f"$.walls[{i}].fixture", wall.fixture, "a baseline wall")
    return problems


def _emulated_card(attempt: LoadedAttempt, now: str | None, hosts: HostsConfig) -> list[Problem]:
    """An emulated attempt's card is the host it emulated, by the name it was made under: a
    host renamed, or an emulation pointed at another card, would read its figures as another
    card's, so either is refused (renaming is not migrated: evidence keeps its names)."""
    made = attempt.meta.provenance.emulates
    if made == now:
        return []
    where = (str(attempt.path / ATTEMPT_FILE), content_path(ATTEMPT_FILE, "$.provenance.emulates"))
    if made is not None and made not in hosts.hosts:
        return [Problem(*where, f"emulated the card of host {made!r}, which hosts.toml no longer "
                                f"defines: restore [hosts.{made}] under that name (evidence keeps "
                                "the names it was made under), or take this attempt out of "
                                "evidence/")]
    return [Problem(*where, f"emulated {made!r}, while [hosts.{attempt.host}.emulation] now "
                            f"emulates {now!r}: its figures are those of {made!r}; point the emulation "
                            f"back at {made!r}, or file new runs under a host of their own")]


def _upstream_refs(attempt: LoadedAttempt) -> list[Problem]:
    """evidence/upstream/ holds only `upstream check` results, measured by this package."""
    file = str(attempt.path / ATTEMPT_FILE)
    problems = []
    if attempt.meta.provenance.kind != "measured" or attempt.meta.provenance.host != UPSTREAM_HOST:
        problems.append(Problem(file, content_path(ATTEMPT_FILE, "$.provenance"),
                                f"an {UPSTREAM_HOST} attempt is measured by `omniprobe upstream "
                                f"check` on host {UPSTREAM_HOST!r}"))
    if attempt.upstream is None:
        problems.append(Problem(str(attempt.path), "", "an upstream attempt holds upstream.json"))
    others = [name for name in SECTION_FILES if name != "upstream.json"
              and (attempt.path / name).exists()]
    if others:
        problems.append(Problem(str(attempt.path), "", "an upstream attempt holds only "
                                f"upstream.json, not {', '.join(others)}"))
    return problems


def load_project(project: Project, *, staged: Path | None = None,
                 superseded: frozenset[tuple[str, str]] = frozenset()
                 ) -> tuple[Loaded | None, list[Problem]]:
    """Load everything; return all problems found (an empty list means valid). `staged`: an
    evidence tree not in place yet (an unpack's), checked together with evidence/, in place of
    the attempts (host, id) it `superseded`."""
    problems: list[Problem] = []
    hosts = fixtures = None
    try:
        hosts = load_hosts(project.hosts_file)
    except InputError as exc:
        problems.extend(exc.problems)
    else:
        problems.extend(model_folder_problems(hosts, project))
    try:
        fixtures = load_fixtures(project.fixtures_file)
    except InputError as exc:
        problems.extend(exc.problems)
    else:
        problems.extend(reference_problems(
            fixtures, project.fixtures_file,
            hosts.probe.max_reference_pixels if hosts else MAX_REFERENCE_PIXELS))
    evidence, found = load_evidence(project.evidence_dir)
    problems.extend(found)
    problems.extend(Problem(str(journal), "", "an interrupted `omniprobe evidence unpack` has not "
                            "moved everything into place; any `omniprobe evidence` command "
                            "completes it") for journal in unpack_journal.pending(project))
    if staged is not None:
        more, found = load_evidence(staged)
        kept = [a for a in evidence.attempts if (a.host, a.id) not in superseded]
        evidence = Evidence(kept + more.attempts)
        problems.extend(found)
    if hosts is None or fixtures is None:
        return None, problems
    ids = {a.id for a in evidence.attempts}
    hosts_of: dict[str, list[str]] = {}
    for attempt in evidence.attempts:
        hosts_of.setdefault(attempt.id, []).append(attempt.host)
    for attempt in evidence.attempts:
        if len(hosts_of[attempt.id]) > 1:
            problems.append(Problem(str(attempt.path / ATTEMPT_FILE), content_path(ATTEMPT_FILE,
                                    "$.id"), f"attempt id {attempt.id!r} is used by more than one "
                                    f"host ({', '.join(hosts_of[attempt.id])})"))
    for attempt in evidence.attempts:
        problems.extend(_refs(attempt, hosts, fixtures, ids))
        problems.extend(repeat_problems(attempt))
        problems.extend(config_problems(attempt, project))
        host = hosts.hosts.get(attempt.host)
        if host is not None:
            problems.extend(consistency_problems(attempt, host, evidence))
    problems.extend(calibration_problems(hosts, evidence, str(project.hosts_file)))
    return Loaded(hosts, fixtures, evidence), problems


def load_valid_project(project: Project) -> Loaded:
    """Load everything or raise InputError listing every problem."""
    loaded, problems = load_project(project)
    if problems or loaded is None:
        raise InputError(problems)
    return loaded
