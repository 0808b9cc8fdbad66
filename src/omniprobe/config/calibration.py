"""hosts.toml's [calibrations.<name>]: a real Diffusers run the seed reports, held against the
emulation of its card (issue 32). The emulation is only as good as its agreement with the real
runs it can be held against, so each names the emulated host that stands for the card, the
profile closest to the real run, a grid of profiles around it, and what the seed leaves unknown.
The real run's outcome is never written here: it is read from the card's evidence (a figure the
seed states, or the sealed baseline's walls)."""

from __future__ import annotations

from pydantic import Field, model_validator

from omniprobe.config.hosts_common import HostsTable
from omniprobe.config.names import Name


class Calibration(HostsTable):
    description: str = Field(min_length=1, description="The real run, in words.")
    emulated_host: Name = Field(description="The host that emulates the real run's card; its "
                                            "emulation's cards and host RAM are the real ones'.")
    figure: str | None = Field(
        default=None, min_length=1,
        description="The key of the card's figure that states the real run's reference count "
                    "(e.g. diffusers_ceiling_references).")
    ceiling: bool = Field(
        default=False, description="The seed calls the figure a ceiling: no more references ran. "
                                   "Whether it tried more is not stated, so larger counts are "
                                   "shown, never read as agreeing or not.")
    baseline_attempt: str | None = Field(
        default=None, min_length=1,
        description="The seed's sealed baseline attempt whose walls are the real run's; its "
                    "largest fixture gives the reference count.")
    closest: Name = Field(description="The Diffusers profile closest to the real run.")
    grid: list[Name] = Field(
        min_length=1, description="The profiles held against it, each shown with its outcome.")
    unknown: list[str] = Field(
        default=[], description="The real run's settings the seed does not state.")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.figure is None) == (self.baseline_attempt is None):
            raise ValueError("name exactly one of figure or baseline_attempt: where the real "
                             "run's reference count is read")
        if self.ceiling and self.figure is None:
            raise ValueError("ceiling = true reads a figure: set figure, not baseline_attempt")
        return self
