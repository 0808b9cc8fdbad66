"""The offline runner: builds one `Omni(...)` engine from a kwarg set and generates the requests
it is given, writing one JSON result per request.

It runs INSIDE the host's pinned venv (`<venv>/bin/python offline_runner.py ...`), so it imports
the standard library only, plus vLLM-Omni, torch and Pillow from that venv when it builds the
engine; never omniprobe or pydantic. The simulated host runs the same protocol through
`python -m omniprobe.sim offline`, which reuses `main` with its own engine.

    offline_runner.py [--engine omni|diffusers] --model PATH (--kwargs JSON | --kwargs-file FILE)
                      (--requests FILE | --search FILE) --results FILE
    offline_runner.py --versions [ASKED.json]  (the packages the engines would run on; asked,
                                      the Diffusers profiles it would refuse and a random
                                      build's parameters, as JSON)

The requests file: {"requests": [{"id", "fixture", "seed", "prompt", "width", "height",
"references": [image paths], "num_inference_steps", "true_cfg_scale", "output": PNG path}]}.
The results file gets JSON lines, each flushed as it happens (also printed to stdout):

    {"event": "init", "outcome": "ready" | "oom" | "error", "wall_s", "error", "traceback",
     "survives_failure", "facts", "emulation"}
    {"event": "request", "id", "fixture", "seed", "outcome": "ok" | "oom" | "error", "wall_s",
     "started_s", "image", "peak_mib", "peak_source", "error", "traceback", "measured"}
    {"event": "closed", "after": id}
    {"event": "done"}

`--search FILE` runs the capacity search instead (capacity_search.py beside this file, engines
that survive a failure only): {"floor_mib", "ceiling_mib", "resolution_mib", "repeats",
"counts": [{"references", "request": {...one request...}, "band": {...} | absent,
"recorded": [{"limit_mib", "outcome"}, ...]}]}, ascending by references. A count with a "band"
was searched already (it only bounds the next); "recorded" trials are a resumed count's, replayed
in order while the search asks for the same limits. It writes the init event, then per count
one event per trial it ran and one band:

    {"event": "trial", "references", "fixture", "limit_mib", "phase", "repeat", "outcome",
     "wall_s", "started_s", "peak_mib", "peak_source", "error", "traceback", "measured"}
    {"event": "band", "references", "fixture", "fits_at_mib", "fails_at_mib",
     "fails_at_inferred", "trials", "requests_saved", "stopped"}

After a failed init nothing else is written and the exit status is 1. Whether a failed request
ends the runner is the engine's `survives_failure`: upstream's `Omni.generate` shuts its engine
down on any exception and re-raises, so the runner writes "closed" after that request's result
and exits 0 and the harness gives the requests left a fresh runner; a Diffusers pipeline survives
an OOM, so the runner frees what the request held and goes on.
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

_TRACEBACK_CHARS = 20000  # the tail of a traceback: the OOM message and the frames near it


CAP_ENV = "OMNIPROBE_EMULATED_CAP_MIB"  # the emulation hook's (emulation_site/sitecustomize.py)
# What the Omni engine hands upstream and reads back; omniprobe/protocol.py declares the same for
# the upstream checks, and a test holds the two equal (this file cannot import omniprobe).
SAMPLING_PARAMS = ("height", "width", "seed", "num_inference_steps", "true_cfg_scale")
OUTPUT_PEAK = "peak_memory_mb"


class Engine(Protocol):
    peak_source: str  # which figure generate's peak is (OfflineRequest.peak_source)
    survives_failure: bool  # a failed request leaves the engine usable (else it is closed)

    def generate(self, request: dict) -> float | dict | None:
        """Generate one request, write its image to request["output"], return the peak MiB the
        engine reports for it (None: none reported), or a dict of what it measured with the peak
        as "peak_mib". Raising closes the engine for good unless it survives failures."""


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
    return {"outcome": "oom" if is_oom(exc) else "error", "error": message[:2000],
            "traceback": traceback.format_exc()[-_TRACEBACK_CHARS:]}


class Results:
    """The results file, one JSON line per event, echoed to stdout for the log. Each line is
    appended and closed at once, so the harness sees it while the next request runs."""

    def __init__(self, path: str):
        self.path = path

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields})
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        print(line, flush=True)


def _built(make_engine: Callable[[], Engine], results: Results, t0: float) -> Engine | None:
    """The engine, its init event written; None when the build failed (its event says how)."""
    try:
        engine = make_engine()
    except Exception as exc:
        results.emit("init", wall_s=round(time.monotonic() - t0, 3), **failure(exc))
        return None
    results.emit("init", outcome="ready", wall_s=round(time.monotonic() - t0, 3), error=None,
                 traceback=None, survives_failure=bool(getattr(engine, "survives_failure", False)),
                 facts=engine.facts() if hasattr(engine, "facts") else None,
                 emulation=emulation_state())
    return engine


def run(make_engine: Callable[[], Engine], requests: list[dict], results: Results) -> int:
    """Build the engine, then generate the requests in order, one event each, until one fails."""
    t0 = time.monotonic()
    engine = _built(make_engine, results, t0)
    if engine is None:
        return 1
    survives = bool(getattr(engine, "survives_failure", False))
    for request in requests:
        started = time.monotonic()
        head = {"id": request["id"], "fixture": request["fixture"], "seed": request["seed"],
                "started_s": round(started - t0, 3)}
        try:
            measured = _measured(engine.generate(request))
        except Exception as exc:
            # What the engine measured of the failed request (its peak up to the OOM), if any.
            measured = _measured(getattr(engine, "last", None)) if survives else {}
            peak = measured.pop("peak_mib", None)
            results.emit("request", **head, wall_s=round(time.monotonic() - started, 4),
                         image=None, peak_mib=peak,
                         peak_source=None if peak is None else engine.peak_source,
                         measured=measured, **failure(exc))
            if not survives:
                results.emit("closed", after=request["id"])
                return 0
        else:
            peak = measured.pop("peak_mib", None)
            results.emit("request", **head, wall_s=round(time.monotonic() - started, 4),
                         outcome="ok", image=request["output"], peak_mib=peak,
                         peak_source=None if peak is None else engine.peak_source, error=None,
                         traceback=None, measured=measured)
            continue
        # Out of the except block: the exception's frames no longer hold the request's tensors.
        engine.recover()
    results.emit("done")
    return 0


def run_search(make_engine: Callable[[], Engine], spec: dict, results: Results) -> int:
    """Build the engine once, then bisect each count's pool limit (`--search`), the band of one
    count bounding the next's search."""
    _beside_this_file()
    from capacity_search import Grid, next_guess_mib, requests_saved, search

    t0 = time.monotonic()
    engine = _built(make_engine, results, t0)
    if engine is None:
        return 1
    grid = Grid(spec["floor_mib"], spec["ceiling_mib"], spec["resolution_mib"])
    repeats = spec["repeats"]
    found: list[int] = []
    known_fail = None
    for count in spec["counts"]:
        band = count.get("band")
        if band is None:
            guess = next_guess_mib(found, grid.resolution_mib)
            recorded = list(count.get("recorded", []))
            run_trial = _trial_runner(engine, count["request"], count["references"], recorded,
                                      results, t0)
            found_band = search(run_trial, grid, repeats, known_fail_mib=known_fail,
                                first_guess_mib=guess)
            band = {"fits_at_mib": found_band.fits_at_mib, "fails_at_mib": found_band.fails_at_mib}
            results.emit("band", references=count["references"],
                         fixture=count["request"]["fixture"], **band,
                         fails_at_inferred=found_band.fails_at_inferred,
                         trials=len(found_band.trials),
                         requests_saved=requests_saved(grid, repeats, found_band, known_fail,
                                                       guess),
                         stopped=found_band.stopped)
        if band["fits_at_mib"] is not None:
            found.append(band["fits_at_mib"])
        if band["fails_at_mib"] is not None:
            known_fail = band["fails_at_mib"]
    results.emit("done")
    return 0


def _trial_runner(engine: Engine, request: dict, references: int, recorded: list[dict],
                  results: Results, t0: float) -> Callable[[int, str, bool], str]:
    """One count's trials: each sets the pool limit, generates the request and writes its event;
    a resumed count's recorded trials answer first, while they match what the search asks."""

    def trial(limit_mib: int, phase: str, repeat: bool) -> str:
        if recorded:
            if recorded[0]["limit_mib"] == limit_mib:
                return recorded.pop(0)["outcome"]
            recorded.clear()  # the search went elsewhere: run from here on
        engine.set_pool_limit(limit_mib)
        started = time.monotonic()
        head = {"references": references, "fixture": request["fixture"], "limit_mib": limit_mib,
                "phase": phase, "repeat": repeat, "started_s": round(started - t0, 3)}
        try:
            measured = _measured(engine.generate(request))
            outcome: dict[str, Any] = {"outcome": "ok", "error": None, "traceback": None}
        except Exception as exc:
            measured = _measured(getattr(engine, "last", None))
            outcome = failure(exc)
        peak = measured.pop("peak_mib", None)
        results.emit("trial", **head, wall_s=round(time.monotonic() - started, 4), **outcome,
                     peak_mib=peak, peak_source=None if peak is None else engine.peak_source,
                     measured=measured)
        if outcome["outcome"] != "ok":
            engine.recover()  # out of the except block: its frames no longer hold the tensors
        return {"ok": "fit", "oom": "oom"}.get(outcome["outcome"], "error")

    return trial


def _measured(result: float | dict | None) -> dict:
    """An engine's result as a dict of figures, the peak under "peak_mib"."""
    return dict(result) if isinstance(result, dict) else {"peak_mib": result}


def save_png(image: Any, path: str) -> None:
    """Write a Pillow image atomically: the harness never reads half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        image.save(tmp, "PNG")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _first_output(outputs: Any) -> Any:
    return outputs[0] if isinstance(outputs, list | tuple) else outputs


def _holders(first: Any) -> list[Any]:
    """The output and the request output inside it, where builds put images and metrics."""
    inner = getattr(first, "request_output", None)
    if isinstance(inner, list | tuple):
        inner = inner[0] if inner else None
    return [h for h in (first, inner) if h is not None]


def first_image(outputs: Any) -> Any:
    """The first image of `omni.generate(...)`; builds differ in where they put it."""
    first = _first_output(outputs)
    if hasattr(first, "save"):
        return first
    for holder in _holders(first):
        images = getattr(holder, "images", None)
        if images:
            return images[0]
    raise TypeError(f"no image in the engine's output ({type(first).__name__})")


def output_peak_mib(outputs: Any) -> float | None:
    """The diffusion worker's own peak as upstream's request output carries it (`peak_memory_mb`:
    torch's reserved pool over the request, in MiB); None where the build reports none."""
    for holder in _holders(_first_output(outputs)):
        peak = getattr(holder, OUTPUT_PEAK, None)
        if isinstance(peak, int | float) and not isinstance(peak, bool) and peak > 0:
            return round(float(peak), 1)
    return None


def open_reference(path: str) -> Any:
    """A reference image in the mode its file has, as the server's upload path hands it to the
    pipeline (it converts only when asked), so serve and offline runs get the same input."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return image.copy()


class OmniEngine:
    """vLLM-Omni's offline engine, as the contract shows it at the pinned commit."""

    peak_source = "worker-reserved"  # upstream's peak_memory_mb: the worker's reserved pool

    def __init__(self, model: str, kwargs: dict):
        from vllm_omni import Omni
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        self.params = OmniDiffusionSamplingParams
        self.omni = Omni(model=model, **kwargs)

    def generate(self, request: dict) -> float | None:
        images = [open_reference(path) for path in request["references"]]
        prompt: dict[str, Any] = {"prompt": request["prompt"]}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        params = self.params(**{name: request[name] for name in SAMPLING_PARAMS})
        outputs = self.omni.generate(prompt, sampling_params_list=[params])
        save_png(first_image(outputs), request["output"])
        # The diffusion runs in upstream's worker processes: this process has no peak of its own.
        return output_peak_mib(outputs)


def _beside_this_file() -> None:
    """Make diffusers_engine.py, beside this file, importable: it is imported only when asked
    for, so the Omni engine's venv need not have diffusers' pipeline."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


def diffusers_engine(model: str, kwargs: dict) -> Engine:
    _beside_this_file()
    from diffusers_engine import DiffusersEngine

    return DiffusersEngine(model, kwargs, open_image=open_reference, save_png=save_png)


ENGINES: dict[str, Callable[[str, dict], Engine]] = {
    "omni": lambda model, kwargs: OmniEngine(model, kwargs),
    "diffusers": diffusers_engine,
}


def print_versions(asked_file: str | None = None) -> int:
    """The engine's facts; with a JSON file of Diffusers profiles by name (`profiles`) and a
    random build's components (`components`: each one's class and config), also the profiles it
    would refuse here, in its own words, and each weighted component's parameters, counted on
    the meta device."""
    _beside_this_file()
    from diffusers_engine import asked_facts, environment_facts

    facts = environment_facts()
    if asked_file is not None:
        with open(asked_file, encoding="utf-8") as handle:
            asked = json.load(handle)
        facts.update(asked_facts(asked.get("profiles") or {}, asked.get("components")))
    print(json.dumps(facts))
    return 0


def build_parser(prog: str = "offline_runner.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINES), default="omni",
                        help="the engine to build (default: vLLM-Omni's Omni)")
    parser.add_argument("--model", required=True, help="model path or repo id")
    kwargs = parser.add_mutually_exclusive_group(required=True)
    kwargs.add_argument("--kwargs", help="Omni(...) keyword arguments as a JSON object")
    kwargs.add_argument("--kwargs-file", help="file holding the JSON object")
    work = parser.add_mutually_exclusive_group(required=True)
    work.add_argument("--requests", help="JSON file of the requests")
    work.add_argument("--search", help="JSON file of a capacity search (see above)")
    parser.add_argument("--results", required=True, help="JSON-lines file the results go to")
    return parser


class UsageError(ValueError):
    pass


def _read_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON: {exc}") from None


def load_inputs(args: argparse.Namespace) -> tuple[dict, list[dict] | dict]:
    """The kwargs and the requests (or the search); UsageError naming the file or option that
    is wrong."""
    if args.kwargs_file:
        with open(args.kwargs_file, encoding="utf-8") as handle:
            kwargs = _read_json(handle.read(), args.kwargs_file)
        where = args.kwargs_file
    else:
        kwargs, where = _read_json(args.kwargs, "--kwargs"), "--kwargs"
    if not isinstance(kwargs, dict):
        raise UsageError(f"{where}: expected a JSON object of Omni(...) keyword arguments")
    if "model" in kwargs:
        raise UsageError(f"{where}: 'model' is given with --model, not in the kwargs")
    if args.search:
        with open(args.search, encoding="utf-8") as handle:
            search = _read_json(handle.read(), args.search)
        if not isinstance(search, dict) or not isinstance(search.get("counts"), list):
            raise UsageError(f"{args.search}: expected {{\"counts\": [...], ...}}")
        return kwargs, search
    with open(args.requests, encoding="utf-8") as handle:
        spec = _read_json(handle.read(), args.requests)
    requests = spec.get("requests") if isinstance(spec, dict) else None
    if not isinstance(requests, list):
        raise UsageError(f"{args.requests}: expected {{\"requests\": [...]}}")
    wanted = ("id", "fixture", "seed", "prompt", "width", "height", "references",
              "num_inference_steps", "true_cfg_scale", "output")
    for i, request in enumerate(requests):
        missing = [k for k in wanted if not isinstance(request, dict) or k not in request]
        if missing:
            raise UsageError(f"{args.requests}: requests[{i}] lacks {', '.join(missing)}")
    return kwargs, requests


def main(argv: list[str] | None = None,
         engine: Callable[[str, dict], Engine] | None = None, prog: str = "offline_runner.py") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--versions"] and len(argv) <= 2:
        return print_versions(*argv[1:])
    args = build_parser(prog).parse_args(argv)
    engine = engine or ENGINES[args.engine]
    try:
        kwargs, requests = load_inputs(args)
    except (OSError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    make = lambda: engine(args.model, kwargs)  # noqa: E731
    if args.search:
        return run_search(make, requests, Results(args.results))
    return run(make, requests, Results(args.results))


if __name__ == "__main__":
    sys.exit(main())
