"""hosts.toml's [cards.<name>]: a GPU a user may own, by the three figures its usable memory pool
comes from, each with its source. A card's usable pool is its memory.total less its own overhead
(the CUDA context and other memory outside torch's pool) less what the host's other processes
hold; the capacity search's bands are judged against it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniprobe.config.hosts_common import HostsTable, Mib, PositiveMib


class FigureSource(HostsTable):
    """Where one of a card's figures comes from."""

    kind: Literal["nvml", "public-nvidia-smi", "assumed"] = Field(
        description="nvml: a real host's own reading; public-nvidia-smi: a published nvidia-smi "
                    "output of that card; assumed: omniprobe's assumption, until a real host "
                    "measures it.")
    where: str = Field(min_length=1, description="The reading, the page, or the assumption's "
                                                 "reasoning.")


class Card(HostsTable):
    name: str = Field(min_length=1, description="e.g. 'RTX 3090'.")
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
