"""hosts.toml's [cards.<name>]: a GPU a user may own, by the three figures its usable memory pool
comes from, each with its source. A card's usable pool is its memory.total less its own overhead
(the CUDA context and other memory outside torch's pool) less what the host's other processes
hold; the capacity search's bands are judged against it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from omniprobe.config.hosts_common import HostsTable, Mib, PositiveMib

# A card's name is read as one line of text (a report heading, a verdict): printable, and no
# longer than `host add` keeps a GPU name from NVML (chosen by omniprobe: the longest NVIDIA
# product name is well under half of it).
NAME_CHARS = 100


class FigureSource(HostsTable):
    """Where one of a card's figures comes from."""

    kind: Literal["nvml", "public-nvidia-smi", "assumed"] = Field(
        description="nvml: a real host's own reading; public-nvidia-smi: a published nvidia-smi "
                    "output of that card; assumed: omniprobe's assumption, until a real host "
                    "measures it.")
    where: str = Field(min_length=1, description="The reading, the page, or the assumption's "
                                                 "reasoning.")


def vram_off(total_mib: float, vram_gb: float) -> float:
    """How far a memory.total reading (MiB) lies from a marketed size (GB, read as GiB), as a
    fraction of that size: what [env.checks] vram_tolerance bounds."""
    return abs(total_mib / 1024 - vram_gb) / vram_gb


class Card(HostsTable):
    name: str = Field(min_length=1, max_length=NAME_CHARS,
                      description="e.g. 'RTX 3090'; one printable line.")
    vram_gb: int = Field(gt=0, le=1024, description="Marketed memory (GB), for the reader.")
    memory_total_mib: PositiveMib = Field(description="memory.total as NVML reports it.")
    memory_total_source: FigureSource
    overhead_mib: Mib = Field(description="The card's own memory outside torch's pool while a "
                                          "pipeline runs (CUDA context, loaded kernels).")
    overhead_source: FigureSource
    other_processes_mib: Mib = Field(description="What the host's other processes hold on it "
                                                 "(a desktop session).")
    other_processes_source: FigureSource

    @property
    def usable_pool_mib(self) -> int:
        return self.memory_total_mib - self.overhead_mib - self.other_processes_mib

    @property
    def assumed(self) -> tuple[str, ...]:
        """Each figure of the usable pool whose source is omniprobe's assumption, with its
        value (e.g. 'overhead 512 MiB')."""
        return tuple(f"{label} {getattr(self, f'{key}_mib'):,} MiB" for label, key in (
            ("memory.total", "memory_total"), ("overhead", "overhead"),
            ("other processes", "other_processes"))
            if getattr(self, f"{key}_source").kind == "assumed")

    @field_validator("name")
    @classmethod
    def _one_printable_line(cls, name: str) -> str:
        if not name.isprintable():  # a newline, a control or a bidi character
            raise ValueError("one line of printable characters (no control or bidi "
                             "characters), e.g. 'RTX 3090'")
        return name

    @model_validator(mode="after")
    def _a_pool_left(self):
        """Each figure lies within the card, and something is left for torch's pool: a pool of
        0 MiB would judge every band 'does not fit' from no figure of the card's."""
        for key in ("overhead_mib", "other_processes_mib"):
            if getattr(self, key) >= self.memory_total_mib:
                raise ValueError(f"{key} {getattr(self, key):,} MiB must lie below "
                                 f"memory_total_mib {self.memory_total_mib:,}")
        if self.usable_pool_mib <= 0:
            raise ValueError(f"the usable pool, memory_total_mib {self.memory_total_mib:,} less "
                             f"overhead_mib {self.overhead_mib:,} less other_processes_mib "
                             f"{self.other_processes_mib:,}, is {self.usable_pool_mib:,} MiB: "
                             "it must be more than 0")
        return self

    def total_problem(self, tolerance: float) -> str | None:
        """Why memory_total_mib is not this card's vram_gb, or None. The range is the one the
        env check holds NVML's reading of a host's GPU to ([env.checks] vram_tolerance of
        vram_gb read as GiB): a card's total is such a reading."""
        off = vram_off(self.memory_total_mib, self.vram_gb)
        if off <= tolerance:
            return None
        return (f"{self.memory_total_mib:,} MiB is {off:.0%} from vram_gb {self.vram_gb} "
                f"({self.vram_gb * 1024:,} MiB): expected within "
                f"{tolerance:.0%} ([env.checks] vram_tolerance, as the env check holds NVML's "
                "total)")
