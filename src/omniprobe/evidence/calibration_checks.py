"""hosts.toml's calibrations held against the evidence they read (issue 53): the real run a
calibration names is the card's own, real, and a reference count, or `validate` names the
[calibrations.X] key and what was expected before the report reads "agrees" or "disagrees" from
it (report/calibration_view.py real_run reads the same places)."""

from __future__ import annotations

from collections.abc import Iterator

from omniprobe.config.calibration import Calibration
from omniprobe.config.hosts import HostsConfig
from omniprobe.errors import Problem
from omniprobe.evidence.load import Evidence

# A figure that states a reference count says so in its unit (figures.json's own words).
COUNT_UNITS = ("reference", "references")

# (key of [calibrations.X], what is wrong)
Finding = tuple[str, str]


def calibration_findings(cal: Calibration, card_host: str, evidence: Evidence) -> Iterator[Finding]:
    """How `cal`'s real run, read from host `card_host`'s evidence, is not one the report may
    hold the emulation against. A card whose evidence holds no figure (no sealed baseline) yet
    reads nothing from it (the report shows no calibration of it), so nothing is read wrong;
    one that holds some holds the one named."""
    if cal.figure is not None:
        yield from _figure_findings(cal.figure, card_host, evidence)
    if cal.baseline_attempt is not None:
        yield from _baseline_findings(cal.baseline_attempt, card_host, evidence)


def _figure_findings(key: str, card_host: str, evidence: Evidence) -> Iterator[Finding]:
    """The figure is the card's own evidence's (no simulated or emulated attempt's), and states
    a whole count of references: a latency, a size or a fraction is no count."""
    found = [(a, f) for a in evidence.for_host(card_host) for f in a.figures if f.key == key]
    held = sorted({f.key for a in evidence.for_host(card_host) for f in a.figures})
    if not found and held:
        yield ("figure", f"{key!r} is not a figure of host {card_host!r}'s evidence, whose "
                         f"real run it reads (its figures: {', '.join(held)})")
    if not found:
        return
    attempt, figure = found[0]
    where = f"{attempt.path / 'figures.json'}"
    if figure.unit not in COUNT_UNITS:
        yield ("figure", f"{key!r} in {where} is in {figure.unit!r}: expected a count of "
                         f"references (unit {' or '.join(map(repr, COUNT_UNITS))})")
    elif figure.value is None or not float(figure.value).is_integer():
        yield ("figure", f"{key!r} in {where} is {figure.value!r}: expected a whole number of "
                         "references")


def _baseline_findings(attempt_id: str, card_host: str, evidence: Evidence) -> Iterator[Finding]:
    """The baseline attempt is under evidence/, the card's host's, not simulated or emulated,
    and holds the sealed baseline's walls."""
    found = [a for a in evidence.attempts if a.id == attempt_id]
    if not found:
        held = [a.id for a in evidence.for_host(card_host) if a.baseline is not None]
        if held:
            yield ("baseline_attempt", f"no attempt {attempt_id!r} under evidence/ (host "
                                       f"{card_host!r}'s baselines: {', '.join(held)})")
        return
    for attempt in found:
        if attempt.host != card_host:
            yield ("baseline_attempt", f"{attempt.path} is host {attempt.host!r}'s attempt: the "
                                       f"real run is the emulated card's, host {card_host!r}'s")
        if attempt.simulated or attempt.emulated:
            kind = "simulated" if attempt.simulated else "emulated"
            yield ("baseline_attempt", f"{attempt.path} is {kind}: the real run is read from a "
                                       "real card's attempt, never a copy made elsewhere")
        if attempt.path.name != attempt_id:
            yield ("baseline_attempt", f"{attempt.path} says it is {attempt_id!r}: a sealed "
                                       "baseline's id names its own folder")
        if attempt.baseline is None or not attempt.baseline.walls:
            yield ("baseline_attempt", f"{attempt.path} holds no baseline walls (baseline.json): "
                                       "nothing of the real run to read")


def calibration_problems(hosts: HostsConfig, evidence: Evidence, hosts_file: str
                         ) -> list[Problem]:
    """Every calibration's findings, each naming hosts.toml and the calibration's key."""
    out = []
    for name, cal in hosts.calibrations.items():
        host = hosts.hosts.get(cal.emulated_host)
        if host is None or host.emulation is None or host.emulation.emulates is None:
            continue  # load_hosts names it
        out += [Problem(hosts_file, f"[calibrations.{name}] key '{key}'", why)
                for key, why in calibration_findings(cal, host.emulation.emulates, evidence)]
    return out
