"""The model field for a path that a configuration or evidence file names."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from omniprobe.safe_io import relative_inside

# Relative to its folder (fixtures/, deploy/, artifacts/), never climbing out; `confine` resolves
# it at use.
InsidePath = Annotated[str, AfterValidator(relative_inside)]
