"""Hostile input, round 3 (issue 35), class 10: free text that reaches the report. Every string
field of the evidence that `validate` lets hold free text gets a hostile payload; the rendered
reports, parsed as Markdown, have the clean render's headings and tables, and no raw HTML, control
or bidi character."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel

from omniprobe.config.project import Project
from omniprobe.errors import InputError
from omniprobe.report.paths import DETAILS_FILE, HARNESS_FILE, REPORT_FILE
from omniprobe.report.safe_text import made_safe, may_hold_text, md_text, text_fields

from .conftest import REPO
from .rendered import render_outputs
from .test_report_markdown import check_markdown, parse

# Every key whose string values validate accepts whatever they hold (found by trying each key
# of the committed evidence with a payload of `|`, HTML and a bidi override). Not `command` (the
# grid's provenance is read off it), `emulates` (it names a host hosts.toml must define) nor
# `unit` (a calibration's figure must be in references).
FREE_TEXT_KEYS = frozenset({
    "description", "note", "structure_note", "error", "reason", "reasons", "detail", "statement",
    "label", "what", "where", "subject", "claimed", "finding", "stands", "stands_figure", "falls",
    "section", "function", "snippet", "file", "found_file", "found_lines", "cited_in",
    "hostname", "tool_version", "model", "physical_gpu", "sampler",
    "gpu_sampler", "knob", "shapes_tried", "dropped_at", "scope", "via", "date", "package",
    "version", "torch", "upstream_commit", "model_snapshot", "dit", "profile", "ended", "mode",
})
# Where `profile` names a Diffusers profile of hosts.toml (validate checks it): no free text there.
NAMED_PROFILE = frozenset({"offline.json", "offline-requests.json", "capacity.json",
                           "capacity-trials.json"})
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def _inject(value, payload: str, mode: str, key=None, keys=FREE_TEXT_KEYS):
    if isinstance(value, dict):
        return {k: _inject(v, payload, mode, k, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_inject(v, payload, mode, key, keys) for v in value]
    if isinstance(value, str) and key in keys:
        return payload + value if mode == "prefix" else value + payload
    return value


def _structure(text: str, tokens=None) -> tuple:
    """What a payload may not change: the headings (level, count), the tables and their widths,
    and that no HTML is there. `tokens`: parse(text), where the caller has it already."""
    tokens = parse(text) if tokens is None else tokens
    headings = [t.tag for t in tokens if t.type == "heading_open"]
    tables = sum(t.type == "table_open" for t in tokens)
    rows = sum(t.type == "tr_open" for t in tokens)
    html = [t.content for t in tokens if t.type == "html_block"] + [
        c.content for t in tokens if t.type == "inline" for c in t.children or []
        if c.type == "html_inline"]
    return headings, tables, rows, html


@pytest.fixture(scope="module")
def committed_evidence() -> dict[str, object]:
    """Each evidence file of the committed project, parsed once: a case injects into these."""
    folder = Project(REPO).evidence_dir
    return {str(path.relative_to(folder)): json.loads(path.read_text())
            for path in folder.rglob("*.json")}


@pytest.fixture(scope="module")
def clean():
    """The committed project's reports, as their structure."""
    outputs = render_outputs(Project(REPO))
    return {rel: _structure(outputs[rel]) for rel in (REPORT_FILE, HARNESS_FILE, DETAILS_FILE)}


@pytest.mark.e2e
@pytest.mark.parametrize(("payload", "mode"), [
    (" | a | b | c |", "append"),  # splits a table cell
    ("\n\n# INJECTED HEADING\n\n", "append"),  # a blank line and a top-level heading
    ("# INJECTED HEADING ", "prefix"),  # a heading where the text starts a line
    ("<script>alert(1)</script>", "append"),  # raw HTML
    ("<img src=x onerror=alert(1)>", "prefix"),
    ("\u202e\u2066evil\u2069 \u200b", "append"),  # bidi overrides, a zero-width space
    ("\x00\x1b[31m red \x07", "append"),  # NUL, an ANSI escape, BEL: a server's log line
    ("\r\n===\r\n", "append"),  # a setext underline: the line before becomes a heading
    ("\n- a list item\n1. another\n", "append"),
    ("` | ` <b>x</b> `", "append"),  # a backtick closing the template's code span
    ("- ", "prefix"),  # a bullet where the text starts a line
    ("\u2028# after a line separator", "append"),
])
def test_hostile_free_text_renders_as_text_not_structure(repo_copy, committed_evidence, clean,
                                                          payload, mode):
    files = sorted(str(p.relative_to(repo_copy.evidence_dir))
                   for p in repo_copy.evidence_dir.rglob("*.json"))
    assert files == sorted(committed_evidence)  # every evidence file of the copy gets the payload
    for rel, data in committed_evidence.items():
        path = repo_copy.evidence_dir / rel
        keys = FREE_TEXT_KEYS - {"profile"} if path.name in NAMED_PROFILE else FREE_TEXT_KEYS
        path.write_text(json.dumps(_inject(data, payload, mode, keys=keys)))
    try:  # the render loads the project as validate does, and refuses it on any problem
        outputs = render_outputs(repo_copy)
    except InputError as refused:
        pytest.fail(f"the payload must pass validate (the render must cope): "
                    f"{[str(p) for p in refused.problems[:3]]}")
    for rel in (REPORT_FILE, HARNESS_FILE, DETAILS_FILE):
        text = outputs[rel]
        tokens = parse(text)
        check_markdown(text, tokens)
        assert _structure(text, tokens) == clean[rel], rel
        assert not CONTROL.search(text), CONTROL.search(text)


@pytest.mark.parametrize(("text", "safe"), [
    ("plain words, untouched", "plain words, untouched"),
    ("a | b", "a \\| b"),
    ("line one\n\n# heading", "line one # heading"),
    ("# heading", "\\# heading"),
    ("  # indented heading", "\\# indented heading"),
    ("    four spaces: a code block", "four spaces: a code block"),
    ("two trailing spaces: a line break  ", "two trailing spaces: a line break"),
    ("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;"),
    ("- item", "\\- item"),
    ("1. item", "1\\. item"),
    ("---", "\\---"),
    ("===", "\\==="),
    ("--port 8091", "--port 8091"),  # an option is no bullet
    ("\u202eevil", "[U+202E]evil"),
    ("tab\there\r\nnext", "tab here next"),
    ("bell\x07", "bell[U+0007]"),
    ("zero\u200bwidth", "zero[U+200B]width"),
    ("a `code` span", "a `code` span"),  # paired backticks are the text's own code
    ("one ` alone", "one \\` alone"),
])
def test_md_text_keeps_one_line_of_text(text, safe):
    assert md_text(text) == safe


class _Numbers(BaseModel):
    t_s: float
    mib: int | None = None


class _Words(BaseModel):
    outcome: Literal["ok", "oom"]
    points: list[_Numbers] = []
    note: str | None = None


class _Nested(BaseModel):
    inner: _Words | None = None
    again: list[_Nested] = []


@pytest.mark.parametrize(("annotation", "holds_text"), [
    (str, True), (int, False), (float | None, False), (Literal["ok", "oom"], False),
    (list[float], False), (dict[str, float], True),  # a key is text
    (Annotated[str, "a pattern"], True), (tuple[int, ...], False),
    (_Numbers, False), (list[_Numbers] | None, False), (_Words, True), (_Nested, True),
    (object, True),  # what it cannot tell is walked
])
def test_the_walk_skips_only_what_can_hold_no_text(annotation, holds_text):
    assert may_hold_text(annotation) is holds_text


def test_a_model_is_walked_through_its_text_fields_alone():
    assert text_fields(_Words) == ("note",)
    assert text_fields(_Nested) == ("inner", "again")
    hostile = _Words(outcome="ok", points=[_Numbers(t_s=1.0)], note="<b>|</b>")
    safe = made_safe(hostile)
    assert safe.note == "&lt;b&gt;\\|&lt;/b&gt;" and safe.points is hostile.points


def test_a_model_made_safe_again_is_the_same_safe_model_and_another_is_its_own():
    """A loaded section is walked once a process: the second walk of the same model gives the
    first one's result, and another model is walked for itself."""
    hostile = _Nested(inner=_Words(outcome="ok", points=[], note="<i>"))
    safe = made_safe(hostile)
    assert safe.inner.note == "&lt;i&gt;" and made_safe(hostile) is safe
    twin = hostile.model_copy(update={"inner": _Words(outcome="ok", points=[], note="| x")})
    assert made_safe(twin).inner.note == "\\| x"
    assert made_safe(hostile) is safe
