"""A tiny synthetic vLLM-Omni source tree, shaped like the parts of upstream the contract checks
read (written for the tests from the shapes in ../shared/vllm-omni-contract.md; no upstream code).
`write_tree(root, doctor)` writes it with the files changed by `doctor` (path -> text or None)."""

from __future__ import annotations

from pathlib import Path

FILES: dict[str, str] = {
    "vllm_omni/__init__.py": "from vllm_omni.entrypoints.omni import Omni\n",
    "vllm_omni/_version.py": "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = None\n",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/cli/serve.py": '''\
from vllm.entrypoints.launchers.cli_args import make_arg_parser


def subparser_init(subparsers):
    parser = make_arg_parser(subparsers.add_parser("serve"))
    group = parser.add_argument_group("OmniConfig")
    group.add_argument("--omni", action="store_true")
    group.add_argument("--deploy-config", type=str, default=None)
    group.add_argument("--enable-cpu-offload", action="store_true")
    group.add_argument("--enable-layerwise-offload", action="store_true")
    return parser
''',
    "vllm_omni/entrypoints/openai/protocol/images.py": '''\
from pydantic import BaseModel


class ImageGenerationRequest(BaseModel):
    prompt: str
    size: str | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    true_cfg_scale: float | None = None
    response_format: str = "b64_json"
    return_stage_metrics: bool | None = None


class ImageData(BaseModel):
    b64_json: str | None = None


class ImageGenerationResponse(BaseModel):
    created: int
    data: list[ImageData]
    metrics: dict | None = None
''',
    "vllm_omni/entrypoints/openai/api_server.py": '''\
from fastapi import File, Form, HTTPException, UploadFile


def _metrics(peak):
    metrics = {}
    metrics["peak_memory_mb"] = peak
    return metrics


@router.get("/health")
async def health(raw_request):
    return {"status": "healthy"}


@router.post("/v1/images/generations")
async def generate_images(request: ImageGenerationRequest, raw_request) -> ImageGenerationResponse:
    return ImageGenerationResponse(created=0, data=[])


@router.post("/v1/images/edits")
async def edit_images(
    raw_request,
    image: list[UploadFile] | None = File(None),
    image_array: list[UploadFile] | None = File(None, alias="image[]"),
    prompt: str = Form(...),
    size: str = Form("auto"),
    response_format: str = Form("b64_json"),
    num_inference_steps: int | None = Form(None),
    true_cfg_scale: float | None = Form(None),
    seed: int | None = Form(None),
    return_stage_metrics: bool | None = Form(None),
) -> ImageGenerationResponse:
    try:
        normalize = False
        images = await _load_input_images(image or image_array, normalize_rgb=normalize)
        return ImageGenerationResponse(created=0, data=images)
    except Exception as e:
        raise HTTPException(status_code=HTTPStatus.INTERNAL_SERVER_ERROR.value,
                            detail=f"Image edit failed: {str(e)}")
''',
    "vllm_omni/outputs/__init__.py": '''\
from dataclasses import dataclass


@dataclass
class OmniRequestOutput:
    request_id: str
    peak_memory_mb: float = 0.0
''',
    "vllm_omni/metrics/definitions.py": '''\
DENOISE_STEP_LATENCY = "denoise_step_latency"
DENOISE_STEP_LATENCY_MS = f"{DENOISE_STEP_LATENCY}_ms"
''',
    "vllm_omni/metrics/stats.py": '''\
def attach(output, snapshot):
    output.metrics = {"stage_metrics": snapshot}
''',
    "vllm_omni/entrypoints/omni_base.py": '''\
class OmniBase:
    def __init__(self, model, **kwargs):
        self.timeout = kwargs.pop("stage_init_timeout", 300)
''',
    "vllm_omni/entrypoints/omni.py": '''\
from vllm_omni.entrypoints.omni_base import OmniBase


class Omni(OmniBase):
    def generate(self, prompts, sampling_params_list=None):
        try:
            return self._run(prompts, sampling_params_list)
        except Exception:
            self.close()
            raise
''',
    "vllm_omni/inputs/data.py": '''\
from dataclasses import dataclass


@dataclass
class OmniDiffusionSamplingParams:
    seed: int | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int = 50
    true_cfg_scale: float | None = None
''',
    "vllm_omni/diffusion/data.py": '''\
from dataclasses import dataclass, field


@dataclass
class OmniDiffusionConfig:
    enforce_eager: bool = False
    enable_cpu_offload: bool = False
    quantization_config: dict | None = None
    extras: dict = field(default_factory=dict)
''',
    "vllm_omni/config/config_factory.py": '''\
from dataclasses import fields


def normalize(kwargs):
    quantization = kwargs.pop("quantization", None)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    names = frozenset(f.name for f in fields(OmniDiffusionConfig))
    return {k: v for k, v in kwargs.items() if k in names}
''',
    "vllm_omni/config/stage_config.py": '''\
def load_deploy_config(path):
    raw_dict = resolve_deploy_yaml(path)
    if "stage_args" in raw_dict:
        raise ValueError("removed schema")
    stages = [parse(s) for s in raw_dict.get("stages", [])]
    return DeployConfig(stages=stages, pipeline=raw_dict.get("pipeline", None))
''',
    "vllm_omni/config/pipeline_registry.py": '''\
OMNI_PIPELINES = {
    "qwen2_5_omni": QWEN2_5_OMNI_PIPELINE,
    "bagel": BAGEL_PIPELINE,
}
''',
    "vllm_omni/config/resolver.py": '''\
def resolve(model, overrides):
    structured = create_from_model(model)
    if structured is not None:
        return structured
    return StageConfigFactory.create_typed_default_diffusion(model, overrides)
''',
    "vllm_omni/diffusion/registry.py": '''\
_DIFFUSION_MODELS = {
    "QwenImagePipeline": ("qwen_image", "pipeline_qwen_image", "QwenImagePipeline"),
}
''',
    "vllm_omni/diffusion/models/qwen_image/__init__.py": "",
    "vllm_omni/diffusion/models/utils.py": '''\
import torch


def helper():
    return None


def init_parameters(module, device, dtype):
    for name, param in module.named_parameters():
        with torch.device(device):
            fresh = torch.empty_like(param, dtype=dtype)
        setattr(module, name, fresh)
    return module
''',
}

# Where the synthetic tree's init_parameters and its empty_like line stand.
INIT_PARAMETERS_LINES = "8-13"
EMPTY_LIKE_LINE = 11


def write_tree(root: Path, doctor: dict[str, str | None] | None = None) -> Path:
    files = {**FILES, **(doctor or {})}
    for path, text in files.items():
        if text is None:
            continue
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root
