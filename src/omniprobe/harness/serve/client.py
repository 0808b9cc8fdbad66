"""One image request to the server, as the contract describes it, and what came back.

Edits go to /v1/images/edits as multipart with one `image` part per reference; text-to-image goes
to /v1/images/generations as JSON. The outcome is ok, oom, error or timeout; the probe's
recorder decodes, hashes, measures and saves the image that came back.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from omniprobe.classify.oom import error_message, is_oom, parse_oom
from omniprobe.config.fixtures import (
    Fixture,
    Sampling,
)
from omniprobe.evidence.models.common import OomSignature, Outcome
from omniprobe.harness.common.references import load_references
from omniprobe.harness.common.urls import url
from omniprobe.protocol import EDITS_PATH, GENERATIONS_PATH, IMAGE_PART
from omniprobe.safe_io import json_loads


@dataclass(frozen=True)
class Reply:
    """What one request produced, before it becomes an evidence record."""

    outcome: Outcome
    wall_s: float
    image: bytes | None = None
    server_peak_mb: float | None = None
    denoise_step_latency_ms: float | None = None
    oom: OomSignature | None = None
    error: str | None = None
    status: int | None = None
    transport_failure: bool = False  # no answer at all: the connection failed


def form_fields(fixture: Fixture, seed: int, sampling: Sampling) -> dict[str, str]:
    """The form fields of a request, in protocol.FORM_FIELDS' order (tests/test_client.py)."""
    return {
        "prompt": fixture.prompt,
        "size": f"{fixture.width}x{fixture.height}",
        "seed": str(seed),
        "num_inference_steps": str(sampling.num_inference_steps),
        "true_cfg_scale": str(sampling.true_cfg_scale),
        "response_format": "b64_json",
        "return_stage_metrics": "true",
    }


def _metric(body: dict, name: str) -> float | None:
    """A stage metric wherever the build puts it: top-level stage_metrics or under metrics."""
    for holder in (body.get("stage_metrics"), (body.get("metrics") or {}).get("stage_metrics")):
        if isinstance(holder, dict):
            for stage in holder.values():
                if isinstance(stage, dict) and isinstance(stage.get(name), int | float):
                    return float(stage[name])
    return None


def parse_success(content: bytes, wall_s: float) -> Reply:
    """A 200 answer: the first image's bytes and the metrics; an unreadable body is an error.

    Whether the bytes decode as an image is checked where its pixels are hashed."""
    try:
        body = json_loads(content)
        b64 = body["data"][0]["b64_json"]
        image = base64.b64decode(b64, validate=True)
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as exc:
        return Reply("error", wall_s, error=f"malformed response: {type(exc).__name__}: "
                                            f"{str(exc)[:200]} (body starts {content[:80]!r})")
    peak = (body.get("metrics") or {}).get("peak_memory_mb")
    return Reply("ok", wall_s, image=image,
                 server_peak_mb=float(peak) if isinstance(peak, int | float) else None,
                 denoise_step_latency_ms=_metric(body, "denoise_step_latency_ms"), status=200)


def parse_failure(status: int, text: str, wall_s: float) -> Reply:
    """A non-200 answer: an OOM when the message is PyTorch's OOM text, else an error."""
    message = error_message(text)
    if is_oom(message):
        return Reply("oom", wall_s, oom=parse_oom(message, "request"), status=status,
                     error=message[:500])
    return Reply("error", wall_s, error=f"HTTP {status}: {message[:500]}", status=status)


def send(base_url: str, fixture: Fixture, seed: int, sampling: Sampling, fixtures_dir: Path,
         timeout_s: float, session: requests.Session | None = None) -> Reply:
    """Send one request and wait for its answer; never raises for what the server does."""
    fixture.require_runnable()
    http = session or requests.Session()
    fields = form_fields(fixture, seed, sampling)
    if fixture.kind == "edit":
        files = [(IMAGE_PART, (name, data, "image/png"))
                 for name, data in load_references(fixture, fixtures_dir)]
        call = {"url": url(base_url, EDITS_PATH), "data": fields, "files": files}
    else:
        body = {**fields, "seed": seed, "num_inference_steps": sampling.num_inference_steps,
                "true_cfg_scale": sampling.true_cfg_scale, "return_stage_metrics": True}
        call = {"url": url(base_url, GENERATIONS_PATH), "json": body}
    started = time.perf_counter()
    try:
        response = http.post(**call, timeout=timeout_s)
    except requests.Timeout:
        return Reply("timeout", time.perf_counter() - started,
                     error=f"no answer within {timeout_s:g} s")
    except requests.ConnectionError as exc:
        return Reply("error", time.perf_counter() - started,
                     error=f"connection failed (server gone?): {str(exc)[:300]}",
                     transport_failure=True)
    wall_s = time.perf_counter() - started
    if response.status_code == 200:
        return parse_success(response.content, wall_s)
    return parse_failure(response.status_code, response.content.decode("utf-8", "replace"),
                         wall_s)
