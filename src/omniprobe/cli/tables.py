"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # image-check uses these tables without loading the PSNR command
    from omniprobe.harness.common.quality import QualityResult


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart; the last column is not padded."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


def psnr_summary(result: QualityResult) -> str:
    """What `omniprobe quality` prints: the PSNR rows as a table, then the determinism groups."""
    rows = [[r.flag_set, r.fixture, ", ".join(map(str, r.seeds)),
             "identical" if r.identical else f"{r.psnr_db.min:.2f}", r.comparator, r.structure]
            for r in result.rows]
    headers = ["flag set", "fixture", "seed", "psnr (dB)", "comparator", "structure"]
    lines = [f"attempt {result.attempt.id} against baseline {result.rows[0].baseline_attempt}",
             text_table(headers, rows)]
    lines += [f"refused: {problem.message}" for problem in result.refused]
    if result.groups:
        lines.append("determinism (pixel hash):")
        lines += [f"  {g.fixture} seed {g.seed}: "
                  f"{'identical' if g.identical else 'differ'} across {', '.join(g.flag_sets)}"
                  + (f" ({g.sha256_prefix[:12]})" if g.identical else "")
                  for g in result.groups]
    else:
        lines.append("determinism: no fixture and seed ran under two or more flag sets")
    return "\n".join(lines)
