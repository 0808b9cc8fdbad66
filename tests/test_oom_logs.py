"""The log reader on vLLM's own output (issue 34, item 5): coloured, prefixed lines from several
processes, read as the harness reads them (analysis/log_text.plain_log, then the parsers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.log_text import plain_log
from omniprobe.classify.oom import parse_oom
from omniprobe.config.hosts import load_hosts

REPO = Path(__file__).resolve().parents[1]
SITE = "/venv/lib/python3.12/site-packages"
MODEL = "vllm_omni/diffusion/models/qwen_image_21"
FULL = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 490.00 MiB. GPU 0 has a "
        "total capacity of 23.56 GiB of which 118.44 MiB is free. Including non-PyTorch memory, "
        "this process has 23.43 GiB memory in use. Of the allocated memory 21.02 GiB is allocated "
        "by PyTorch, and 1.84 GiB is reserved by PyTorch but unallocated.")
FULL_SIZES = {"requested": "490.00 MiB", "total_capacity": "23.56 GiB", "in_use": "23.43 GiB",
              "allocated": "21.02 GiB", "reserved_unallocated": "1.84 GiB"}


def vllm_lines(process: str, lines: list[str], level: str = "ERROR", at: str = "core.py:712") -> str:
    """How vLLM writes one multi-line record from a worker: its colour codes, the record prefix
    after every `\\r\\n`, and the worker's `(Name pid=N) ` before every line."""
    prefix = f"({process}) \x1b[1;31m{level}\x1b[0m 10-07 17:02:40 [{at}] "
    return prefix + f"\r\n{prefix}".join(lines) + "\n"


def frames(*where: tuple[str, int, str]) -> list[str]:
    out = []
    for file, line, func in where:
        out += [f'  File "{file}", line {line}, in {func}', "    statement()"]
    return out


ORIGINAL = ["Traceback (most recent call last):", *frames(
    (f"{SITE}/vllm_omni/diffusion/worker/gpu_worker.py", 210, "execute_model"),
    (f"{SITE}/{MODEL}/pipeline_qwen_image_21.py", 880, "predict_noise"),
    (f"{SITE}/{MODEL}/qwen_image_21_transformer.py", 293, "forward"),
    (f"{SITE}/torch/nn/modules/linear.py", 125, "forward")), FULL]
RERAISE = ["", "The above exception was the direct cause of the following exception:", "",
           "Traceback (most recent call last):", *frames(
               (f"{SITE}/vllm_omni/diffusion/worker/gpu_worker.py", 215, "execute_model")),
           "RuntimeError: CUDA out of memory"]
API_SHORT = vllm_lines("APIServer pid=11", [
    "Traceback (most recent call last):", *frames(
        (f"{SITE}/vllm_omni/entrypoints/openai/serving_image.py", 402, "edit")),
    "vllm_omni.engine.EngineGenerateError: CUDA out of memory"], at="serving_image.py:410")
INFO = vllm_lines("APIServer pid=11", ['127.0.0.1:51234 - "POST /v1/images/edits" 500'],
                  level="INFO", at="api_server.py:90")
WORKER = "EngineCore_DP0 pid=12"

# case -> (raw log, the sizes the signature holds, the location's file tail and line)
LOGS = {
    "a later short mention keeps the full message's sizes":
        (vllm_lines(WORKER, ORIGINAL) + API_SHORT + INFO, FULL_SIZES,
         ("qwen_image_21_transformer.py", "293")),
    "a chained re-raise is located at the original raise":
        (vllm_lines(WORKER, ORIGINAL + RERAISE) + INFO, FULL_SIZES,
         ("qwen_image_21_transformer.py", "293")),
    "a re-raise repeating the full message is still located at the original":
        (vllm_lines(WORKER, ORIGINAL + RERAISE[:-1] + [FULL.replace("torch.OutOfMemoryError",
                                                                    "RuntimeError")]),
         FULL_SIZES, ("qwen_image_21_transformer.py", "293")),
    "another process's lines between the worker's records":
        (INFO + vllm_lines(WORKER, ORIGINAL) + INFO + API_SHORT + INFO, FULL_SIZES,
         ("qwen_image_21_transformer.py", "293")),
    "a handling-time chain (During handling ...) is located at the first":
        (vllm_lines(WORKER, ORIGINAL + ["", "During handling of the above exception, another "
                                        "exception occurred:", ""] + RERAISE[3:]),
         FULL_SIZES, ("qwen_image_21_transformer.py", "293")),
}


@pytest.mark.parametrize(("log", "sizes", "where"), LOGS.values(), ids=LOGS.keys())
def test_an_oom_in_vllm_output_keeps_its_sizes_and_its_original_location(log, sizes, where):
    model_code = tuple(load_hosts(REPO / "hosts.toml").host("rtx3090").model_code)
    sig = parse_oom(plain_log(log), "request", model_code)
    assert {k: v for k, v in sig.model_dump().items() if k in FULL_SIZES and v} == sizes
    assert (sig.location.file.rsplit("/", 1)[-1], sig.location.lines) == where
    assert sig.location.file.startswith(MODEL)


def crash(file: str, error: str) -> str:
    return vllm_lines("APIServer pid=11", ["Traceback (most recent call last):", *frames(
        (f"{SITE}/vllm_omni/entrypoints/openai/api_server.py", 120, "handler"),
        (f"{SITE}/{file}", 77, "run")), error], at="serving_image.py:410") + INFO


# Where a host states no model_code (the real cards), a crash is the card's only in the model's
# own folder; elsewhere in vLLM-Omni it is the server software's.
CRASHES = [
    ("vllm_omni/entrypoints/openai/serving_image.py", "KeyError: 'image'", "server"),
    ("vllm_omni/engine/stage_manager.py", "IndexError: list index out of range", "server"),
    ("vllm_omni/diffusion/models/flux/transformer.py", "RuntimeError: shape", "server"),
    (f"{MODEL}/qwen_image_21_transformer.py", "RuntimeError: shape mismatch", "card"),
]


@pytest.mark.parametrize(("file", "error", "kind"), CRASHES, ids=[c[0] for c in CRASHES])
@pytest.mark.parametrize("host", ["rtx3090", "rtx5080", "rtx3090-on-h200"])
def test_a_crash_counts_against_the_card_only_in_the_models_own_folder(host, file, error, kind):
    model_code = tuple(load_hosts(REPO / "hosts.toml").host(host).model_code)
    assert classify_failure(plain_log(crash(file, error)), model_code).kind == kind


def test_a_host_that_states_model_code_keeps_it():
    cfg = load_hosts(REPO / "hosts.toml")
    assert cfg.host("sim").model_code == ["omniprobe/sim/model"]
    assert cfg.host("rtx3090").model_code == [f"{MODEL}/", "vllm_omni/diffusion/models/qwen_image_2_1/"]


def test_where_no_model_code_is_given_a_crash_in_vllm_omni_is_the_servers():
    # The harness's own fallback (a server started without the host's model_code) once took all
    # of vllm_omni/ for the model's code.
    from omniprobe.harness.common.process import classify_exit
    text = plain_log(crash("vllm_omni/entrypoints/openai/serving_image.py", "KeyError: 'image'"))
    result = classify_exit(1, text, 3.0)
    assert (result.outcome, result.cause.kind) == ("error", "server")
