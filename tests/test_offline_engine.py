"""The offline runner's vLLM-Omni engine adapter, driven through a stand-in `vllm_omni` module
shaped like upstream's offline API (Omni, OmniDiffusionSamplingParams, the request output)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest
from PIL import Image

from omniprobe_engine.omni import OmniEngine, first_image, output_peak_mib


@dataclass
class RequestOutput:
    images: list
    peak_memory_mb: float = 0.0


@dataclass
class FakeOmni:
    model: str
    kwargs: dict
    seen: list = field(default_factory=list)
    peak_memory_mb: float = 0.0

    def generate(self, prompt, sampling_params_list):
        self.seen.append((prompt, sampling_params_list))
        return [RequestOutput([Image.new("RGBA", (8, 8))], self.peak_memory_mb)]


@pytest.fixture
def omni(monkeypatch):
    made = []

    def build(model, **kwargs):
        made.append(FakeOmni(model, kwargs))
        return made[-1]

    package = types.ModuleType("vllm_omni")
    package.Omni = build
    inputs = types.ModuleType("vllm_omni.inputs")
    data = types.ModuleType("vllm_omni.inputs.data")
    data.OmniDiffusionSamplingParams = lambda **fields: fields
    for module in (package, inputs, data):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return made


def _request(tmp_path, modes):
    references = []
    for i, mode in enumerate(modes):
        path = tmp_path / f"ref-{i}.png"
        Image.new(mode, (4, 4)).save(path)
        references.append(str(path))
    return {"prompt": "p", "width": 8, "height": 8, "seed": 1, "num_inference_steps": 2,
            "true_cfg_scale": 1.0, "reference_paths": references, "output": str(tmp_path / "out.png")}


def test_references_reach_the_engine_in_their_files_mode(tmp_path, omni):
    engine = OmniEngine("model", {"enforce_eager": True})
    engine.generate(_request(tmp_path, ["RGBA", "P", "RGB"]))
    [(prompt, [params])] = omni[0].seen
    assert [image.mode for image in prompt["multi_modal_data"]["image"]] == ["RGBA", "P", "RGB"]
    assert params == {"height": 8, "width": 8, "seed": 1, "num_inference_steps": 2,
                      "true_cfg_scale": 1.0}
    assert omni[0].kwargs == {"enforce_eager": True}
    assert Image.open(tmp_path / "out.png").mode == "RGBA"


@pytest.mark.parametrize(("reported", "peak"), [(20480.25, 20480.2), (0.0, None)])
def test_the_peak_is_the_one_the_request_output_reports(tmp_path, omni, reported, peak):
    engine = OmniEngine("model", {})
    omni[0].peak_memory_mb = reported
    assert engine.generate(_request(tmp_path, ["RGB"])) == peak


@pytest.mark.parametrize(("outputs", "peak"), [
    ([RequestOutput([1], 12.0)], 12.0),
    ([types.SimpleNamespace(request_output=[RequestOutput([1], 7.5)])], 7.5),
    ([types.SimpleNamespace(images=[1])], None),
    ([RequestOutput([1], True)], None),  # a flag is not a figure
])
def test_output_peak_where_builds_put_it(outputs, peak):
    assert output_peak_mib(outputs) == peak
    assert first_image(outputs) == 1
