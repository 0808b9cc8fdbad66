"""The evidence-making commands' argparse flags and options objects, generated from the one
definition of each option (harness/common/options.py)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from omniprobe.harness.common.options import (
    COMMANDS,
    Bounds,
    Option,
    command_options,
    options_of,
)


def parser_of(bounds: Bounds) -> Callable[[str], float | int]:
    """The argparse type of a bounded number: refuses text out of its range, nan and inf."""
    def parse(text: str):
        try:
            value = bounds.convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {bounds.what}, got {text!r}") from None
        if (not math.isfinite(value) or value < bounds.low or value > bounds.high
                or (bounds.low_open and value == bounds.low)):
            raise argparse.ArgumentTypeError(f"expected {bounds.what}, got {text!r}")
        return value

    parse.__name__ = parse.__qualname__ = bounds.name  # argparse names it in its messages
    return parse


def add_flag(p: argparse.ArgumentParser, opt: Option, words) -> None:
    text = opt.help_for(words)
    if opt.default is not None and not opt.switch and "default" not in text:
        text += f" (default: {opt.default})"
    kwargs: dict = {"help": text}
    if opt.dest:
        kwargs["dest"] = opt.dest
    if opt.metavar:
        kwargs["metavar"] = opt.metavar
    if opt.switch:
        kwargs["action"] = "store_true"
    else:
        if opt.repeat:
            kwargs.update(action="append", default=[])
        elif opt.default is not None:
            kwargs["default"] = opt.default
        if opt.bounds is not None:
            kwargs["type"] = parser_of(opt.bounds)
    p.add_argument(opt.flag, **kwargs)


def add_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every flag `command` takes (harness/common/options.py COMMANDS), in its help's order."""
    takes = COMMANDS[command]
    for opt in command_options(takes):
        add_flag(p, opt, takes.words)


def add_command(sub, name: str, text: str, run) -> argparse.ArgumentParser:
    """An evidence-making command's parser: its flags generated, `run` its handler."""
    p = sub.add_parser(name, help=text, description=text)
    add_options(p, name)
    p.set_defaults(func=run)
    return p


def options_from(args: argparse.Namespace):
    """The options object of the parsed command line (`args.command`'s options dataclass)."""
    return options_of(COMMANDS[args.command], vars(args))
