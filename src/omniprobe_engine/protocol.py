"""Everything that crosses the process boundary between the harness and the runner, declared once.

The harness writes the runner's work (a RequestSpec list, or a SearchSpec) as JSON files and
reads back one JSON line per event (the *Event classes); `--versions` prints a VersionsAnswer.
Both sides import these plain dataclasses: the runner builds its events from them, and the
harness (omniprobe/harness/offline/runner_events.py) validates each line against a model made
from the same fields, adding its bounds. A line with a field these classes lack is refused there.

What an engine measures of one request is `Measures`. A request result keeps every figure
(offline-requests.json); a capacity trial keeps TRIAL_CARRIES and drops TRIAL_DROPS, each drop
with its reason; a test holds the two to cover Measures exactly.

Standard library only: the runner imports it in the probe env, the Diffusers env and a GPU
machine's own Python, none of which need have omniprobe.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal

# The emulation hook's (it stands alone in a server's processes, so it keeps the definition).
from omniprobe_engine.emulation_site.sitecustomize import CAP_ENV

__all__ = ["CAP_ENV"]  # re-exported: the runner and the harness read the cap's variable here

# A capacity trial's pool limit, published in the runner's environment: on the CPU there is no
# pool to cap, and a test double of the pipeline reads it there.
POOL_LIMIT_ENV = "OMNIPROBE_POOL_LIMIT_MIB"

# --- vLLM-Omni's offline engine (omni.py); omniprobe/protocol.py hands these to the upstream checks

# The keywords the Omni engine passes OmniDiffusionSamplingParams, each the request's field.
SAMPLING_PARAMS = ("height", "width", "seed", "num_inference_steps", "true_cfg_scale")
# The request output's field it reads the diffusion worker's peak from.
OUTPUT_PEAK = "peak_memory_mb"

# A request starts clean when torch holds at most this much more than it did after the build:
# what a recovered failure may leave in the allocator (chosen by omniprobe; a failed request's
# leftover measured on the H200 was 1,838-3,549 MiB, a fit's start about 37).
CLEAN_TOLERANCE_MIB = 128
TRACEBACK_CHARS = 20000  # the tail of a traceback the runner keeps: the OOM and frames near it
ERROR_CHARS = 2000  # the head of an exception's message it keeps

InitOutcome = Literal["ready", "oom", "error"]
ResultOutcome = Literal["ok", "oom", "error"]
TrialOutcome = Literal["fit", "oom", "error"]  # the search's word for a result
Phase = Literal["bracket", "bisect", "confirm"]


# --- what the harness hands the runner ------------------------------------------------------------


class SpecError(ValueError):
    """A spec file's object that is not the protocol's: the fields it lacks or has too many of."""


def _checked(shape: type, data: Any) -> dict:
    """`data` if it has every required field of `shape` and no other; else SpecError."""
    if not isinstance(data, dict):
        raise SpecError(f"expected a JSON object ({shape.__name__}), got {type(data).__name__}")
    names = [f.name for f in fields(shape)]
    missing = [f.name for f in fields(shape) if f.name not in data
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise SpecError(f"lacks {', '.join(missing)}")
    unknown = [key for key in data if key not in names]
    if unknown:
        raise SpecError(f"has {', '.join(map(str, unknown))}, which {shape.__name__} lacks")
    return data


@dataclass(frozen=True)
class RequestSpec:
    """One request: `reference_paths` are the reference images' files, in order."""

    id: str
    fixture: str
    seed: int
    prompt: str
    width: int
    height: int
    reference_paths: list[str]
    num_inference_steps: int
    true_cfg_scale: float
    output: str  # the PNG path the image goes to

    @classmethod
    def of(cls, data: Any) -> RequestSpec:
        return cls(**_checked(cls, data))


@dataclass(frozen=True)
class KnownBand:
    """A count searched already: it only bounds the next count's search."""

    fits_at_mib: int | None
    fails_at_mib: int | None


@dataclass(frozen=True)
class RecordedTrial:
    """A resumed count's trial, replayed while the search asks for the same limits."""

    limit_mib: int
    outcome: TrialOutcome


@dataclass(frozen=True)
class SearchCount:
    reference_count: int
    request: RequestSpec
    band: KnownBand | None = None
    recorded: list[RecordedTrial] = field(default_factory=list)

    @classmethod
    def of(cls, data: Any) -> SearchCount:
        band = _checked(cls, data).get("band")
        return cls(data["reference_count"], RequestSpec.of(data["request"]),
                   None if band is None else KnownBand(**_checked(KnownBand, band)),
                   [RecordedTrial(**_checked(RecordedTrial, t)) for t in data.get("recorded", [])])


@dataclass(frozen=True)
class SpeedSpec:
    """After the bands, one request timed (Measures' seconds) with the pool at `limit_mib`: its
    own steps, at one count."""

    reference_count: int
    request: RequestSpec
    limit_mib: int

    @classmethod
    def of(cls, data: Any) -> SpeedSpec:
        return cls(**{**_checked(cls, data), "request": RequestSpec.of(data["request"])})


@dataclass(frozen=True)
class SearchSpec:
    """A capacity search: the grid, the repeats, the counts in ascending order, and the timed
    request after them (None: none)."""

    floor_mib: int
    ceiling_mib: int
    resolution_mib: int
    repeats: int
    counts: list[SearchCount]
    speed: SpeedSpec | None = None

    @classmethod
    def of(cls, data: Any) -> SearchSpec:
        speed = _checked(cls, data).get("speed")
        return cls(**{**data, "counts": [SearchCount.of(c) for c in data["counts"]],
                      "speed": None if speed is None else SpeedSpec.of(speed)})


def as_json(spec: Any) -> dict:
    """A spec or an event as the JSON object that carries it (an event's kind first, where a
    log reader looks for it)."""
    data = asdict(spec)
    return {"event": data.pop("event"), **data} if "event" in data else data


# --- what the runner measures and emits -----------------------------------------------------------


@dataclass(frozen=True)
class Measures:
    """What an engine measured of one request beyond its peak (None: not measured here)."""

    peak_allocated_mib: float | None = None
    start_allocated_mib: float | None = None  # allocated when the request began
    start_reserved_mib: float | None = None  # reserved when it began (its cache emptied)
    kv_cache_bytes: int | None = None
    kv_cache_host_bytes: int | None = None  # of those, held in host memory (kv_placement)
    kv_cache_layers: int | None = None
    kv_cache_layers_total: int | None = None
    prefix_tokens: int | None = None
    prompt_text_tokens: int | None = None
    max_rss_mib: float | None = None
    host_peak_mib: float | None = None
    host_end_mib: float | None = None
    pinned_host_peak_mib: float | None = None
    pinned_host_start_mib: float | None = None  # when it began, earlier requests' blocks released
    process_mib: float | None = None  # NVML's figure for the runner
    outside_pool_mib: float | None = None  # process_mib less torch's reserved pool
    first_step_end_s: float | None = None  # the encodes and step 0 (diffusers_engine.StepClock)
    step_after_first_s: float | None = None  # each later step, their mean
    decode_s: float | None = None  # the last step's end to the image

    def figures(self) -> dict[str, float | int]:
        """The figures measured, by name."""
        return {k: v for k, v in asdict(self).items() if v is not None}


MEASURES = tuple(f.name for f in fields(Measures))
# A capacity trial (capacity-trials.json) drops these of its Measures, each for its reason...
TRIAL_DROPS = {
    "kv_cache_layers": "the cache's shape is the count's, the same at every limit: "
                       "probe-offline records it per request; a trial keeps its bytes",
    "kv_cache_layers_total": "the pipeline's layer count, the same in every trial",
    "prefix_tokens": "the same request at every limit of a count: probe-offline records it",
    "prompt_text_tokens": "the same prompt at every limit of a count: probe-offline records it",
}
# ...and keeps the rest.
TRIAL_CARRIES = tuple(m for m in MEASURES if m not in TRIAL_DROPS)


@dataclass(frozen=True)
class InitEvent:
    outcome: InitOutcome
    wall_s: float
    error: str | None = None
    traceback: str | None = None
    survives_failure: bool = False  # a failed request leaves the engine usable
    facts: dict[str, Any] | None = None  # the build's figures (the harness's DiffusersBuild)
    emulation: dict[str, Any] | None = None  # the cap this process runs under, and its hook
    event: Literal["init"] = "init"


@dataclass(frozen=True, kw_only=True)
class _Result:
    """What a request and a trial both report of one generate call."""

    outcome: ResultOutcome
    wall_s: float
    started_s: float | None = None  # seconds from the runner's start
    peak_mib: float | None = None
    peak_source: str | None = None  # which figure the peak is (the engine's peak_source)
    error: str | None = None
    traceback: str | None = None
    measured: dict[str, float | int] = field(default_factory=dict)  # Measures.figures()


@dataclass(frozen=True, kw_only=True)
class RequestEvent(_Result):
    id: str
    fixture: str
    seed: int
    image: str | None = None
    event: Literal["request"] = "request"


@dataclass(frozen=True, kw_only=True)
class TrialEvent(_Result):
    reference_count: int
    fixture: str
    limit_mib: int
    phase: Phase
    repeat: bool  # a repeat at a limit this count already tried
    # Why this trial does not count (its outcome is not handed to the search), or None.
    set_aside: str | None = None
    event: Literal["trial"] = "trial"


@dataclass(frozen=True, kw_only=True)
class SpeedEvent(_Result):
    reference_count: int
    fixture: str
    limit_mib: int
    num_inference_steps: int
    event: Literal["speed"] = "speed"


@dataclass(frozen=True)
class BandEvent:
    reference_count: int
    fixture: str
    fits_at_mib: int | None  # A: it fit at every trial at or above
    fails_at_mib: int | None  # B: it failed at every trial at or below
    trials: int  # the counted trials this count ran
    requests_saved: int
    stopped: Literal["error"] | None = None  # why no band: a trial errored
    event: Literal["band"] = "band"


@dataclass(frozen=True)
class ClosedEvent:
    after: str  # the request (a trial: "<count>@<limit>") after which the runner closed
    # Why, beyond the engine closing on a failure as upstream's does: the engine's recovery did
    # not bring it back to its state after the build, or an error followed a failure.
    reason: str | None = None
    event: Literal["closed"] = "closed"


@dataclass(frozen=True)
class DoneEvent:
    event: Literal["done"] = "done"


EVENTS = {"init": InitEvent, "request": RequestEvent, "trial": TrialEvent, "band": BandEvent,
          "speed": SpeedEvent, "closed": ClosedEvent, "done": DoneEvent}


# --- `--versions` -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionsAnswer:
    """What the runner's Python runs on; asked about Diffusers profiles and a random build, the
    profiles its engine would refuse (in its words) and each weighted component's parameters."""

    packages: dict[str, str | None]
    python: str
    cuda_visible_devices: str | None
    refusals: dict[str, str] | None = None
    parameters: dict[str, int] | None = None
