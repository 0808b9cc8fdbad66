"""Every command's flags, as its argparse parser holds them, pinned: a refactor of how options are
defined (harness/common/options.py) keeps each flag, its help, type, default and order exactly."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omniprobe.cli import build_parser

PINNED = Path(__file__).parent / "data" / "cli_flags.json"


def _type_name(action: argparse.Action) -> str | None:
    kind = action.type
    return None if kind is None else getattr(kind, "__name__", type(kind).__name__)


def _described(parser: argparse.ArgumentParser) -> dict:
    actions, commands = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            commands = {name: {"help": helps.get(name), **_described(sub)}
                        for name, sub in action.choices.items()}
            continue
        actions.append({"flags": list(action.option_strings), "dest": action.dest,
                        "action": type(action).__name__, "nargs": action.nargs,
                        "const": action.const, "default": action.default,
                        "type": _type_name(action), "choices": action.choices,
                        "required": action.required, "help": action.help,
                        "metavar": action.metavar})
    return {"description": parser.description, "actions": actions, "commands": commands}


def described() -> dict:
    return json.loads(json.dumps(_described(build_parser()), default=str))


def test_every_command_keeps_its_flags():
    assert described() == json.loads(PINNED.read_text())


if __name__ == "__main__":  # re-pin: python tests/test_cli_flags.py
    PINNED.write_text(json.dumps(described(), indent=1) + "\n")
