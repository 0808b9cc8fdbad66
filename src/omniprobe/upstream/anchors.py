"""Code citations of the evidence, looked up in an upstream source: does each still hold at its
lines, has it moved (where to), changed, gone, or is its file absent from that version?

A citation is found by its anchor: the symbol it lies in (the anchor's, or the citation's
`function` where that is a Python name), a snippet of the cited code, or the digest of the cited
lines. A citation with none of these can only be told present or absent: 'unanchored'.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass

from omniprobe.evidence.load import LoadedAttempt
from omniprobe.evidence.models.common import CodeRef
from omniprobe.evidence.upstream import Anchor, CitationState, UpstreamSource
from omniprobe.upstream import code
from omniprobe.upstream.source import Source

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Citation:
    cited_in: str
    ref: CodeRef


def citations(attempts: list[LoadedAttempt]) -> list[Citation]:
    """Every code citation in the evidence (code reads, OOM frames), each distinct one once."""
    found: list[Citation] = []

    def add(where: str, ref: CodeRef | None) -> None:
        if ref is not None and not any(c.ref == ref for c in found):
            found.append(Citation(where, ref))

    for a in attempts:
        base = f"{a.host}/{a.id}"
        for i, loc in enumerate(a.code_read):
            add(f"{base}/code-read.json $[{i}].ref", loc.ref)
        for i, run in enumerate(a.runs):
            add(f"{base}/runs.json $[{i}].init.oom.location", run.init.oom and run.init.oom.location)
            for j, cell in enumerate(run.cells):
                add(f"{base}/runs.json $[{i}].cells[{j}].oom.location",
                    cell.oom and cell.oom.location)
        for i, run in enumerate(a.offline):
            init_oom = run.init.oom if run.init is not None else None
            add(f"{base}/offline.json $[{i}].init.oom.location", init_oom and init_oom.location)
            for j, cell in enumerate(run.cells):
                add(f"{base}/offline.json $[{i}].cells[{j}].oom.location",
                    cell.oom and cell.oom.location)
        for name, records in (("requests.json", a.requests),
                              ("offline-requests.json", a.offline_requests)):
            for i, record in enumerate(records):
                add(f"{base}/{name} $[{i}].oom.location", record.oom and record.oom.location)
    return found


def lines_digest(lines: list[str]) -> str:
    """sha256 of lines, each stripped (indentation and trailing space do not count)."""
    return hashlib.sha256("\n".join(line.strip() for line in lines).encode()).hexdigest()


def parse_lines(lines: str | None) -> tuple[int, int] | None:
    """'1204-1207' -> (1204, 1207); '293' and '1034ff' -> a one-line window."""
    if not lines:
        return None
    match = re.match(r"^(\d+)(?:-(\d+))?(ff)?$", lines)
    if not match:
        return None
    start = int(match.group(1))
    return start, int(match.group(2) or start)


def anchor_of(ref: CodeRef) -> Anchor:
    anchor = ref.anchor or Anchor()
    if anchor.symbol is None and ref.function and _IDENTIFIER.match(ref.function):
        anchor = anchor.model_copy(update={"symbol": ref.function})
    return anchor


def _span(found: code.Found) -> tuple[int, int]:
    node = found.node
    assert isinstance(node, ast.AST)
    return node.lineno, getattr(node, "end_lineno", node.lineno) or node.lineno


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _text(span: tuple[int, int]) -> str:
    return f"{span[0]}" if span[0] == span[1] else f"{span[0]}-{span[1]}"


def _snippet_lines(file_lines: list[str], snippet: str) -> list[int]:
    needle = " ".join(snippet.split())
    return [i for i, line in enumerate(file_lines, 1) if needle in " ".join(line.split())]


def locate(source: Source, citation: Citation) -> CitationState:
    ref = citation.ref
    state = {"cited_in": citation.cited_in, "file": ref.file, "lines": ref.lines}
    candidates = source.resolve(ref.file)
    if not candidates:
        return CitationState(**state, status="absent",
                             detail="no such file in this version")
    anchor = anchor_of(ref)
    window = parse_lines(ref.lines)
    # Prefer the candidate where the anchor is found (a bare file name can match several).
    results = [_locate_in(source, path, anchor, window) for path in candidates]
    best = next((r for r in results if r[0] in ("holds", "moved")), results[0])
    status, path, found_lines, detail = best
    if len(candidates) > 1:
        detail += f" ({len(candidates)} files match the cited path)"
    return CitationState(**state, status=status, found_file=path, found_lines=found_lines,
                         detail=detail)


def _locate_in(source: Source, path: str, anchor: Anchor,
               window: tuple[int, int] | None) -> tuple[str, str, str | None, str]:
    file_lines = source.lines(path)
    if anchor.symbol is None and anchor.snippet is None and anchor.lines_sha256 is None:
        return "unanchored", path, None, "the file is present; the citation has no anchor to check"
    if anchor.lines_sha256 and window:
        size = window[1] - window[0]
        if lines_digest(file_lines[window[0] - 1:window[1]]) == anchor.lines_sha256:
            return "holds", path, _text(window), "the cited lines read as anchored"
        for start in range(1, len(file_lines) - size + 1):
            if lines_digest(file_lines[start - 1:start + size]) == anchor.lines_sha256:
                span = (start, start + size)
                return "moved", path, _text(span), f"the cited lines now stand at {_text(span)}"
    spans = [_span(f) for f in code.defs(source, path, anchor.symbol)] if anchor.symbol else None
    hits = _snippet_lines(file_lines, anchor.snippet) if anchor.snippet else None
    if hits is not None and spans is not None:
        hits = [h for h in hits if any(s[0] <= h <= s[1] for s in spans)]
    places = [(h, h) for h in hits] if hits is not None else spans or []
    what = " and ".join(filter(None, (anchor.symbol and f"`{anchor.symbol}`",
                                      anchor.snippet and f"`{anchor.snippet}`")))
    if not places:
        if anchor.lines_sha256 or (spans and hits == []):
            return "changed", path, _text(spans[0]) if spans else None, (
                f"{what} no longer reads as cited" if not spans
                else f"`{anchor.symbol}` is there but the cited code is not")
        return "gone", path, None, f"{what} is not in the file"
    if window is None or any(_overlaps(p, window) for p in places):
        at = next((p for p in places if window is None or _overlaps(p, window)), places[0])
        return "holds", path, _text(at), f"{what} at the cited lines"
    return "moved", path, _text(places[0]), f"{what} now at {_text(places[0])}"


def source_record(source: Source) -> UpstreamSource:
    ident = source.identity
    return UpstreamSource(package=ident.package.replace("_", "-"), kind=ident.kind,
                          version=ident.version, commit=ident.commit, sha256=ident.sha256)
