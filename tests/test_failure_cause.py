"""Failures classified by cause, from real-looking log tails: only the card's count against it."""

from __future__ import annotations

import pytest

from omniprobe.classify.failure_cause import (
    classify_failure,
    effective_cause,
    is_card_evidence,
)
from omniprobe.evidence.models.common import FailureCause

MODEL_CODE = ("vllm_omni/diffusion/models/", "vllm_omni/model_executor/models/")
SITE = "/home/u/.cache/omniprobe/rtx3090/venv/lib/python3.13/site-packages"

IMPORT_ERROR = f"""INFO 11-30 10:00:01 [__init__.py:216] Automatically detected platform cuda.
Traceback (most recent call last):
  File "{SITE}/../../../bin/vllm", line 5, in <module>
    from vllm.entrypoints.cli.main import main
  File "{SITE}/vllm_omni/entrypoints/cli/serve.py", line 12, in <module>
    import vllm_omni_missing
ModuleNotFoundError: No module named 'vllm_omni_missing'
"""

UNKNOWN_FLAG = """usage: vllm serve [model_tag] [options]
vllm serve: error: unrecognized arguments: --enable-layerwise-offlaod
"""

INVALID_CHOICE = """usage: python -m omniprobe.sim serve [-h] model --omni
python -m omniprobe.sim serve: error: argument --quantization: invalid choice: 'int4'
"""

EXEC_FAILED = ("omniprobe.harness.common.supervise: cannot start /opt/venv/bin/vllm: [Errno 2] No such "
               "file or directory: '/opt/venv/bin/vllm'\n")

PORT_IN_USE = f"""Traceback (most recent call last):
  File "{SITE}/uvicorn/server.py", line 161, in startup
    server = await loop.create_server(
OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8091): address already \
in use
ERROR:    [Errno 98] Address already in use
"""

PERMISSION = f"""Traceback (most recent call last):
  File "{SITE}/vllm_omni/entrypoints/omni.py", line 88, in __init__
    os.makedirs(cache_dir)
PermissionError: [Errno 13] Permission denied: '/var/cache/vllm'
"""

MISSING_FILE = f"""Traceback (most recent call last):
  File "{SITE}/vllm_omni/diffusion/models/qwen_image/pipeline.py", line 40, in load
    with open(path) as f:
FileNotFoundError: [Errno 2] No such file or directory: '/snap/model_index.json'
"""

INIT_OOM = f"""Traceback (most recent call last):
  File "{SITE}/vllm_omni/diffusion/models/utils.py", line 162, in init_parameters
    param.data = torch.empty_like(param.data, device=device)
  File "{SITE}/torch/utils/_device.py", line 104, in __torch_function__
    return func(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total \
capacity of 15.47 GiB of which 20.19 MiB is free.
"""

SERVER_TRACEBACK = f"""Traceback (most recent call last):
  File "{SITE}/vllm_omni/entrypoints/async_omni.py", line 311, in _run_output_handler
    stage = self.stages[idx]
  File "{SITE}/vllm_omni/engine/stage_manager.py", line 77, in __getitem__
    raise KeyError(idx)
KeyError: 3
RuntimeError: Orchestrator initialization failed
"""

MODEL_CRASH = f"""Traceback (most recent call last):
  File "{SITE}/vllm_omni/engine/worker.py", line 120, in execute_model
    out = self.model(**inputs)
  File "{SITE}/vllm_omni/diffusion/models/qwen_image/transformer.py", line 402, in forward
    hidden = hidden.view(b, -1, self.heads, self.head_dim)
  File "{SITE}/torch/_tensor.py", line 1400, in view
    raise RuntimeError("shape mismatch")
RuntimeError: shape '[1, -1, 24, 128]' is invalid for input of size 1000
"""

DEAD_CONNECTION = ("connection failed (server gone?): HTTPConnectionPool(host='127.0.0.1', "
                   "port=8091): Max retries exceeded (Caused by NewConnectionError: [Errno 111] "
                   "Connection refused)")

# An optional import warning early in a log does not make a later model crash the environment's.
WARNING_THEN_CRASH = ("WARNING: Failed to import flash_attn: ImportError: libcuda.so.1\n"
                      + MODEL_CRASH)


@pytest.mark.parametrize(("text", "kind", "reason_starts"), [
    (IMPORT_ERROR, "environment", "import error: No module named 'vllm_omni_missing'"),
    ("/venv/bin/python3: No module named omniprobe.gone\n", "environment",
     "import error: No module named omniprobe.gone"),
    (UNKNOWN_FLAG, "environment", "argument error: unrecognized arguments: --enable-layerwise"),
    (INVALID_CHOICE, "environment", "argument error: argument --quantization: invalid choice"),
    (EXEC_FAILED, "environment", "command not found: /opt/venv/bin/vllm"),
    ("bash: vllm: command not found\n", "environment", "command not found: bash: vllm"),
    (PORT_IN_USE, "environment", "port in use:"),
    (PERMISSION, "environment", "permission refused: [Errno 13] Permission denied"),
    (MISSING_FILE, "environment", "missing file: [Errno 2] No such file"),
    (INIT_OOM, "card", "CUDA out of memory"),
    (SERVER_TRACEBACK, "server",
     "traceback in server code: " + SITE + "/vllm_omni/engine/stage_manager.py:77 in __getitem__"),
    (MODEL_CRASH, "card", "crash in model code: " + SITE
     + "/vllm_omni/diffusion/models/qwen_image/transformer.py:402 in forward: RuntimeError: shape"),
    (WARNING_THEN_CRASH, "card", "crash in model code"),
    (DEAD_CONNECTION, "environment", "dead connection: connection failed (server gone?)"),
], ids=["import", "python-m", "unknown-flag", "invalid-choice", "exec", "shell", "port", "permission",
        "missing-file", "oom", "server", "model-crash", "warning-then-crash", "dead-connection"])
def test_classify(text, kind, reason_starts):
    cause = classify_failure(text, MODEL_CODE)
    assert cause is not None
    assert (cause.kind, cause.reason[:len(reason_starts)]) == (kind, reason_starts)


def test_a_crashed_server_with_a_dead_connection_is_classified_by_its_log():
    text = DEAD_CONNECTION + "; the server is down (exited 1); its log ends:\n" + SERVER_TRACEBACK
    assert classify_failure(text, MODEL_CODE).kind == "server"


@pytest.mark.parametrize("text", ["", "exited 1 before it was ready", "INFO: loading weights\n"])
def test_nothing_recognisable_is_not_classified(text):
    assert classify_failure(text, MODEL_CODE) is None


def test_the_model_code_decides_between_card_and_server():
    assert classify_failure(MODEL_CRASH, ("omniprobe/sim/model",)).kind == "server"


ENV = FailureCause(kind="environment", reason="import error: No module named 'x'")


@pytest.mark.parametrize(("outcome", "cause", "kind", "evidence"), [
    ("ready", None, None, True),
    ("ok", None, None, True),
    ("oom", None, "card", True),  # transcribed OOMs record no cause: still the card's
    ("error", None, None, False),  # unclassified: not evidence about the card
    ("timeout", None, None, False),
    ("error", ENV, "environment", False),
    ("error", FailureCause(kind="server", reason="traceback"), "server", False),
    ("error", FailureCause(kind="card", reason="crash in model code"), "card", True),
])
def test_effective_cause(outcome, cause, kind, evidence):
    found = effective_cause(outcome, cause)
    assert (found.kind if found else None) == kind
    assert is_card_evidence(outcome, cause) is evidence


@pytest.mark.parametrize(("outcome", "text"), [
    ("timeout", "timed out: not the card's answer"),  # issue 34 item 4
    ("error", "not classified (error)"),
])
def test_a_failure_with_no_cause_is_named_for_what_it_is(outcome, text):
    from omniprobe.classify.failure_cause import cause_text

    assert cause_text(outcome, None) == text
