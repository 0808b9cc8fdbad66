"""hosts.toml's [published_figures.<name>]: what others publish of a model's GPU memory, kept
beside omniprobe's bands and never counted as a measurement: who said it, how they got it, the
sentence as written, and the conditions it holds under (each of which may differ from a
capacity search's)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniprobe.config.hosts_common import HostsTable

OBTAINED = {
    "claim": "a claim, its method not given",
    "benchmark": "a benchmark, its method not given",
    "ci-measurement": "measured in continuous integration",
    "estimate": "an estimate",
}


class PublishedFigure(HostsTable):
    model: str = Field(min_length=1, max_length=100,
                       description="The model, as its folder's model.json names it.")
    value: float = Field(gt=0)
    unit: Literal["GB", "MB"] = Field(description="As written (GB and MB as published: whether "
                                                  "10^9 or 2^30 bytes is not said).")
    approximate: bool = Field(default=False, description="Written as approximate (~).")
    quote: str = Field(min_length=1, description="The sentence as the source writes it.")
    publisher: str = Field(min_length=1)
    source: str = Field(min_length=1, description="A repository file at a commit, or a page.")
    read: Literal["primary", "copy"] = Field(
        description="primary: omniprobe read the source itself; copy: a copy or quotation of it "
                    "(the source was out of reach).")
    obtained: Literal["claim", "benchmark", "ci-measurement", "estimate"]
    conditions: str = Field(min_length=1, description="What it was run or said under, and what "
                                                      "it does not state.")

    def text(self) -> str:
        """The figure as published: '~13 GB'."""
        return f"{'~' if self.approximate else ''}{self.value:,g} {self.unit}"
