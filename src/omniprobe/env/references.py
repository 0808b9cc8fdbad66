"""The reference suite: the fixtures' reference images against the digests the fixtures record."""

from __future__ import annotations

from omniprobe.config.fixtures import MAX_REFERENCE_PIXELS, load_fixtures, reference_problems
from omniprobe.config.project import Project
from omniprobe.env.check_record import env_check
from omniprobe.errors import InputError
from omniprobe.evidence.models.environment import EnvCheck


def references_check(project: Project, *, simulated: bool = False,
                     max_pixels: int = MAX_REFERENCE_PIXELS) -> EnvCheck:
    """The reference images of the fixtures this host can run: every fixture's but the simulated
    ones, which only a simulated host runs; each within `max_pixels` (hosts.toml [probe]
    max_reference_pixels)."""
    name = "fixtures.references"
    try:
        suite = load_fixtures(project.fixtures_file)
    except InputError as exc:
        return env_check(name, "fail", f"cannot read the fixtures: {exc}")

    def runs_here(fixture) -> bool:
        return simulated or not fixture.simulated

    known = {ref.file for fixture in suite.fixtures if runs_here(fixture)
             for ref in fixture.references or []}
    if not known:
        return env_check(name, "skip", f"the fixtures record no reference digests "
                                    f"({suite.reference_suite} bindings unknown)")
    bad = sorted({p.message for p in reference_problems(suite, project.fixtures_file, max_pixels,
                                              runs_here)})
    return env_check(name, "fail" if bad else "pass",
                     "; ".join(bad) or f"{len(known)} files match the fixtures' sha256",
                     f"{len(known)} files", f"{len(known) - len(bad)} match")
