"""Free text made safe where the report renders it: every string the evidence holds (a note, an
error, a server's last log line, a transcribed statement) reaches Markdown only through
`md_text`, which keeps it one line of text that opens no heading, list or table cell and holds
no HTML; control and bidi characters are shown by code point, never passed on. Text that needs
none of this (all the committed evidence but a few `<`) comes back unchanged."""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from omniprobe.evidence.load import Evidence

# Bidi controls reorder what a reader sees (the "Trojan Source" characters) and zero-width ones
# hide text: each is shown by code point.
_BIDI = "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
_UNSAFE = re.compile(rf"[\x00-\x1f\x7f-\x9f|<>{_BIDI}\u2028\u2029]")
# What opens a block at the start of a line: a heading, a bullet, a setext underline; and the
# digits of an ordered item, whose `.` or `)` is escaped.
_BLOCK_START = re.compile(r"^(?:#|[-+*](?=\s|$)|[=-]+$)")
_ORDERED = re.compile(r"^(\d{1,9})([.)])(?=\s|$)")
_SPACES = re.compile(r"[\t\n\r\v\f\u2028\u2029]+")


def _shown(char: str) -> str:
    if char == "|":
        return "\\|"
    if char == "<":
        return "&lt;"
    if char == ">":
        return "&gt;"
    return f"[U+{ord(char):04X}]"


def md_text(text: str) -> str:
    """`text` as one safe line of Markdown: line breaks become spaces, `|` is escaped (a table
    cell stays one cell), `<` and `>` are HTML-escaped, other control, bidi and zero-width
    characters are shown as [U+XXXX], spaces around it go (an indent opens a code block, two
    trailing spaces a line break), an unpaired backtick is escaped, and a heading, list or
    underline opening it is escaped."""
    if _UNSAFE.search(text):
        text = _UNSAFE.sub(lambda m: _shown(m.group()), _SPACES.sub(" ", text))
    if text[:1].isspace() or text[-1:].isspace():
        text = text.strip()
    if text.count("`") % 2:  # an unpaired backtick would open a code span over what follows
        text = text.replace("`", "\\`")
    if _BLOCK_START.match(text):
        text = "\\" + text
    elif _ORDERED.match(text):
        text = _ORDERED.sub(r"\1\\\2", text, count=1)
    return text


# Types that hold no text: a field of one is never walked (the timelines' tens of thousands of
# samples are numbers).
_NO_TEXT = (int, float, bool, type(None))


def may_hold_text(annotation, seen: frozenset = frozenset()) -> bool:
    """Whether a value of this annotation can hold a string; a type it cannot tell is taken to."""
    if annotation in _NO_TEXT:
        return False
    origin = get_origin(annotation)
    if origin is Literal:  # the model's own fixed words, validated against the literal
        return False
    if origin is Annotated:
        return may_hold_text(get_args(annotation)[0], seen)
    if origin in (Union, types.UnionType, list, tuple, dict, set, frozenset):
        return any(may_hold_text(arg, seen) for arg in get_args(annotation) if arg is not ...)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation in seen or bool(text_fields(annotation, seen | {annotation}))
    return True


@functools.cache
def text_fields(model: type[BaseModel], seen: frozenset = frozenset()) -> tuple[str, ...]:
    """The fields of `model` that can hold a string, the only ones made_safe walks."""
    return tuple(name for name, field in model.model_fields.items()
                 if may_hold_text(field.annotation, seen | {model}))


# Models already made safe, by identity: a loaded section is frozen and shared (evidence/files.py
# keeps each file's parse), so a process that renders again (the tests, a report after a
# validate) walks each model once. Each entry holds its model, so the id is not reused meanwhile.
_SAFE_MODELS: dict[int, tuple[BaseModel, BaseModel]] = {}
_SAFE_MODELS_MAX = 1 << 16


def made_safe(value):
    """`value` with every string inside it made safe: models, dataclasses, lists, dicts."""
    if isinstance(value, str):
        return md_text(value)
    if isinstance(value, BaseModel):
        known = _SAFE_MODELS.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        fields = {name: getattr(value, name) for name in text_fields(type(value))}
        changed = {name: new for name, old in fields.items() if (new := made_safe(old)) is not old}
        safe = value.model_copy(update=changed) if changed else value
        if len(_SAFE_MODELS) >= _SAFE_MODELS_MAX:
            _SAFE_MODELS.clear()
        _SAFE_MODELS[id(value)] = (value, safe)
        return safe
    if isinstance(value, list | tuple):
        items = [made_safe(v) for v in value]
        changed = any(a is not b for a, b in zip(items, value, strict=True))
        return type(value)(items) if changed else value
    if isinstance(value, dict):
        pairs = [(made_safe(k), made_safe(v)) for k, v in value.items()]
        if all(nk is k and nv is v for (nk, nv), (k, v) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)
    return value


def safe_evidence(evidence: Evidence) -> Evidence:
    """The evidence as the report may render it: every string of every attempt made safe. The
    analysis reads it as it reads the files: names, digests and figures are untouched."""
    attempts = []
    for attempt in evidence.attempts:
        fields = {f.name: getattr(attempt, f.name) for f in dataclasses.fields(attempt)
                  if f.name != "path"}
        attempts.append(dataclasses.replace(attempt, **{k: made_safe(v) for k, v in fields.items()}))
    return Evidence(attempts)

