"""The offline runner: builds one engine (vLLM-Omni's `Omni(...)` from a kwarg set, or a Diffusers
pipeline from a profile) and runs the work it is given, writing one JSON event per step.

It runs in its own interpreter (the probe env, the Diffusers env, or a GPU machine's own Python),
started as `python -m omniprobe_engine` or through launch.py's folder, with the standard library
only at import time: torch, diffusers and vllm_omni are imported when the engine is built, and
omniprobe never. The simulated host runs the same protocol through `python -m omniprobe.sim
offline`, which calls `main` with an engine of its own.

    python -m omniprobe_engine [--engine omni|diffusers] --model PATH
                               (--kwargs JSON | --kwargs-file FILE)
                               (--requests FILE | --search FILE) --results FILE
    python -m omniprobe_engine --versions [ASKED.json]

The requests file is {"requests": [RequestSpec, ...]}, the search file a SearchSpec; the results
file gets the events, JSON lines each flushed as it happens (and echoed to stdout): protocol.py
declares them all. A request run writes init, then a request event per request, then done; a
search writes init, then per count each trial it ran and its band, then its timed request
(speed, where the spec asks for one), then done.

After a failed init nothing else is written and the exit status is 1. Whether a failed request
ends the runner is the engine's `survives_failure`: upstream's `Omni.generate` shuts its engine
down on any exception and re-raises, so the runner writes "closed" after that request's result
and exits 0 and the harness gives the requests left a fresh runner; a Diffusers pipeline survives
an OOM, so the runner has the engine undo what the request left (`recover`) and goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from omniprobe_engine.protocol import (
    CAP_ENV,
    ERROR_CHARS,
    TRACEBACK_CHARS,
    BandEvent,
    ClosedEvent,
    DoneEvent,
    InitEvent,
    Measures,
    RequestEvent,
    RequestSpec,
    SearchCount,
    SearchSpec,
    SpecError,
    SpeedEvent,
    SpeedSpec,
    TrialEvent,
    VersionsAnswer,
    as_json,
)
from omniprobe_engine.search import FIT, Grid, next_guess_mib, requests_saved, search


class Engine(Protocol):
    peak_source: str  # which figure generate's peak is (OfflineRequest.peak_source)
    survives_failure: bool  # a failed request leaves the engine usable (else it is closed)

    def generate(self, request: dict) -> float | dict | None:
        """Generate one request, write its image to request["output"], return the peak MiB the
        engine reports for it (None: none reported), or a dict of what it measured with the peak
        as "peak_mib". Raising closes the engine for good unless it survives failures.

        An engine that survives failures also has `recover()`, called after each failure: None
        once it is back to its state after the build, else why not (the runner then closes);
        and may have `dirty(start_allocated_mib)`: why a request that started with that much
        allocated did not start clean, or None; and `set_pool_limit(mib)` for a search."""


def emulation_state() -> dict | None:
    """The emulation cap this process runs under and whether the hook that imposes it loaded."""
    cap = os.environ.get(CAP_ENV)
    if cap is None:
        return None
    hook = sys.modules.get("sitecustomize")
    where = getattr(hook, "__file__", "") or ""
    return {"cap_mib": int(cap) if cap.isdigit() else None,
            "hook_loaded": os.path.basename(os.path.dirname(where)) == "emulation_site"}


def is_oom(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def failure(exc: BaseException) -> dict[str, Any]:
    message = f"{type(exc).__name__}: {exc}"
    return {"outcome": "oom" if is_oom(exc) else "error", "error": message[:ERROR_CHARS],
            "traceback": traceback.format_exc()[-TRACEBACK_CHARS:]}


class Results:
    """The results file, one JSON line per event, echoed to stdout for the log. Each line is
    appended and closed at once, so the harness sees it while the next request runs."""

    def __init__(self, path: str):
        self.path = path

    def emit(self, event: Any) -> None:
        line = json.dumps(as_json(event))
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        print(line, flush=True)


def _seconds(since: float, digits: int = 3) -> float:
    return round(time.monotonic() - since, digits)


def _built(make_engine: Callable[[], Engine], results: Results, t0: float) -> Engine | None:
    """The engine, its init event written; None when the build failed (its event says how)."""
    try:
        engine = make_engine()
    except Exception as exc:
        results.emit(InitEvent(wall_s=_seconds(t0), **failure(exc)))
        return None
    results.emit(InitEvent(
        outcome="ready", wall_s=_seconds(t0),
        survives_failure=bool(getattr(engine, "survives_failure", False)),
        facts=engine.facts() if hasattr(engine, "facts") else None, emulation=emulation_state()))
    return engine


def _measured(engine: Engine, result: float | dict | None) -> dict[str, Any]:
    """An engine's result as the peak, its source and the other figures (Measures: a figure no
    field declares is the engine's error, raised here rather than lost)."""
    figures = dict(result) if isinstance(result, dict) else {"peak_mib": result}
    peak = figures.pop("peak_mib", None)
    return {"peak_mib": peak, "peak_source": None if peak is None else engine.peak_source,
            "measured": Measures(**figures).figures()}


def _attempt(engine: Engine, request: dict, survives: bool) -> dict[str, Any]:
    """Generate one request: its outcome, error and figures (a failure's too, where the engine
    survives it and kept what it measured up to it)."""
    try:
        result = engine.generate(request)
    except Exception as exc:
        kept = getattr(engine, "last", None) if survives else None
        return {**failure(exc), **_measured(engine, kept)}
    return {"outcome": "ok", **_measured(engine, result)}


def run(make_engine: Callable[[], Engine], requests: list[RequestSpec], results: Results) -> int:
    """Build the engine, then generate the requests in order, one event each, until one fails."""
    t0 = time.monotonic()
    engine = _built(make_engine, results, t0)
    if engine is None:
        return 1
    survives = bool(getattr(engine, "survives_failure", False))
    for request in requests:
        started = time.monotonic()
        done = _attempt(engine, as_json(request), survives)
        ok = done["outcome"] == "ok"
        results.emit(RequestEvent(id=request.id, fixture=request.fixture, seed=request.seed,
                                  started_s=round(started - t0, 3), wall_s=_seconds(started, 4),
                                  image=request.output if ok else None, **done))
        if not ok:
            # Out of the except block: the exception's frames no longer hold the request's tensors.
            why = engine.recover() if survives else None
            if not survives or why is not None:
                results.emit(ClosedEvent(after=request.id, reason=_closed_why(why)))
                return 0
    results.emit(DoneEvent())
    return 0


def _closed_why(recovery: str | None) -> str | None:
    return None if recovery is None else f"the engine did not recover from the failure: {recovery}"


class Restart(Exception):
    """The search cannot go on in this runner: a fresh one must take it up (its trials so far
    recorded, those set aside excepted)."""

    def __init__(self, after: str, reason: str):
        super().__init__(reason)
        self.after, self.reason = after, reason


def run_search(make_engine: Callable[[], Engine], spec: SearchSpec, results: Results) -> int:
    """Build the engine once, then bisect each count's pool limit (`--search`), the bands found
    guiding the next count's search. A failure the engine cannot recover from, or an error right
    after a failure, ends this runner with a "closed" event: the harness starts a fresh one."""
    t0 = time.monotonic()
    engine = _built(make_engine, results, t0)
    if engine is None:
        return 1
    grid = Grid(spec.floor_mib, spec.ceiling_mib, spec.resolution_mib)
    found: list[int] = []
    hint = None
    last = _LastTrial()
    for count in spec.counts:
        band = count.band
        if band is None:
            guess = next_guess_mib(found, grid.resolution_mib)
            try:
                band = search(_trial_runner(engine, count, results, t0, last), grid,
                              spec.repeats, fail_hint_mib=hint, first_guess_mib=guess)
            except Restart as restart:
                results.emit(ClosedEvent(after=restart.after, reason=restart.reason))
                return 0
            results.emit(BandEvent(
                reference_count=count.reference_count, fixture=count.request.fixture,
                fits_at_mib=band.fits_at_mib, fails_at_mib=band.fails_at_mib,
                trials=len(band.trials),
                requests_saved=requests_saved(grid, spec.repeats, band, hint, guess),
                stopped=band.stopped))
        if band.fits_at_mib is not None:
            found.append(band.fits_at_mib)
        if band.fails_at_mib is not None:
            hint = band.fails_at_mib
    if spec.speed is not None:
        _timed(engine, spec.speed, results, t0)
    results.emit(DoneEvent())
    return 0


def _timed(engine: Engine, speed: SpeedSpec, results: Results, t0: float) -> None:
    """The search's timed request, its pool at the spec's limit, as a speed event."""
    engine.set_pool_limit(speed.limit_mib)
    started = time.monotonic()
    done = _attempt(engine, as_json(speed.request), survives=True)
    results.emit(SpeedEvent(reference_count=speed.reference_count,
                            fixture=speed.request.fixture, limit_mib=speed.limit_mib,
                            num_inference_steps=speed.request.num_inference_steps,
                            started_s=round(started - t0, 3), wall_s=_seconds(started, 4),
                            **done))


class _LastTrial:
    """Whether this runner's last trial failed: an error right after one is the failure's."""

    failed = False


def _set_aside(engine: Engine, done: dict, after_failure: bool) -> str | None:
    """Why a trial's outcome must not count, or None: it started with more held than the build
    left (the harness's leftover, not the card's), or it errored right after a failure."""
    dirty = getattr(engine, "dirty", None)
    start = done["measured"].get("start_allocated_mib")
    why = dirty(start) if dirty is not None and start is not None else None
    if why is not None:
        return f"it started dirty: {why}"
    if done["outcome"] == "error" and after_failure:
        return ("an error that is no OOM right after a failed trial: the harness's state until a "
                "clean start shows otherwise")
    return None


def _trial_runner(engine: Engine, count: SearchCount, results: Results, t0: float,
                  last: _LastTrial) -> Callable[[int, str, bool], str]:
    """One count's trials: each sets the pool limit, generates the request and writes its event;
    a resumed count's recorded trials answer first, while they match what the search asks. A
    trial set aside is recorded and run again from a clean start, in this runner after a clean
    recovery from a dirty start, else in a fresh one (Restart)."""
    recorded = list(count.recorded)
    request = as_json(count.request)

    def trial(limit_mib: int, phase: str, repeat: bool) -> str:
        if recorded:
            if recorded[0].limit_mib == limit_mib:
                return recorded.pop(0).outcome
            recorded.clear()  # the search went elsewhere: run from here on
        after, tries = f"{count.reference_count}@{limit_mib}", 0
        while True:
            tries += 1
            engine.set_pool_limit(limit_mib)
            started = time.monotonic()
            done = _attempt(engine, request, survives=True)
            aside = _set_aside(engine, done, last.failed)
            results.emit(TrialEvent(reference_count=count.reference_count,
                                    fixture=count.request.fixture, limit_mib=limit_mib,
                                    phase=phase, repeat=repeat, started_s=round(started - t0, 3),
                                    wall_s=_seconds(started, 4), set_aside=aside, **done))
            if done["outcome"] != "ok" or aside is not None:
                # Out of the except block: its frames no longer hold the request's tensors.
                why = engine.recover()
                if why is not None:
                    raise Restart(after, _closed_why(why))
            if aside is None:
                last.failed = done["outcome"] != "ok"
                return FIT if done["outcome"] == "ok" else done["outcome"]
            if done["outcome"] == "error" or tries > 1:  # the trial again, on a fresh build
                raise Restart(after, f"trial set aside, {aside}")

    return trial


def omni_engine(model: str, kwargs: dict) -> Engine:
    from omniprobe_engine.omni import OmniEngine

    return OmniEngine(model, kwargs)


def diffusers_engine(model: str, kwargs: dict) -> Engine:
    from omniprobe_engine.diffusers_engine import DiffusersEngine

    return DiffusersEngine(model, kwargs)


ENGINES: dict[str, Callable[[str, dict], Engine]] = {
    "omni": omni_engine,
    "diffusers": diffusers_engine,
}


def print_versions(asked_file: str | None = None) -> int:
    """The engine's facts; with a JSON file of Diffusers profiles by name (`profiles`) and a
    random build's components (`components`: each one's class and config), also the profiles it
    would refuse here, in its own words, and each weighted component's parameters, counted on
    the meta device."""
    from omniprobe_engine.diffusers_engine import asked_facts, environment_facts

    facts = environment_facts()
    if asked_file is not None:
        with open(asked_file, encoding="utf-8") as handle:
            asked = json.load(handle)
        facts.update(asked_facts(asked.get("profiles") or {}, asked.get("components")))
    print(json.dumps(as_json(VersionsAnswer(**facts))))
    return 0


def build_parser(prog: str = "python -m omniprobe_engine") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINES), default="omni",
                        help="the engine to build (default: vLLM-Omni's Omni)")
    parser.add_argument("--model", required=True, help="model path or repo id")
    kwargs = parser.add_mutually_exclusive_group(required=True)
    kwargs.add_argument("--kwargs", help="Omni(...) keyword arguments as a JSON object")
    kwargs.add_argument("--kwargs-file", help="file holding the JSON object")
    work = parser.add_mutually_exclusive_group(required=True)
    work.add_argument("--requests", help="JSON file of the requests")
    work.add_argument("--search", help="JSON file of a capacity search (protocol.SearchSpec)")
    parser.add_argument("--results", required=True, help="JSON-lines file the results go to")
    return parser


class UsageError(ValueError):
    pass


def _read_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON: {exc}") from None


def _read_file(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return _read_json(handle.read(), path)


def _spec(make: Callable[[Any], Any], data: Any, where: str) -> Any:
    """`data` as the protocol's spec, or UsageError naming what it lacks or has too many of."""
    try:
        return make(data)
    except SpecError as exc:
        raise UsageError(f"{where} {exc}") from None


def load_inputs(args: argparse.Namespace) -> tuple[dict, list[RequestSpec] | SearchSpec]:
    """The kwargs and the requests (or the search); UsageError naming the file or option that
    is wrong."""
    if args.kwargs_file:
        kwargs, where = _read_file(args.kwargs_file), args.kwargs_file
    else:
        kwargs, where = _read_json(args.kwargs, "--kwargs"), "--kwargs"
    if not isinstance(kwargs, dict):
        raise UsageError(f"{where}: expected a JSON object of Omni(...) keyword arguments")
    if "model" in kwargs:
        raise UsageError(f"{where}: 'model' is given with --model, not in the kwargs")
    if args.search:
        spec = _read_file(args.search)
        if not isinstance(spec, dict) or not isinstance(spec.get("counts"), list):
            raise UsageError(f"{args.search}: expected {{\"counts\": [...], ...}}")
        return kwargs, _spec(SearchSpec.of, spec, f"{args.search}:")
    spec = _read_file(args.requests)
    requests = spec.get("requests") if isinstance(spec, dict) else None
    if not isinstance(requests, list):
        raise UsageError(f"{args.requests}: expected {{\"requests\": [...]}}")
    return kwargs, [_spec(RequestSpec.of, r, f"{args.requests}: requests[{i}]")
                    for i, r in enumerate(requests)]


def main(argv: list[str] | None = None, engine: Callable[[str, dict], Engine] | None = None,
         prog: str = "python -m omniprobe_engine") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--versions"] and len(argv) <= 2:
        return print_versions(*argv[1:])
    args = build_parser(prog).parse_args(argv)
    engine = engine or ENGINES[args.engine]
    try:
        kwargs, work = load_inputs(args)
    except (OSError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    make = lambda: engine(args.model, kwargs)  # noqa: E731
    if args.search:
        return run_search(make, work, Results(args.results))
    return run(make, work, Results(args.results))
