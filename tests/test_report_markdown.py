"""The rendered report parsed as Markdown: list items apart, tables square, no Python repr."""

import json
import re

from markdown_it import MarkdownIt

from .evidence_scaffold import add_attempt
from .rendered import render_details, render_harness, render_report

SNAKE = re.compile(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b")


def parse(text):
    return MarkdownIt("commonmark").enable("table").parse(text)


def cells_of(line: str) -> list[str]:
    """A table row's cells; pipes inside code spans or escaped do not split."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    cells, current, in_code = [], "", False
    for i, ch in enumerate(inner):
        if ch == "`" and (i == 0 or inner[i - 1] != "\\"):
            in_code = not in_code
        if ch == "|" and not in_code and (i == 0 or inner[i - 1] != "\\"):
            cells.append(current)
            current = ""
        else:
            current += ch
    return [*cells, current]


def check_markdown(text: str, tokens=None) -> None:
    """`tokens`: parse(text), where the caller has it already."""
    lines = text.splitlines()
    tokens = parse(text) if tokens is None else tokens
    items, in_tables = 0, set()
    for i, tok in enumerate(tokens):
        if tok.type == "list_item_open":
            items += 1
            start, end = tok.map
            inline = next(t for t in tokens[i:] if t.type == "inline")
            # An item's text never holds the start of another bullet.
            assert not re.search(r"[.)]- \*\*", inline.content), inline.content
            body = lines[start:end]
            # One bullet at the item's own indent: a nested list's bullets sit deeper.
            indent = re.match(r"^\s*", body[0]).group()
            assert sum(line.startswith(indent + "- ") for line in body) == 1, body
        if tok.type == "table_open":
            start, end = tok.map
            in_tables.update(range(start, end))
            rows = [line for line in lines[start:end] if line.strip()]
            width = len(cells_of(rows[0]))
            for row in rows:
                assert len(cells_of(row)) == width, row
        if tok.type == "inline":
            for child in tok.children or []:
                if child.type == "strong_open":
                    label = tok.content.split("**")[1]
                    assert not SNAKE.search(label), label
    # A row cut off from its table by a blank line renders as a paragraph of pipes.
    assert [line for n, line in enumerate(lines)
            if line.startswith("|") and n not in in_tables] == []
    bullets = sum(bool(re.match(r"^\s*- ", line)) for line in lines)
    assert items == bullets
    assert "{'" not in text and "': " not in text and "\n\n\n" not in text
    assert [line for line in lines if line != line.rstrip()] == []
    for line in lines:
        if line.startswith("| ") and not line.startswith("| ---"):
            first = cells_of(line)[0].strip()
            assert not (SNAKE.fullmatch(first) and "`" not in first), line


def test_committed_report_parses_as_markdown(repo):
    check_markdown(render_report(repo))
    check_markdown(render_harness(repo))
    check_markdown(render_details(repo))


def test_report_with_new_evidence_still_parses(repo_copy):
    add_attempt(repo_copy, "rtx5080", "fixed", runs=[{
        "flag_set": "int8", "init": {"outcome": "ready"},
        "cells": [{"fixture": "edit-compose-four", "outcome": "ok", "structure": "sound"}]}])
    prop = repo_copy.evidence_dir / "rtx3090" / "seed-3090-1-serve-matrix" / "propagation.json"
    data = json.loads(prop.read_text())
    data["propagation"][0]["bytes_identical"] = False
    prop.write_text(json.dumps(data))
    check_markdown(render_report(repo_copy))
    check_markdown(render_details(repo_copy))


def test_the_checker_catches_run_together_bullets_and_ragged_tables():
    import pytest

    with pytest.raises(AssertionError):
        check_markdown("- **#27**: one.- **#164**: two.\n")
    with pytest.raises(AssertionError):
        check_markdown("| a | b |\n| --- | --- |\n| 1 | 2 | 3 |\n")
    with pytest.raises(AssertionError):
        check_markdown("| a | b |\n| --- | --- |\n\n| 1 | 2 |\n")
    with pytest.raises(AssertionError):
        check_markdown("| Kwargs |\n| --- |\n| `{'a': 1}` |\n")
    with pytest.raises(AssertionError):
        check_markdown("- **img_mlp_oom**: here.\n")
