"""The capacity search's cost per curve (target: a whole leaf-offload curve, 0-4 references,
band and build included, within 4 GPU-minutes on the H200 at the capacity profiles' steps).

Two figures per profile of the newest committed search:
- measured: the curve's GPU seconds as its evidence holds them (capacity.json `gpu_s`, the
  runner's wall from start to its last band, the build included), with its trials and the mean
  wall of a trial;
- the rule's own count: trials the search takes on the committed bands' boundaries with no noise,
  with and without the earlier counts' bounds (what `requests_saved` counts), so a change to the
  rule shows here before it costs GPU time.

    PYTHONPATH=src python benchmarks/capacity_search.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from omniprobe.analysis.capacity_bands import newest_searches, searched_configs
from omniprobe.config.project import Project
from omniprobe.evidence.validate import load_valid_project
from omniprobe_engine.search import FIT, OOM, Grid, next_guess_mib, search

TARGET_S = 240


def rule_trials(grid: Grid, repeats: int, needs: list[int | None], bounded: bool) -> int:
    """Trials over one curve on noiseless boundaries `needs` (by count)."""
    total, found, known = 0, [], None
    for need in needs:
        def oracle(limit: int, phase: str, repeat: bool, need=need) -> str:
            return FIT if need is not None and limit >= need else OOM

        band = (search(oracle, grid, repeats, fail_hint_mib=known,
                       first_guess_mib=next_guess_mib(found, grid.resolution_mib))
                if bounded else search(oracle, grid, repeats))
        total += len(band.trials)
        if band.fits_at_mib is not None:
            found.append(band.fits_at_mib)
        if band.fails_at_mib is not None:
            known = band.fails_at_mib
    return total


def main() -> int:
    loaded = load_valid_project(Project(Path(__file__).resolve().parents[1]))
    # Each model the searches built (an attempt records its configs folder), its profiles apart.
    folders = searched_configs(loaded.evidence)
    searches = {f"{profile} ({folder})" if len(folders) > 1 else profile: found
                for folder in folders
                for profile, found in newest_searches(loaded.evidence, folder).items()}
    name_w = max((len(p) for p in searches), default=7)
    print(f"{'profile':<{name_w}} {'GPU s':>6} {'trials':>6} {'s/trial':>7} {'rule':>5} "
          f"{'alone':>5}  within {TARGET_S} s")
    for profile, found in searches.items():
        s = found.search
        grid = Grid(s.search.floor_mib, s.search.ceiling_mib, s.search.resolution_mib)
        walls = [t.wall_s for t in found.trials]
        needs = [b.fits_at_mib for b in sorted(s.bands, key=lambda b: b.reference_count)]
        started = time.perf_counter()
        bounded = rule_trials(grid, s.search.repeats, needs, True)
        alone = rule_trials(grid, s.search.repeats, needs, False)
        rule_ms = (time.perf_counter() - started) * 1000
        print(f"{profile:<{name_w}} {s.gpu_s or 0:>6.0f} {len(walls):>6} "
              f"{statistics.mean(walls) if walls else 0:>7.2f} {bounded:>5} {alone:>5}  "
              f"{'yes' if s.gpu_s and s.gpu_s <= TARGET_S else 'no'} (rule {rule_ms:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
