"""Hostile input, round 3 (issue 35), class 4: secrets redacted by value as well as by pattern.
A runner or server that prints a secret of its environment bare (no `token=` before it) gets it
redacted wherever the harness writes: records, logs, results files, archives."""

from __future__ import annotations

import json
import tarfile

import pytest

from omniprobe.evidence import archive
from omniprobe.redaction import (
    REDACTED,
    redact_args,
    redact_bytes,
    redact_file,
    redact_text,
    secret_values,
)

TOKEN = "hf_QmFzZTY0SXNOb3RFbmNyeXB0aW9u"


@pytest.fixture(autouse=True)
def no_token_file(monkeypatch, tmp_path):
    """No hub login of the machine running the tests counts: its token file is looked for here."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)


@pytest.mark.parametrize(("environ", "text", "recorded"), [
    # The hub's tokens, printed bare by a runner.
    ({"HF_TOKEN": TOKEN}, f"loading with {TOKEN} now", f"loading with {REDACTED} now"),
    ({"HUGGING_FACE_HUB_TOKEN": TOKEN}, f"x{TOKEN}y", f"x{REDACTED}y"),
    # Any variable the secret-name pattern matches.
    ({"OPENAI_API_KEY": "sk-0123456789"}, "key sk-0123456789.", f"key {REDACTED}."),
    ({"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}, "wJalrXUtnFEMI", REDACTED),
    ({"DB_PASSWORD": "correct horse"}, "pw: correct horse!", f"pw: {REDACTED}!"),
    # As JSON writes a value inside a string: a quote or backslash escaped.
    ({"HF_TOKEN": 'ab"cd\\efgh'}, json.dumps({"e": 'x ab"cd\\efgh'}), json.dumps({"e": f"x {REDACTED}"})),
    # A secret that holds another is hidden whole.
    ({"HF_TOKEN": "abcdefgh", "API_KEY": "abcdefgh-longer"}, "abcdefgh-longer abcdefgh",
     f"{REDACTED} {REDACTED}"),
    # Not secrets: a name the pattern does not match, a value shorter than 8 characters.
    ({"TOKENIZERS_PARALLELISM": "false"}, "false alarm: false", "false alarm: false"),
    ({"HF_TOKEN": "1234567"}, "port 1234567", "port 1234567"),
    ({"HF_HOME": "/home/user/.cache/hf"}, "/home/user/.cache/hf/hub", "/home/user/.cache/hf/hub"),
    ({"MAX_TOKENS": "4096"}, "4096 tokens", "4096 tokens"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}, "0,1,2,3,4,5", "0,1,2,3,4,5"),
])
def test_a_secret_of_the_environment_is_redacted_by_its_value(monkeypatch, environ, text,
                                                               recorded):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert redact_text(text) == recorded
    assert redact_bytes(text.encode(), secret_values()) == recorded.encode()


def test_the_hubs_token_file_is_a_secret_too(monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    monkeypatch.setenv("HF_TOKEN_PATH", str(token))
    assert redact_text(f"Authorization header was {TOKEN}") == f"Authorization header was {REDACTED}"


@pytest.mark.parametrize(("args", "recorded"), [
    (["--model", f"https://hub.example/{TOKEN}/m"], ["--model", f"https://hub.example/{REDACTED}/m"]),
    ([f"--note={TOKEN}"], [f"--note={REDACTED}"]),
    (["--hf-token", TOKEN], ["--hf-token", REDACTED]),
])
def test_a_recorded_command_line_hides_the_value_anywhere(monkeypatch, args, recorded):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert redact_args(args) == recorded


def test_a_kept_log_is_rewritten_without_the_value(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    log = tmp_path / "runner.log"
    log.write_text(f"line one\nthe runner printed {TOKEN}\n")
    redact_file(log)
    assert log.read_text() == f"line one\nthe runner printed {REDACTED}\n"


def test_pack_ships_no_secret_of_its_environment(repo_copy, tmp_path, monkeypatch):
    """results.jsonl is the runner's own file, never redacted by the harness: pack redacts it,
    and any evidence or log it packs, by value."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    attempt, host = "2026-12-01T094615Z-diffusers-tiny-cpu-offline", "diffusers-tiny-cpu"
    runner = repo_copy.artifacts_dir / host / attempt / "tiny-cpu" / "runner-1"
    runner.mkdir(parents=True)
    (runner / "results.jsonl").write_text(json.dumps({"event": "ready", "note": TOKEN}) + "\n")
    (runner / "runner.log").write_text(f"env: HF={TOKEN}\n")
    packed = archive.pack(repo_copy, [attempt], tmp_path / "e.tgz", artifact_max_bytes=1 << 20)
    with tarfile.open(packed.path) as tar:
        data = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    assert TOKEN.encode() not in data and REDACTED.encode() in data


def test_a_server_that_logs_the_token_bare_leaves_it_nowhere(project, port, monkeypatch):
    """The sim logs the model it was given: a token inside a URL path matches no pattern, only
    its value."""
    from .conftest import in_process, probe_argv

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "fp8",
                                               "--model", f"https://hub.example/{TOKEN}/Qwen"))
    assert code == 0, out
    [folder] = (project.evidence_dir / "sim").iterdir()
    recorded = [folder / "attempt.json", folder / "runs.json",
                *project.artifacts_dir.glob("sim/*/*/*/server.log")]
    assert len(recorded) == 3
    for path in recorded:
        text = path.read_text()
        assert TOKEN not in text and f"hub.example/{REDACTED}/Qwen" in text, path


def test_an_offline_runners_results_file_is_redacted_where_it_is_kept(project, monkeypatch):
    """The runner writes results.jsonl itself; once it ends, the harness rewrites it, as it does
    the runner's log, so the artifact kept beside the evidence holds no secret either. Here the
    secret's value is part of the project's path, which every image path the runner reports
    holds."""
    from .conftest import in_process

    secret = project.root.name
    assert len(secret) >= 8
    monkeypatch.setenv("HF_TOKEN", secret)
    code, out = in_process(project, ["probe-offline", "--host", "sim", "--kwarg-set",
                                     "sim-offline-fp8", "--fixture", "sim-t2i"])
    assert code == 0, out
    [results] = project.artifacts_dir.glob("sim/*/*/runner-*/results.jsonl")
    assert REDACTED in results.read_text() and secret not in results.read_text()
