"""The offline runner's results file, read as it grows (one JSON line per event), each event
validated as it arrives by the strict model of its kind (the protocol of
harness/offline/runner.py's docstring), and each request result checked against the request
expected next."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from omniprobe.errors import HarnessError
from omniprobe.evidence.models.offline import DiffusersBuild
from omniprobe.harness.offline.plan import (
    PlannedRequest,
)
from omniprobe.limits import MAX_BYTES, MAX_MIB, MAX_WAIT_S
from omniprobe.safe_io import json_loads


class RunnerProtocolError(HarnessError):
    """The runner wrote something the protocol does not allow."""


# The runner's own words (errors, tracebacks) are kept to the tails the runner itself cuts.
Text = Annotated[str, Field(max_length=100_000)] | None
Seconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
Mib = Annotated[float, Field(ge=0, le=MAX_MIB)]
PoolMib = Annotated[int, Field(gt=0, le=MAX_MIB)]
Outcome = Literal["ok", "oom", "error"]


class _Event(BaseModel):
    # Strict: no "12" taken for 12, no true for 1, no NaN or Infinity, no key the protocol lacks.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class _Result(_Event):
    """What a request and a trial both report: the outcome, the wall, the peak, the runner's
    own words of a failure, and what else it measured (figures only, each within a TiB)."""

    outcome: Outcome
    wall_s: Seconds
    started_s: Seconds | None = None
    peak_mib: Mib | None = None
    peak_source: str | None = None
    error: Text = None
    traceback: Text = None
    measured: dict[str, Any] = {}

    @field_validator("measured")
    @classmethod
    def _figures(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, figure in value.items():
            if figure is not None and (isinstance(figure, bool)
                                       or not isinstance(figure, int | float)
                                       or not 0 <= figure <= MAX_BYTES):  # NaN fails this too
                raise ValueError(f"measured[{key!r}]: expected a number from 0 to {MAX_BYTES} "
                                 f"or null, got {figure!r}")
        return value


class InitEvent(_Event):
    event: Literal["init"]
    outcome: Literal["ready", "oom", "error"]
    wall_s: Seconds
    error: Text = None
    traceback: Text = None
    survives_failure: bool = False
    facts: dict[str, Any] | None = None  # the build's figures: DiffusersBuild checks them
    emulation: dict[str, Any] | None = None


class RequestEvent(_Result):
    event: Literal["request"]
    id: str
    fixture: str
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)]
    image: str | None = None


class TrialEvent(_Result):
    event: Literal["trial"]
    references: Annotated[int, Field(ge=0)]
    fixture: str
    limit_mib: PoolMib
    phase: str
    repeat: bool


class BandEvent(_Event):
    event: Literal["band"]
    references: Annotated[int, Field(ge=0)]
    fixture: str
    fits_at_mib: PoolMib | None
    fails_at_mib: PoolMib | None
    fails_at_inferred: bool = False
    trials: Annotated[int, Field(ge=0)]
    requests_saved: int
    stopped: Literal["error"] | None = None


class ClosedEvent(_Event):
    event: Literal["closed"]
    after: str


class DoneEvent(_Event):
    event: Literal["done"]


RunnerEvent = Annotated[InitEvent | RequestEvent | TrialEvent | BandEvent | ClosedEvent
                        | DoneEvent, Field(discriminator="event")]
_EVENT = TypeAdapter(RunnerEvent)
EVENT_KINDS = ("init", "request", "trial", "band", "closed", "done")


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


# What a runner's request result may carry beyond the protocol's own fields.
RESULT_MEASURES = ("peak_allocated_mib", "start_allocated_mib", "kv_cache_bytes", "kv_cache_layers",
             "kv_cache_layers_total", "prefix_tokens", "prompt_text_tokens", "max_rss_mib",
             "host_peak_mib", "host_end_mib", "pinned_host_peak_mib", "process_mib",
             "outside_pool_mib")


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
