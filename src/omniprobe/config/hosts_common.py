"""What every table of hosts.toml shares: the strict base model and the bounded numbers."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from omniprobe.config.strict import STRICT
from omniprobe.limits import MAX_ISSUE, MAX_MIB


class HostsTable(BaseModel):
    # Strict when loaded (load_hosts): no coercion of "8091" or true to an int; finite floats.
    model_config = STRICT


Issue = Annotated[int, Field(ge=1, le=MAX_ISSUE)]
# A simulated capacity, size or cap in MiB: at most 2**40 bytes (omniprobe.limits).
Mib = Annotated[int, Field(ge=0, le=MAX_MIB)]
PositiveMib = Annotated[int, Field(gt=0, le=MAX_MIB)]
