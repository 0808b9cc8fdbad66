"""Messages wrap at a readable width (issue 52): the one place errors are printed
(cli.run_command) wraps each line for a terminal between words at errors.MESSAGE_WIDTH, a
continuation indented under the text, and never splits a path, URL or command word; a pipe or file
gets each message whole on one line."""

from __future__ import annotations

import io

import pytest

from omniprobe import cli
from omniprobe.errors import MESSAGE_WIDTH, EnvironmentFailure, InputError, Problem, wrapped

LONG_PATH = "/srv/omniprobe/" + "a-very-long-folder-name/" * 5 + "hosts.toml"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wider than MESSAGE_WIDTH: the width is omniprobe's


@pytest.mark.parametrize(("line", "width", "expected"), [
    ("short", 100, ["error: short"]),
    ("", 100, ["error:"]),
    ("one two three four", 16, ["error: one two", "         three", "         four"]),
    # a word wider than the line stands alone, whole
    (f"see {LONG_PATH} now", 60, ["error: see", f"         {LONG_PATH}", "         now"]),
    # a line's own indent (a detail under the first line) is kept, its continuation under it
    ("  the command that failed: uv pip compile", 30,
     ["error:   the command that", "           failed: uv pip", "           compile"]),
    ("--python-version=3.13 and-a-hyphenated-word", 30,
     ["error: --python-version=3.13", "         and-a-hyphenated-word"]),
])
def test_a_line_wraps_between_words(line, width, expected):
    assert wrapped("error: ", line, width) == expected


def test_a_900_character_problem_comes_out_wrapped_with_every_word_whole(wide_terminal):
    message = " ".join(f"word{i} `omniprobe env build --host h{i}`" for i in range(40))
    problem = Problem(LONG_PATH, "$.hosts.mybox.gpu_minimum", message)
    assert len(str(problem)) > 900

    def fails() -> int:
        raise InputError([problem, Problem("b.json", "", "not found")])

    out = Terminal()
    assert cli.run_command(fails, out) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) > 9
    assert all(len(line) <= MESSAGE_WIDTH for line in lines if LONG_PATH not in line)
    assert lines[0] == f"error: {LONG_PATH}:"  # the path whole, on a line of its own
    assert [line[:6] == "error:" for line in lines].count(True) == 2  # one per problem
    assert lines[-1] == "error: b.json: not found"
    assert " ".join(out.getvalue().replace("error:", " ").split()) == " ".join(
        f"{problem} b.json: not found".split())


def test_every_category_is_wrapped_the_same_way(wide_terminal):
    def fails() -> int:
        raise EnvironmentFailure("no GPU: " + "nvml " * 60)

    out = Terminal()
    assert cli.run_command(fails, out) == 4
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and all(len(line) <= MESSAGE_WIDTH for line in lines)
    assert all(line.startswith(" " * len("error: ")) for line in lines[1:])


def test_a_narrow_terminal_wraps_at_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")

    def fails() -> int:
        raise EnvironmentFailure("no GPU: " + "nvml " * 60)

    out = Terminal()
    assert cli.run_command(fails, out) == 4
    assert all(len(line) <= 70 for line in out.getvalue().splitlines())


def test_a_pipe_gets_each_message_whole_on_its_line():
    message = "no GPU: " + "nvml " * 180

    def fails() -> int:
        raise EnvironmentFailure(message)

    out = io.StringIO()
    assert cli.run_command(fails, out) == 4
    assert out.getvalue() == f"error: {message}\n"
