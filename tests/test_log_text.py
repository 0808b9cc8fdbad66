"""Server logs read as vLLM writes them (issue 23 item 4): colour codes (vLLM-Omni forces
VLLM_LOGGING_COLOR=1), the worker's `(Name pid=N) ` prefix and vLLM's record prefix, which its
NewLineFormatter repeats after `\\r\\n` on every line of a traceback. A non-OOM crash is then
named by its exception line."""

from __future__ import annotations

import pytest

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.log_text import plain_log
from omniprobe.harness.common.logs import log_tail

SITE = "/venv/lib/python3.13/site-packages"
# vllm/utils _add_prefix, vllm/logging_utils/formatter.py ColoredFormatter (levelname coloured,
# asctime and [file:line] grey), NewLineFormatter ("\r\n" + the prefix on each message line).
WORKER = "\x1b[1;36m(EngineCore_DP0 pid=4242)\x1b[0;0m "
RECORD = "\x1b[31mERROR\x1b[0m \x1b[90m11-30 10:00:00\x1b[0m \x1b[90m[core.py:708]\x1b[0m "
TRACEBACK = [
    "EngineCore failed to start.",
    "Traceback (most recent call last):",
    f'  File "{SITE}/vllm/v1/engine/core.py", line 699, in run_engine_core',
    "    engine_core = EngineCoreProc(*args, **kwargs)",
    f'  File "{SITE}/vllm_omni/diffusion/registry.py", line 88, in resolve',
    "    raise ValueError(f\"unsupported pipeline {name}\")",
    "ValueError: unsupported pipeline QwenImageEditPlusPipeline",
]
VLLM_LOG = ("\x1b[32mINFO\x1b[0m \x1b[90m11-30 09:59:58\x1b[0m \x1b[90m[api_server.py:1901]\x1b[0m "
            "vLLM API server version 0.31.0\n"
            + "".join(f"{WORKER}{RECORD}{line}\r\n" for line in TRACEBACK[:-1])
            + f"{WORKER}{RECORD}{TRACEBACK[-1]}\n")


@pytest.mark.parametrize(("raw", "plain"), [
    (VLLM_LOG, "vLLM API server version 0.31.0\n" + "\n".join(TRACEBACK) + "\n"),
    ("\x1b[33mWARNING\x1b[0m \x1b[90m11-30 10:00:00\x1b[0m \x1b[90m[resolver.py:88]\x1b[0m "
     "No registered PipelineConfig resolved for model X",
     "No registered PipelineConfig resolved for model X"),
    ("(APIServer pid=1) (EngineCore_DP0 pid=2) INFO 11-30 10:00:00.123 [a.py:1] hi", "hi"),
    ("plain line\nKeyError: 3", "plain line\nKeyError: 3"),   # nothing to undo
    ("INFO is a word [not:a record]", "INFO is a word [not:a record]"),
])
def test_plain_log(raw, plain):
    assert plain_log(raw) == plain
    assert plain_log(plain_log(raw)) == plain_log(raw)


def test_a_crash_in_vllms_log_format_is_named_by_its_exception_line():
    cause = classify_failure(plain_log(VLLM_LOG), ())
    assert (cause.kind, cause.reason) == (
        "server", f"traceback in server code: {SITE}/vllm_omni/diffusion/registry.py:88 in "
                  "resolve: ValueError: unsupported pipeline QwenImageEditPlusPipeline")
    assert log_tail(plain_log(VLLM_LOG), 1) == TRACEBACK[-1]


def test_a_server_that_dies_in_vllms_log_format_records_its_exception_plain(
        project, port, monkeypatch, tmp_path):
    """End to end: a server writes VLLM_LOG and exits at init; the init's note and cause read
    the exception line, with no colour code or prefix left in them."""
    from omniprobe.evidence.load import load_attempt
    from omniprobe.harness.common import probe_env

    from .conftest import in_process, probe_argv

    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG, newline="")
    monkeypatch.setattr(probe_env, "sim_preflight", lambda *a, **k: [])
    hosts = project.hosts_file.read_text()
    sim_serve = '["{python}", "-m", "omniprobe.sim", "serve", '
    project.hosts_file.write_text(hosts.replace(sim_serve, (
        f'["{{python}}", "-c", "import sys; sys.stderr.write(open({str(log)!r}, newline=\'\')'
        '.read()); sys.exit(1)", '), 1))
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "fp8"))
    assert code == 0, out
    [folder] = (project.evidence_dir / "sim").iterdir()
    [run] = load_attempt(folder)[0].runs
    assert run.init.note == ("exited 1 before it was ready: ValueError: unsupported pipeline "
                             "QwenImageEditPlusPipeline")
    assert run.init.cause.reason.endswith(
        "registry.py:88 in resolve: ValueError: unsupported pipeline QwenImageEditPlusPipeline")
