"""Parsing the server's answers: success, OOM, other errors, and malformed bodies."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from omniprobe.config.fixtures import load_fixtures
from omniprobe.config.hosts import load_hosts
from omniprobe.harness.serve.client import form_fields, parse_failure, parse_success
from omniprobe.harness.serve.plan import ServeSettings
from omniprobe.harness.serve.probe import ServeProbe
from omniprobe.protocol import FORM_FIELDS

from .conftest import open_sim_attempt
from .test_oom import CONTRACT


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGBA", (8, 6), (1, 2, 3, 255)).save(buffer, "PNG")
    return buffer.getvalue()


def body(**extra) -> bytes:
    return json.dumps({"data": [{"b64_json": base64.b64encode(png()).decode()}],
                       **extra}).encode()


def test_success_with_metrics_where_either_build_puts_them():
    reply = parse_success(body(metrics={"peak_memory_mb": 21504.5, "stage_durations": None},
                               stage_metrics={"diffusion": {"denoise_step_latency_ms": 1830.0}}),
                          1.5)
    assert (reply.outcome, reply.server_peak_mb, reply.denoise_step_latency_ms) == (
        "ok", 21504.5, 1830.0)
    nested = parse_success(body(metrics={"stage_metrics": {"dit": {
        "denoise_step_latency_ms": 12}}}), 1.0)
    assert nested.denoise_step_latency_ms == 12.0 and nested.server_peak_mb is None
    assert parse_success(body(), 1.0).image == png()  # older builds send no metrics


@pytest.mark.parametrize(("content", "kind"), [
    (b'{"created": 1, "data": [{"b64_json": "', "JSONDecodeError"),
    (b'{"data": []}', "IndexError"),
    (b'{"data": [{"url": "http://x"}]}', "KeyError"),
    (b'{"data": [{"b64_json": "***"}]}', "Error"),  # binascii.Error
    (b"<html>502</html>", "JSONDecodeError"),
])
def test_malformed_success_bodies_are_errors(content, kind):
    reply = parse_success(content, 0.1)
    assert reply.outcome == "error" and reply.image is None
    assert reply.error.startswith(f"malformed response: {kind}: ")


def test_failures():
    oom = parse_failure(500, json.dumps({"detail": "Image edit failed: " + CONTRACT}), 2.0)
    assert oom.outcome == "oom" and oom.oom.requested == "1024.00 MiB" and oom.status == 500
    bad = parse_failure(400, json.dumps({"error": {"message": "Received 5 input images. At most "
                                                              "4 images are supported"}}), 0.1)
    assert bad.outcome == "error" and bad.error.startswith("HTTP 400: Received 5 input images")


def test_form_fields_follow_the_contract(project):
    suite = load_fixtures(project.fixtures_file)
    fields = form_fields(suite.get("sim-pair"), 2302, suite.sampling)
    assert fields == {"prompt": suite.get("sim-pair").prompt, "size": "64x48", "seed": "2302",
                      "num_inference_steps": "20", "true_cfg_scale": "1.0",
                      "response_format": "b64_json", "return_stage_metrics": "true"}
    assert tuple(fields) == FORM_FIELDS  # what the upstream checks hold against the server


def test_image_that_does_not_decode_is_recorded_as_an_error(project):
    cfg, suite = load_hosts(project.hosts_file), load_fixtures(project.fixtures_file)
    store = open_sim_attempt(project, ["test"], fresh=True)
    probe = ServeProbe(cfg, suite, project.fixtures_file.parent, project.hosts_file, "sim", store,
                       ServeSettings(port=1, model="m", ready_timeout_s=1, request_timeout_s=1,
                                     grace_s=1))
    fields = {"flag_set": "fp8", "fixture": "sim-t2i", "seed": 1, "outcome": "ok",
              "structure": "unchecked", "wall_s": 0.1}
    images = store.artifacts / "fp8" / "images"
    shown = []  # what the console is told, after each record is written
    probe._record(dict(fields), b"\x89PNG but not really", images / "x.png", shown.append)
    probe._record(dict(fields, seed=2), png(), images / "y.png", shown.append)
    store.close()
    first, second = store.requests
    assert shown == store.requests
    assert first.outcome == "error" and "the image does not decode" in first.error
    assert first.output_sha256 is None and not (images / "x.png").exists()
    assert second.outcome == "ok" and len(second.pixels_sha256) == 64
