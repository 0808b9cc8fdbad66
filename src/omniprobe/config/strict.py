"""The one pydantic configuration of every file format's models: an unknown key is refused, a
loaded model is frozen, and no float is inf or NaN (loaders parse strictly besides: no coercion of
"8091" or true to an int)."""

from __future__ import annotations

from pydantic import ConfigDict

STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
