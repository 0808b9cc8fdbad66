"""Routing the arguments after `nox ... --` to the sessions whose command takes them."""

from __future__ import annotations

import pytest

from omniprobe.cli import build_parser
from omniprobe.cli.nox_args import route_options, routing_table
from omniprobe.errors import InputError

from .conftest import REPO

RUN = ["env-sim", "probe-init", "probe-serve", "report"]


@pytest.mark.parametrize(("session", "run", "posargs", "taken"), [
    ("probe-init", RUN, ["--fresh"], ["--fresh"]),
    ("report", RUN, ["--fresh"], []),
    ("env-sim", RUN, ["--fresh", "--dry-run"], ["--dry-run"]),
    ("probe-serve", RUN, ["--flag-set", "fp8", "--fixture=sim-t2i", "--check"],
     ["--flag-set", "fp8", "--fixture=sim-t2i"]),
    ("report", RUN, ["--flag-set", "fp8", "--check"], ["--check"]),
    ("env-rtx3090", ["env-rtx3090", "probe-init"], ["--venv", "/e", "--port", "9"],
     ["--venv", "/e"]),
    ("report", ["report", "tests"], ["-k", "name", "--check"], ["--check"]),
    ("tests", ["report", "tests"], ["-k", "name", "--check"], ["-k", "name", "--check"]),
    # --help: every session prints its own command's help (issue 34: README lines run so)
    ("report", RUN, ["--help"], ["--help"]),
    ("env-sim", RUN, ["--help"], ["--help"]),
    ("probe-offline", ["env-rtx3090", "probe-offline"], ["-h"], ["-h"]),
])
def test_each_session_takes_its_options(session, run, posargs, taken):
    assert route_options(build_parser(), session, run, posargs) == taken


@pytest.mark.parametrize(("run", "posargs", "message"), [
    (["report"], ["--dry-run"], "--dry-run: no session of this run (report) takes it; the "
                                "sessions that take it: env-<host>"),
    (["env-sim"], ["--host", "rtx3090"], "--host: no session of this run (env-sim) takes it; the "
     "sessions that take it: probe-init, probe-serve, probe-offline, probe-capacity, "
     "probe-baseline, propagation"),
    (["report"], ["--bogus"], "--bogus: no session of this run (report) takes it; no omniprobe "
                              "session takes it"),
    (["probe-init"], ["--fresh", "stray"], "stray: not an option"),
])
def test_an_option_no_session_of_the_run_takes_is_an_error(run, posargs, message):
    with pytest.raises(InputError) as info:
        route_options(build_parser(), run[0], run, posargs)
    assert message in str(info.value)


def test_the_user_guide_shows_the_routing_table():
    guide = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    for option, sessions in routing_table(build_parser()).items():
        assert f"| `{option}` | {', '.join(sessions)} |" in guide
