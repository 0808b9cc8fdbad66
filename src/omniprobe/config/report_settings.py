"""The settings of the probe and of its judges, and of the report: hosts.toml's [probe],
[structure] and [quality] (the probe's settings, the output-structure check's thresholds, how PSNR
compares with a baseline), and templates/report.toml (what the report is titled and cites)."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from omniprobe.config.fixtures import MAX_REFERENCE_PIXELS
from omniprobe.config.hosts_common import HostsTable, Issue
from omniprobe.config.strict import STRICT
from omniprobe.errors import InputError, problems_from_validation
from omniprobe.safe_io import load_toml


class ReportSettings(BaseModel):
    """templates/report.toml: the report's title and the issues it cites (in the upstream and the
    downstream tracker). They are the report's words, kept with its templates, not hosts.toml's:
    the cards in the title come from the hosts."""

    model_config = STRICT

    title: str
    downstream_repo: str
    serving_profile_issue: Issue
    topology_issue: Issue
    retention_issue: Issue
    upstream_issue: Issue
    earlier_probe_issue: Issue
    # Upstream requests for a host-memory spill path of the conditioning KV, as owner/repo#N.
    spill_requests: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#[0-9]+$")]]



def load_report_settings(path: str | Path) -> ReportSettings:
    """Load and check templates/report.toml; raise InputError naming the file and every key."""
    path = Path(path)
    try:
        return ReportSettings.model_validate(load_toml(path), strict=True)
    except ValidationError as exc:
        raise InputError(problems_from_validation(
            path, exc, lambda loc: f"key '{'.'.join(str(p) for p in loc)}'")) from None

class ProbeSettings(HostsTable):
    """hosts.toml [probe] (the serve probe itself is harness/serve/probe.py's ServeProbe)."""

    target_reference_count: int = Field(ge=1)
    max_reference_pixels: int = Field(
        default=MAX_REFERENCE_PIXELS, gt=0, le=MAX_REFERENCE_PIXELS,
        description="The most pixels a reference image may hold; a larger one is refused before "
                    "it is decoded or sent.")
    answer_host_ram_gib: list[Annotated[int, Field(gt=0, le=4096)]] = Field(
        default=[16, 32, 64], min_length=1,
        description="The host RAM sizes (GiB) the report answers for a card whose host's RAM is "
                    "not stated; chosen by omniprobe.")

    @field_validator("answer_host_ram_gib")
    @classmethod
    def _ascending(cls, sizes: list[int]) -> list[int]:
        if sizes != sorted(set(sizes)):
            raise ValueError(f"expected ascending sizes, each once; got {sizes}")
        return sizes


LAYOUT_PLACEHOLDERS = frozenset({"fixture", "source_name", "seed"})


class StructureChecks(HostsTable):
    """hosts.toml [structure]: the thresholds of the output-structure check (classify/imaging.py).

    Figures are on the 0-255 scale whatever the image's bit depth. The defaults are the values
    hosts.toml states; they apply where a table omits a key or no hosts.toml is found.
    """

    opaque_alpha: int = Field(
        default=255, ge=1, le=255, description="A pixel counts as opaque when its alpha is >= this."
    )
    min_opaque_fraction: float = Field(
        default=0.9, ge=0, le=1, description="Below this opaque fraction an image is broken."
    )
    flat_tile: int = Field(default=8, ge=2, description="Edge (px) of the flatness tiles.")
    flat_tolerance: int = Field(
        default=2, ge=0, le=255,
        description="A tile is near-constant when no RGB channel spans more than this many levels.",
    )
    max_flat_fraction: float = Field(
        default=0.98, ge=0, le=1,
        description="Above this fraction of near-constant tiles an image is broken (blank).",
    )
    min_rgb_std: float = Field(
        default=16, ge=0, le=255,
        description="Below this standard deviation of its RGB values an image is broken "
                    "(near-flat): the seed's collapse seen without alpha, which an RGB output "
                    "has, and whose grey noise no tile of the flatness check finds flat.",
    )


class QualitySettings(HostsTable):
    """hosts.toml [quality]: how `omniprobe quality` compares an attempt's images with a
    baseline's by PSNR (harness/common/quality.py). The defaults are the values hosts.toml
    states."""

    comparator: Literal["rgba", "rgb"] = Field(
        default="rgba", description="Channels PSNR compares; rgba is the seed report's comparator."
    )
    convert_modes: bool = Field(
        default=False,
        description="Compare images of different modes after converting both to RGBA; "
        "false: a mode mismatch is an error.",
    )
    baseline_layout: str = Field(
        default="{fixture}/{seed}.png",
        description="Path of a baseline image under the baseline folder; placeholders {fixture} "
        "(fixture id), {source_name} (the source's name for it) and {seed}.",
    )

    @field_validator("baseline_layout")
    @classmethod
    def _layout_placeholders(cls, layout: str) -> str:
        fields = [(name, spec, conversion) for _, name, spec, conversion
                  in string.Formatter().parse(layout) if name is not None]
        for name, spec, conversion in fields:
            if spec or conversion or not name:
                raise ValueError(f"baseline_layout placeholders are bare names such as {{seed}}, "
                                 f"without a format spec or conversion; got {layout!r}")
        names = {name for name, _, _ in fields}
        unknown = names - LAYOUT_PLACEHOLDERS
        if unknown:
            raise ValueError(f"baseline_layout uses unknown placeholder(s) {sorted(unknown)}; "
                             f"expected {sorted(LAYOUT_PLACEHOLDERS)}")
        if "seed" not in names or not names & {"fixture", "source_name"}:
            raise ValueError("baseline_layout must name {seed} and {fixture} or {source_name}, "
                             f"got {layout!r}")
        if Path(layout).is_absolute() or ".." in Path(layout).parts:
            raise ValueError(f"baseline_layout must stay inside the baseline folder, "
                             f"got {layout!r}")
        return layout
