"""The offline runner's results file, read as it grows (one JSON line per event), each event
validated as it arrives, and each request result checked against the request expected next.

The events are omniprobe_engine/protocol.py's dataclasses; each model here is made from one of
them, field for field, with the harness's bounds on the fields that take one (`_model`). A field
the protocol lacks, an unknown event or a figure Measures does not declare is refused."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from omniprobe.errors import HarnessError
from omniprobe.evidence.models.offline import DiffusersBuild
from omniprobe.harness.offline.plan import PlannedRequest
from omniprobe.limits import MAX_BYTES, MAX_MIB, MAX_WAIT_S
from omniprobe.safe_io import json_loads
from omniprobe_engine import protocol


class RunnerProtocolError(HarnessError):
    """The runner wrote something the protocol does not allow."""


# The runner's own words (errors, tracebacks) are kept to the tails the runner itself cuts.
Text = Annotated[str, Field(max_length=100_000)] | None
Seconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
Mib = Annotated[float, Field(ge=0, le=MAX_MIB)]
PoolMib = Annotated[int, Field(gt=0, le=MAX_MIB)]
Count = Annotated[int, Field(ge=0)]


class _Event(BaseModel):
    # Strict: no "12" taken for 12, no true for 1, no NaN or Infinity, no key the protocol lacks.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _model(shape: type, bounds: dict[str, Any]) -> type[_Event]:
    """The strict model of a protocol dataclass: its fields, types and defaults, each field
    named in `bounds` taking that type instead; the event's kind is required."""
    hints = typing.get_type_hints(shape)
    unknown = set(bounds) - set(hints)
    if unknown:
        raise TypeError(f"bounds for {shape.__name__} name no field of it: {sorted(unknown)}")
    fields = {}
    for f in dataclasses.fields(shape):
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else ...)
        fields[f.name] = (bounds.get(f.name, hints[f.name]), ... if f.name == "event" else default)
    return create_model(shape.__name__, __base__=_Event, **fields)


def _figure(hint: Any) -> Any:
    """A Measures field's type, bounded: a count or a size from 0 to a TiB, or null."""
    number = next(t for t in typing.get_args(hint) if t is not type(None))
    return Annotated[number, Field(ge=0, le=MAX_BYTES)] | None


Measured = _model(protocol.Measures, {name: _figure(hint) for name, hint
                                      in typing.get_type_hints(protocol.Measures).items()})
_RESULT = {"wall_s": Seconds, "started_s": Seconds | None, "peak_mib": Mib | None,
           "error": Text, "traceback": Text, "measured": Measured}
_BOUNDS: dict[str, dict[str, Any]] = {
    "init": {"wall_s": Seconds, "error": Text, "traceback": Text},
    "request": {**_RESULT, "seed": Annotated[int, Field(ge=0, le=2**32 - 1)]},
    "trial": {**_RESULT, "reference_count": Count, "limit_mib": PoolMib},
    "speed": {**_RESULT, "reference_count": Count, "limit_mib": PoolMib,
              "num_inference_steps": Annotated[int, Field(ge=1, le=1000)]},
    "band": {"reference_count": Count, "fits_at_mib": PoolMib | None,
             "fails_at_mib": PoolMib | None, "trials": Count},
    "closed": {},
    "done": {},
}
MODELS = {kind: _model(shape, _BOUNDS[kind]) for kind, shape in protocol.EVENTS.items()}
_EVENT = TypeAdapter(Annotated[typing.Union[tuple(MODELS.values())],  # noqa: UP007
                               Field(discriminator="event")])
EVENT_KINDS = tuple(protocol.EVENTS)


def validated_event(event: object, path: Path) -> dict:
    """`event` if the protocol allows it, else RunnerProtocolError naming the event, the field
    and what was expected."""
    if not isinstance(event, dict) or event.get("event") not in EVENT_KINDS:
        kind = event.get("event") if isinstance(event, dict) else type(event).__name__
        raise RunnerProtocolError(f"{path}: an event of kind {kind!r}: expected one of "
                                  f"{', '.join(EVENT_KINDS)}")
    try:
        _EVENT.validate_python(event)
    except ValidationError as exc:  # its first location is the event's kind, the union's tag
        raise protocol_broken(path, event["event"], exc, skip=1) from None
    return event


def protocol_broken(path: Path, kind: str, exc: ValidationError, *, within: str = "",
                    skip: int = 0) -> RunnerProtocolError:
    """The error for a runner's `kind` event that fails its model: the field (under `within`,
    its first `skip` locations left out), what was expected and what came."""
    first = exc.errors()[0]
    field = ".".join([within, *map(str, first["loc"][skip:])] if within
                     else map(str, first["loc"][skip:])) or "(the event)"
    return RunnerProtocolError(
        f"{path}: the runner's {kind!r} event, field {field!r}: {first['msg'][:1].lower()}"
        f"{first['msg'][1:]} (got {str(first.get('input'))[:80]!r}); the runner broke the "
        "protocol")


class RunnerEvents:
    """The runner's results file, read as it grows; a line counts once it is complete."""

    def __init__(self, path: Path):
        self.path, self._offset, self._partial = path, 0, b""
        self._queue: list[dict] = []

    def next(self) -> dict | None:
        if not self._queue:
            self._read()
        return validated_event(self._queue.pop(0), self.path) if self._queue else None

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in filter(bytes.strip, lines):
            try:
                event = json_loads(line)
            except ValueError:
                raise RunnerProtocolError(f"{self.path}: not a JSON line: {line[:200]!r}") from None
            self._queue.append(event)


def closed_reason(event: dict) -> str:
    """Why a runner's engine closed ('closed' event): its own words, else after what."""
    return event.get("reason") or f"closed after {event['after']}"


def check_result(event: dict, planned: PlannedRequest, path: Path) -> None:
    """A request result (validated_event checked its fields) for the request expected next."""
    if event["event"] != "request" or event["id"] != planned.id:
        raise RunnerProtocolError(f"{path}: expected the result of {planned.id!r}, got the "
                                  f"runner's {event['event']!r} event {str(event)[:200]}")


def build_facts(event: dict, path: Path) -> DiffusersBuild | None:
    """An init event's facts as the build record they claim to be (None: it reported none)."""
    if not event.get("facts"):
        return None
    try:
        return DiffusersBuild.model_validate(event["facts"])
    except ValidationError as exc:
        raise protocol_broken(path, "init", exc, within="facts") from None


def after_last_event(log: str) -> str:
    """The log after the runner's last echoed result line: what the lost request left there."""
    at = log.rfind('{"event": ')
    return log if at < 0 else log[at:].partition("\n")[2]
