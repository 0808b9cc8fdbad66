"""What every probe selects before it runs: the fixtures of a host and the caps, refused before any
attempt exists."""

from __future__ import annotations

from omniprobe.config.fixtures import Fixture, FixtureNotRunnable, FixtureSuite
from omniprobe.config.host_entry import Host
from omniprobe.config.hosts import HostsConfig
from omniprobe.errors import InputError, Problem, Refusal
from omniprobe.harness.common.emulation import (
    parse_caps_gib,
)


class PlanError(Refusal):
    """A flag set or fixture asked for that the host or the fixtures do not have."""


def serve_fixtures(suite: FixtureSuite, host: Host, wanted: tuple[str, ...] = ()) -> list[Fixture]:
    """The fixtures to serve on the host, fewest references first: those named, else the suite's
    default (each seed fixture where its inputs are stated, else its stand-ins).

    Refuses a simulated fixture on a real host, and names the missing fields of each chosen
    fixture that cannot run (and its stand-ins, which can).
    """
    unknown = sorted(set(wanted) - set(suite.ids))
    if unknown:
        raise PlanError(f"unknown fixture(s) {', '.join(unknown)}; "
                        f"fixtures: {', '.join(suite.ids)}")
    if wanted:
        chosen = [f for f in suite.fixtures if f.id in wanted]
        if not host.simulated and any(f.simulated for f in chosen):
            raise PlanError(f"fixture(s) {', '.join(f.id for f in chosen if f.simulated)} are "
                            "simulated: they run on simulated hosts only")
        _refuse_unrunnable(suite, chosen)
    else:
        chosen, notes = suite.default_fixtures()
        if not chosen:
            raise FixtureNotRunnable("no fixture can run:\n" + "\n".join(notes))
    return sorted(chosen, key=lambda f: f.reference_count)


def _refuse_unrunnable(suite: FixtureSuite, chosen: list[Fixture]) -> None:
    messages = []
    for fixture in chosen:
        try:
            fixture.require_runnable()
        except FixtureNotRunnable as exc:
            standins = [s.id for s in suite.standins_for(fixture.id)]
            messages.append(str(exc) + (f" (or serve its stand-in: --fixture {standins[0]})"
                                        if standins else ""))
    if messages:
        raise FixtureNotRunnable("\n".join(messages))


def probe_caps(cfg: HostsConfig, host_name: str, caps_gib: str | None) -> list[int | None]:
    """The caps to probe in turn, one attempt each: the sweep's, an emulated host's own, or none
    (a real card)."""
    if caps_gib is None:
        return [cfg.emulated_cap_mib(host_name)]
    try:  # a malformed value is a bad argument (exit 2) on any host
        caps: list[int | None] = list(parse_caps_gib(caps_gib))
    except ValueError as exc:
        raise InputError([Problem("--caps", "", str(exc))]) from None
    if cfg.host(host_name).emulation is None:
        raise PlanError(f"--caps sweeps an emulated host's cap; host {host_name!r} is not "
                        "emulated (hosts.toml [hosts.<name>.emulation])")
    return caps
