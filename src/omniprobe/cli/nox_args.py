"""Which of the options after `nox -s ... --` each session of the run takes.

nox hands every session of a run the same arguments after `--`. Each session asks
`omniprobe nox-args SESSION --run S1,S2,...` for its share: an option goes to every session of the
run whose command takes it (the command's own argparse parser says which, so the table below
names commands, never options), and an option no session of the run takes is an error naming
the sessions that would.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from omniprobe.errors import InputError, Problem


@dataclass(frozen=True)
class Route:
    """The omniprobe command a nox session runs, and the options the noxfile sets itself."""

    command: tuple[str, ...]
    fixed: frozenset[str] = frozenset()


# nox session -> the command its options are routed to; `env-<host>` stands for every host's.
ROUTES: dict[str, Route] = {
    "validate": Route(("validate",)),
    "report": Route(("report",)),
    "answer": Route(("answer",)),
    "schema": Route(("schema",)),
    "standins": Route(("standins",)),
    "quality": Route(("quality",)),
    "env-<host>": Route(("env", "build"), frozenset({"--host", "--select"})),
    "probe-init": Route(("probe-init",)),
    "probe-serve": Route(("probe-serve",)),
    "probe-offline": Route(("probe-offline",)),
    "probe-capacity": Route(("probe-capacity",), frozenset({"--build-env"})),
    "probe-baseline": Route(("probe-baseline",), frozenset({"--build-env"})),
    "propagation": Route(("propagation",)),
    "upstream": Route(("upstream", "check")),
}
NOX_ARGS = "nox arguments after --"
# Sessions handing every argument to a tool of their own (pytest); they take any option.
TAKES_ALL = frozenset({"tests"})
# Every command's own: `nox -s S -- --help` prints the help of S's command and runs nothing.
HELP = frozenset({"-h", "--help"})


def route_key(session: str) -> str | None:
    """The ROUTES key of a nox session, None for a session that takes no options."""
    if session.startswith("env-"):
        return "env-<host>"
    return session if session in ROUTES else None


def _subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    # argparse has no public accessor for its subcommands' parsers.
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def option_actions(parser: argparse.ArgumentParser, route: Route) -> dict[str, argparse.Action]:
    """The options a route's command takes from the user: option string -> its action."""
    command = _subparser(parser, route.command)
    return {option: action for action in command._actions for option in action.option_strings
            if option not in route.fixed and not isinstance(action, argparse._HelpAction)}


def split_options(posargs: list[str], known: dict[str, argparse.Action]) -> list[list[str]]:
    """The arguments as [option, value, ...] groups; an option's values are as many as its
    action takes (an unknown option keeps the non-option words after it)."""
    groups: list[list[str]] = []
    for word in posargs:
        if word.startswith("-") and word != "-":
            groups.append([word])
        elif groups and not _full(groups[-1], known):
            groups[-1].append(word)
        else:
            raise InputError([Problem(NOX_ARGS, word, "not an option: every argument "
                                      "after -- is an option of one of the run's sessions")])
    return groups


def _full(group: list[str], known: dict[str, argparse.Action]) -> bool:
    """Whether an option group holds every value its action takes."""
    action = known.get(group[0].partition("=")[0])
    if action is None:
        return False
    if "=" in group[0]:
        return True
    wanted = action.nargs
    if wanted is None:
        return len(group) == 2
    if isinstance(wanted, int):
        return len(group) == 1 + wanted
    return wanted == "?" and len(group) == 2


def route_options(parser: argparse.ArgumentParser, session: str, run: list[str],
                  posargs: list[str]) -> list[str]:
    """The arguments `session` takes of the run's `posargs`; InputError naming, for each option
    no session of the run takes, the sessions that would."""
    tables = {name: option_actions(parser, ROUTES[key])
              for name in dict.fromkeys([*run, session]) if (key := route_key(name))}
    every = {key: option_actions(parser, route) for key, route in ROUTES.items()}
    known = {option: action for actions in every.values() for option, action in actions.items()}
    mine: list[str] = []
    problems = []
    for group in split_options(posargs, known):
        option = group[0].partition("=")[0]
        takers = [name for name, actions in tables.items() if option in actions or option in HELP]
        if session in TAKES_ALL or session in takers:
            mine.extend(group)
        if not takers and not TAKES_ALL.intersection(run):
            would = [key for key, actions in every.items() if option in actions]
            problems.append(Problem(NOX_ARGS, option, (
                f"no session of this run ({', '.join(run)}) takes it; "
                + (f"the sessions that take it: {', '.join(would)}" if would
                   else "no omniprobe session takes it"))))
    if problems:
        raise InputError(problems)
    return mine


def routing_table(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each long option -> the sessions that take it, as docs/guide.md's table shows it."""
    takers: dict[str, list[str]] = {}
    for key, route in ROUTES.items():
        for option in option_actions(parser, route):
            if option.startswith("--"):
                takers.setdefault(option, []).append(key)
    return dict(sorted(takers.items()))
