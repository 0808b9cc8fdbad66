"""The `omniprobe` command line; nox sessions call into it."""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
from collections.abc import Callable
from typing import TextIO

from omniprobe import __version__
from omniprobe.cli.commands import COMMANDS
from omniprobe.errors import (
    MESSAGE_WIDTH,
    EnvironmentFailure,
    InputError,
    Interrupted,
    OmniprobeError,
    Problem,
    wrapped,
)

Command = Callable[[argparse.Namespace], int]


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """Every command's parser (cli/commands/, one module each), assembled once a process: a
    parse reads it and changes nothing (a process that runs many commands, the tests, builds it
    once)."""
    parser = argparse.ArgumentParser(prog="omniprobe", description=__doc__)
    parser.add_argument("--version", action="version", version=f"omniprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def run_command(command: Callable[[], int], out: TextIO | None = None) -> int:
    """Run one command: the one place where its errors become messages (every problem of an
    InputError, no traceback) and exit codes (errors.py: one per category); Ctrl-C exits 130."""
    out = out or sys.stderr
    # A terminal's reader gets lines of at most MESSAGE_WIDTH (a narrower terminal's width, never
    # under 60); a pipe or file gets each message whole on its line, for grep and the logs.
    width = (min(MESSAGE_WIDTH, max(60, shutil.get_terminal_size((MESSAGE_WIDTH, 24)).columns))
             if out.isatty() else None)

    def error(line: str) -> None:
        print("\n".join(wrapped("error: ", line, width)) if width else f"error: {line}",
              file=out)

    try:
        return command()
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=out)
        return exc.exit_code
    except FileNotFoundError as exc:  # a path given on the command line that does not exist
        where = str(exc.filename) if exc.filename is not None else str(exc)
        error(str(Problem(where, '', 'file not found')))
        return InputError.exit_code
    except OmniprobeError as exc:
        for line in exc.lines():
            error(line)
        return exc.exit_code
    except OSError as exc:  # the file system refused a named path: a folder where a file belongs
        if exc.filename is None:
            raise
        error(str(Problem(str(exc.filename), '', exc.strerror or str(exc))))
        return EnvironmentFailure.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=out)
        return Interrupted.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = ["omniprobe", *argv]  # the command line an attempt records as its provenance
    args.parser = parser  # for a command that reads every command's options (nox-args)
    return run_command(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
