"""OOM parsing: PyTorch's text, the report's signatures, error bodies, the traceback frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omniprobe.classify.oom import error_message, innermost_model_frame, is_oom, merge, parse_oom
from omniprobe.evidence.models.common import CodeRef, OomSignature
from omniprobe.evidence.quantities import size_bytes
from omniprobe.sim.memory import format_size, oom_message

# The contract's text, seen on a real GPU under a 24 GiB per-process cap (wrapped as quoted).
CONTRACT = """CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of
139.80 GiB of which 115.29 GiB is free. Including non-PyTorch memory, this process has
24.51 GiB memory in use. 24.00 GiB allowed; Of the allocated memory 24.00 GiB is
allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved
but unallocated memory is large try setting
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. …"""

# The seed report's signatures hold only some of PyTorch's figures; each row parses just the
# clauses the report states, so nothing is invented for the rest.
CASES = [
    ("contract, capped", CONTRACT,
     {"requested": "1024.00 MiB", "total_capacity": "139.80 GiB", "in_use": "24.51 GiB",
      "allowed": "24.00 GiB", "allocated": "24.00 GiB", "reserved_unallocated": "0 bytes"}),
    ("3090 cpuoff, four references",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 490.00 MiB. Of the allocated "
     "memory 21.02 GiB is allocated by PyTorch, and 1.84 GiB is reserved by PyTorch but "
     "unallocated.",
     {"requested": "490.00 MiB", "allocated": "21.02 GiB", "reserved_unallocated": "1.84 GiB"}),
    ("3090 cpuoff-expandable, four references",
     "CUDA out of memory. Tried to allocate 490.00 MiB. Of the allocated memory 22.29 GiB is "
     "allocated by PyTorch, and 505.00 MiB is reserved by PyTorch but unallocated.",
     {"requested": "490.00 MiB", "allocated": "22.29 GiB", "reserved_unallocated": "505.00 MiB"}),
    ("3090 offline fp8_v",
     "CUDA out of memory. Tried to allocate 490.00 MiB. Of the allocated memory 20.86 GiB is "
     "allocated by PyTorch, and 2.14 GiB is reserved by PyTorch but unallocated.",
     {"requested": "490.00 MiB", "allocated": "20.86 GiB", "reserved_unallocated": "2.14 GiB"}),
    ("3090 default at init",
     "CUDA out of memory. Including non-PyTorch memory, this process has 23.51 GiB memory in use.",
     {"in_use": "23.51 GiB"}),
    ("5080 default at init",
     "CUDA out of memory. Tried to allocate 96.00 MiB. Of the allocated memory 15.22 GiB is "
     "allocated by PyTorch",
     {"requested": "96.00 MiB", "allocated": "15.22 GiB"}),
    ("5080 int8 at init",
     "CUDA out of memory. Tried to allocate 96.00 MiB. Including non-PyTorch memory, this "
     "process has 15.55 GiB memory in use.",
     {"requested": "96.00 MiB", "in_use": "15.55 GiB"}),
    ("small units",
     "CUDA out of memory. Tried to allocate 512 bytes. GPU 1 has a total capacity of 1.00 KiB of "
     "which 0 bytes is free. Including non-PyTorch memory, this process has 1024 bytes memory in "
     "use. Of the allocated memory 10.50 KiB is allocated by PyTorch, and 3.00 KiB is reserved by "
     "PyTorch but unallocated.",
     {"requested": "512 bytes", "total_capacity": "1.00 KiB", "in_use": "1024 bytes",
      "allocated": "10.50 KiB", "reserved_unallocated": "3.00 KiB"}),
    ("PyTorch before 2.1",
     "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.69 GiB total "
     "capacity; 21.83 GiB already allocated; 5.06 MiB free; 22.61 GiB reserved in total by "
     "PyTorch)",
     {"requested": "20.00 MiB", "total_capacity": "23.69 GiB", "allocated": "21.83 GiB"}),
]
FIELDS = ("requested", "total_capacity", "in_use", "allowed", "allocated", "reserved_unallocated")


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_sizes_parse_as_written(name, text, expected):
    sig = parse_oom(text, "request")
    assert sig is not None
    assert {f: getattr(sig, f) for f in FIELDS if getattr(sig, f) is not None} == expected


def test_text_without_oom_is_none():
    assert parse_oom("RuntimeError: CUDA error: an illegal memory access", "request") is None
    assert not is_oom("HTTP 400: prompt is required")


@pytest.mark.parametrize("body", [
    json.dumps({"error": {"message": "Image edit failed: " + CONTRACT, "type": "x", "code": 500}}),
    json.dumps({"detail": "Image edit failed: " + CONTRACT}),
    "Internal Server Error: " + CONTRACT,
], ids=["error.message", "detail", "plain"])
def test_http_bodies(body):
    message = error_message(body)
    assert message.startswith(("Image edit failed", "Internal Server Error"))
    sig = parse_oom(message, "request")
    assert sig.requested == "1024.00 MiB" and sig.allowed == "24.00 GiB"


REQUEST_LOG = """INFO 10-07 17:02:11 engine.py:12] Received request
ERROR 10-07 17:02:40 serving.py:88] Image edit failed
Traceback (most recent call last):
  File "/venv/lib/python3.13/site-packages/vllm_omni/entrypoints/openai/serving_image.py", line 402, in edit
    result = await self.engine.generate(request)
  File "/src/vllm-omni/vllm_omni/diffusion/models/qwen_image_21/pipeline_qwen_image_21.py", line 880, in predict_noise
    noise = self.transformer(latents)
  File "/venv/lib/python3.13/site-packages/torch/nn/modules/module.py", line 1773, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/src/vllm-omni/vllm_omni/diffusion/models/qwen_image_21/qwen_image_21_transformer.py", line 293, in forward
    hidden = self.img_mlp(hidden)
  File "/venv/lib/python3.13/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 490.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 118.44 MiB is free. Including non-PyTorch memory, this process has 23.43 GiB memory in use. Of the allocated memory 21.02 GiB is allocated by PyTorch, and 1.84 GiB is reserved by PyTorch but unallocated.
INFO:     127.0.0.1:51234 - "POST /v1/images/edits HTTP/1.1" 500 Internal Server Error
"""  # noqa: E501 - a log is as wide as it is


def test_log_gives_innermost_model_frame():
    sig = parse_oom(REQUEST_LOG, "request", ("vllm_omni/diffusion/models/qwen_image_21/",))
    assert sig.location == CodeRef(
        file="vllm_omni/diffusion/models/qwen_image_21/qwen_image_21_transformer.py",
        lines="293", function="forward")
    assert sig.allocated == "21.02 GiB" and sig.phase == "request"


def test_last_traceback_wins():
    first = REQUEST_LOG.replace("line 293", "line 100")
    sig = parse_oom(first + REQUEST_LOG, "request")
    assert sig.location.lines == "293"


def test_frame_outside_model_code_falls_back_to_innermost_non_library():
    text = ('Traceback (most recent call last):\n  File "/app/runner.py", line 7, in main\n'
            '  File "/usr/lib/python3.13/threading.py", line 1012, in run\n')
    assert innermost_model_frame(text) == CodeRef(file="/app/runner.py", lines="7",
                                                  function="main")


def test_merge_takes_body_figures_and_log_location():
    body = parse_oom(error_message(json.dumps({"detail": CONTRACT})), "request")
    log = parse_oom(REQUEST_LOG, "request")
    merged = merge(body, log)
    assert merged.requested == "1024.00 MiB" and merged.location == log.location
    assert merge(None, log) == log and merge(body, None) == body


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 bytes"), (1024, "1024 bytes"), (1025, "1.00 KiB"), (1024**2, "1024.00 KiB"),
    (490 * 1024**2, "490.00 MiB"), (1024**3, "1024.00 MiB"), (int(21.02 * 1024**3), "21.02 GiB"),
])
def test_sim_formats_sizes_like_pytorch(size, text):
    assert format_size(size) == text
    assert abs(size_bytes(text) - size) <= 0.005 * max(size, 1) + 1


def test_sim_message_round_trips():
    message = oom_message(requested=1536 * 1024**2, total=24 * 1024**3, free=512 * 1024**2,
                          in_use=int(23.5 * 1024**3), allocated=23 * 1024**3,
                          reserved=23 * 1024**3 + 64 * 1024**2, allowed=24 * 1024**3)
    sig = parse_oom(message, "request")
    assert sig == OomSignature(phase="request", requested="1.50 GiB", total_capacity="24.00 GiB",
                               in_use="23.50 GiB", allowed="24.00 GiB", allocated="23.00 GiB",
                               reserved_unallocated="64.00 MiB")


# PyTorch's own messages, captured on an NVIDIA H200 with torch 2.11.0+cu130 by
# tests/data/capture_oom_texts.py: case -> (requested, allocated, reserved, in use, total, allowed).
REAL = json.loads((Path(__file__).parent / "data" / "oom_real.json").read_text())
REAL_EXPECTED = {
    "capped_24gib": ("6.00 GiB", "20.00 GiB", "0 bytes", "20.51 GiB", "139.80 GiB", "24.00 GiB"),
    "capped_24gib_expandable": ("6.00 GiB", "20.00 GiB", "0 bytes", "20.51 GiB", "139.80 GiB",
                                "24.00 GiB"),
    "uncapped_too_large": ("4096.00 GiB", "0 bytes", "0 bytes", "518.00 MiB", "139.80 GiB", None),
    "capped_small_ask": ("490.00 MiB", "1000.00 MiB", "0 bytes", "1.48 GiB", "139.80 GiB",
                         "1024.00 MiB"),
}


@pytest.mark.parametrize("case", REAL, ids=[c["case"] for c in REAL])
def test_real_pytorch_messages(case):
    body = json.dumps({"error": {"message": f"Image edit failed: {case['message']}", "code": 500}})
    sig = parse_oom(error_message(body), "request")
    assert (sig.requested, sig.allocated, sig.reserved_unallocated, sig.in_use,
            sig.total_capacity, sig.allowed) == REAL_EXPECTED[case["case"]]
