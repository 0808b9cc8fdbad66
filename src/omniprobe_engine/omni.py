"""vLLM-Omni's offline engine (`Omni(...)`), as the upstream contract shows it at the pinned
commit, and where its outputs keep the image and the worker's peak. vllm_omni is imported only
when the engine is built, in the probe env."""

from __future__ import annotations

from typing import Any

from omniprobe_engine.images import open_reference, save_png
from omniprobe_engine.protocol import OUTPUT_PEAK, SAMPLING_PARAMS


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


class OmniEngine:
    """vLLM-Omni's offline engine, as the contract shows it at the pinned commit."""

    peak_source = "worker-reserved"  # upstream's peak_memory_mb: the worker's reserved pool
    survives_failure = False  # upstream's Omni.generate shuts its engine down on any exception

    def __init__(self, model: str, kwargs: dict):
        from vllm_omni import Omni
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        self.params = OmniDiffusionSamplingParams
        self.omni = Omni(model=model, **kwargs)

    def generate(self, request: dict) -> float | None:
        images = [open_reference(path) for path in request["reference_paths"]]
        prompt: dict[str, Any] = {"prompt": request["prompt"]}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        params = self.params(**{name: request[name] for name in SAMPLING_PARAMS})
        outputs = self.omni.generate(prompt, sampling_params_list=[params])
        save_png(first_image(outputs), request["output"])
        # The diffusion runs in upstream's worker processes: this process has no peak of its own.
        return output_peak_mib(outputs)
