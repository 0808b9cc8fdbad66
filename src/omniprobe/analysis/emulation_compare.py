"""An emulated host beside the host it emulates: what transfers, and cell by cell, whether they agree.

Capacity transfers from the physical GPU to the emulated card; the kernels do not when the two
compute capabilities differ, and with them speed and output structure may not either. Cells are
compared at the emulated card's own capacity only (a sweep's other caps answer another question).
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.summaries import ServeRunView, run_views
from omniprobe.config.fixtures import FixtureSuite
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import Evidence
from omniprobe.evidence.models.runs import Cell, InitResult

# Below this compute capability a GPU has no FP8 tensor cores: vLLM serves FP8 weights there with a
# weight-only W8A16 kernel (Marlin, as on the seed report's 3090) where sm_89+ runs native FP8.
FP8_NATIVE_CC = (8, 9)


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class TransferCaveat:
    emulated_cc: str
    physical_cc: str
    kernels_match: bool
    fp8_path_differs: bool
    simulated_card: bool

    @property
    def text(self) -> str:
        if self.simulated_card:
            return ("The emulated card is simulated: the capacity model's memory transfers, "
                    "nothing about kernels or output structure does.")
        if self.kernels_match:
            return (f"Both are compute capability {self.emulated_cc}: the same kernels run, so "
                    "capacity and output structure transfer, within what the guard checks.")
        text = (f"Compute capability {self.emulated_cc} (the emulated card) against "
                f"{self.physical_cc} (the physical GPU): capacity transfers; kernel paths, and "
                "therefore speed and output structure, may not.")
        if self.fp8_path_differs:
            text += (f" FP8 weights in particular: below compute capability "
                     f"{FP8_NATIVE_CC[0]}.{FP8_NATIVE_CC[1]} they run through a weight-only "
                     "W8A16 (Marlin) kernel that the physical GPU does not take, so fp8 cells "
                     "say nothing about the emulated card's fp8 output.")
        return text


def transfer_caveat(hosts: HostsConfig, host_name: str) -> TransferCaveat:
    """The caveat of an emulated host, from its card's and its physical GPU's compute capability."""
    host = hosts.host(host_name)
    if host.emulation is None:
        raise ValueError(f"host {host_name!r} is not emulated")
    card = hosts.host(host.emulation.emulates) if host.emulation.emulates else None
    emulated_cc = card.compute_capability if card else "unknown"
    physical_cc = host.compute_capability
    simulated = bool(card and card.simulated)
    known = card is not None and not simulated
    fp8_differs = known and ((_cc(emulated_cc) < FP8_NATIVE_CC)
                             != (_cc(physical_cc) < FP8_NATIVE_CC))
    return TransferCaveat(emulated_cc, physical_cc, known and emulated_cc == physical_cc,
                          fp8_differs, simulated)


def quantizes_fp8(hosts: HostsConfig, flag_set: str) -> bool:
    args = hosts.flag_sets[flag_set].args
    return any(a == "--quantization" and v.startswith("fp8")
               for a, v in zip(args, args[1:], strict=False))


@dataclass(frozen=True)
class CellPair:
    flag_set: str
    fixture: str
    reference_count: int
    emulated: Cell
    real: Cell
    kernel_caveat: bool  # the fp8 path differs between the two cards

    @staticmethod
    def fits(cell: Cell) -> bool:
        return cell.outcome == "ok" and cell.emulation_breach is None

    @property
    def capacity_agrees(self) -> bool:
        return self.fits(self.emulated) == self.fits(self.real)

    @property
    def structure_agrees(self) -> bool | None:
        """None unless both produced output that was checked."""
        if not (self.fits(self.emulated) and self.fits(self.real)):
            return None
        if "unchecked" in (self.emulated.structure, self.real.structure):
            return None
        return self.emulated.structure == self.real.structure


@dataclass(frozen=True)
class InitPair:
    """How the server's start ended under one flag set, on both hosts."""

    flag_set: str
    emulated: InitResult
    real: InitResult

    @property
    def agrees(self) -> bool:
        return self.emulated.outcome == self.real.outcome


def _latest_cells(views: list[ServeRunView]) -> dict[tuple[str, str], Cell]:
    cells = {}
    for view in sorted(views, key=lambda v: v.attempt.id):
        for cell in view.cells:
            cells[view.flag_set, cell.fixture] = cell
    return cells


def _views(hosts: HostsConfig, host_name: str,
           evidence: Evidence) -> tuple[list[ServeRunView], list[ServeRunView]]:
    """The emulated host's runs at its own cap, and the runs of the host it emulates."""
    host = hosts.host(host_name)
    target = host.emulation.emulates if host.emulation else None
    if target is None:
        return [], []
    cap = hosts.emulated_cap_mib(host_name)
    emulated = [v for a in evidence.for_host(host_name, include_simulated=host.simulated,
                                             include_emulated=True)
                if a.emulated and a.meta.provenance.cap_mib == cap for v in run_views(a)]
    real = [v for a in evidence.for_host(target, include_simulated=hosts.host(target).simulated)
            for v in run_views(a)]
    return emulated, real


def compare_inits(hosts: HostsConfig, host_name: str, evidence: Evidence) -> list[InitPair]:
    """Every flag set started on both hosts: the newest start of each side."""
    emulated, real = _views(hosts, host_name, evidence)

    def latest(views: list[ServeRunView]) -> dict[str, InitResult]:
        return {v.flag_set: v.run.init for v in sorted(views, key=lambda v: v.attempt.id)}

    mine, theirs = latest(emulated), latest(real)
    return [InitPair(flag_set, mine[flag_set], theirs[flag_set])
            for flag_set in hosts.host(host_name).serve_flag_sets
            if flag_set in mine and flag_set in theirs]


def compare_cells(hosts: HostsConfig, host_name: str, fixtures: FixtureSuite,
                  evidence: Evidence) -> list[CellPair]:
    """Every flag set and fixture with a cell on both the emulated host (at its own cap) and the
    host it emulates (the newest attempt of each speaks)."""
    host = hosts.host(host_name)
    emulated, real = _views(hosts, host_name, evidence)
    mine, theirs = _latest_cells(emulated), _latest_cells(real)
    fp8_differs = transfer_caveat(hosts, host_name).fp8_path_differs
    order = {name: i for i, name in enumerate(host.serve_flag_sets)}
    pairs = [CellPair(flag_set, fixture, fixtures.get(fixture).reference_count, cell,
                      theirs[flag_set, fixture],
                      fp8_differs and quantizes_fp8(hosts, flag_set))
             for (flag_set, fixture), cell in mine.items() if (flag_set, fixture) in theirs]
    return sorted(pairs, key=lambda p: (order.get(p.flag_set, len(order)), p.reference_count,
                                        p.fixture))
