"""The simulated server's HTTP API: /health, /ready, /v1/images/edits, /v1/images/generations."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO

from omniprobe.sim.model import Pipeline, Request


class BadRequest(ValueError):
    """Answered with 400, as the real server does for a bad form."""


@dataclass
class Faults:
    """Injected failures, for the harness's tests: each is the 1-based request number it hits."""

    crash: set[int] = field(default_factory=set)
    hang: set[int] = field(default_factory=set)
    malformed: set[int] = field(default_factory=set)
    fail: set[int] = field(default_factory=set)  # generation raises: 500, or the engine closes


_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"')


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], list[bytes]]:
    """Form fields and the `image` / `image[]` parts of a multipart/form-data body.

    Split on its boundary directly: the sim's own reading of the format, in C-speed byte
    splits (a four-reference form is some 2 MB)."""
    kind, _, params = content_type.partition(";")
    boundary = _BOUNDARY.search(params)
    if kind.strip().lower() != "multipart/form-data" or boundary is None:
        raise BadRequest("expected a multipart/form-data body")
    fields: dict[str, str] = {}
    images: list[bytes] = []
    for part in body.split(b"--" + boundary[1].encode())[1:]:
        if part.startswith(b"--"):  # the closing delimiter
            break
        head, separator, payload = part.partition(b"\r\n\r\n")
        if not separator:
            raise BadRequest("a multipart part without its blank line after the headers")
        disposition = next((line for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-disposition:")), b"")
        name = _NAME.search(disposition)
        payload = payload.removesuffix(b"\r\n")
        if name is None:
            continue
        if name[1] in (b"image", b"image[]"):
            images.append(payload)
        else:
            try:
                fields[name[1].decode()] = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(f"form field {name[1]!r} is not UTF-8 text") from None
    return fields, images


def _size(text: str | None, default: tuple[int, int]) -> tuple[int, int]:
    if not text:
        return default
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise BadRequest(f"size must be 'WxH', got {text!r}") from None
    return width, height


def _truthy(value) -> bool:
    return value is True or str(value).lower() in ("1", "true", "yes")


def build_request(fields: dict, images: list[bytes],
                  served_model_name: str) -> tuple[Request, bool]:
    """The model request and whether stage metrics were asked for; BadRequest like the real API."""
    if not fields.get("prompt"):
        raise BadRequest("prompt is required")
    if fields.get("response_format", "b64_json") != "b64_json":
        raise BadRequest("response_format must be 'b64_json'")
    if fields.get("model") not in (None, served_model_name):
        raise BadRequest(f"Model mismatch: {fields['model']!r} is not {served_model_name!r}")
    from PIL import Image  # here: the preflight's parse of the server's arguments draws nothing

    try:
        default = Image.open(BytesIO(images[0])).size if images else (1024, 1024)
    except OSError:
        raise BadRequest("the first image is not a readable image") from None
    width, height = _size(fields.get("size"), default)
    try:
        request = Request(prompt=fields["prompt"], references=images, width=width, height=height,
                          seed=int(fields.get("seed", 0)),
                          steps=int(fields.get("num_inference_steps", 20)))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return request, _truthy(fields.get("return_stage_metrics", False))


class SimService:
    """One pipeline, one request at a time, as the real single-GPU server runs them."""

    def __init__(self, pipeline: Pipeline, served_model_name: str, faults: Faults):
        self.pipeline, self.served_model_name, self.faults = pipeline, served_model_name, faults
        self.lock = threading.Lock()
        self.count = 0

    def handle(self, fields: dict, images: list[bytes], kind: str) -> tuple[int, dict | bytes]:
        started = time.perf_counter()
        request, stage_metrics = build_request(fields, images, self.served_model_name)
        with self.lock:
            self.count += 1
            number = self.count
            if number in self.faults.crash:
                print("RuntimeError: CUDA error: an illegal memory access was encountered",
                      file=sys.stderr, flush=True)
                os._exit(1)
            if number in self.faults.hang:
                time.sleep(3600)
            if number in self.faults.fail:
                raise RuntimeError("simulated failure during generation")
            try:
                output = self.pipeline.generate(request)
            except self.pipeline.memory.oom_error as exc:
                traceback.print_exc()
                return 500, {"error": {"message": f"Image {kind} failed: {exc}",
                                       "type": "InternalServerError", "code": 500},
                             "simulated": True,
                             "sim_account": self.pipeline.memory.account().as_dict()}
            account = self.pipeline.memory.account().as_dict()
        print(f"sim account: {json.dumps(account)}", file=sys.stderr, flush=True)
        if number in self.faults.malformed:
            return 200, b'{"created": 1, "data": [{"b64_json": "'
        body = {
            "created": int(time.time()),
            "data": [{"b64_json": base64.b64encode(output.png).decode()}],
            "output_format": "png",
            "size": f"{request.width}x{request.height}",
            "metrics": {"stage_durations": {"diffusion": round(output.denoise_s, 4)},
                        "peak_memory_mb": round(output.peak_memory_mb, 1)},
            "simulated": True,
            "sim_account": account,
        }
        if stage_metrics:
            step_ms = 1000 * output.denoise_s / max(request.steps, 1)
            body["stage_metrics"] = {"diffusion": {"denoise_step_latency_ms": round(step_ms, 3)}}
        # The sim's own time (model, image, encoding), so a benchmark can subtract it.
        body["sim_handle_ms"] = round(1000 * (time.perf_counter() - started), 3)
        return 200, body


def make_handler(service: SimService):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:
            print(f"INFO:     {self.client_address[0]} - {fmt % args}", file=sys.stderr,
                  flush=True)

        def _send(self, status: int, body: dict | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "healthy"})
            elif self.path == "/ready":
                self._send(200, {"ready": True})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                if self.path == "/v1/images/edits":
                    fields, images = parse_multipart(self.headers.get("Content-Type", ""), body)
                    self._send(*service.handle(fields, images, "edit"))
                elif self.path == "/v1/images/generations":
                    self._send(*service.handle(json.loads(body or b"{}"), [], "generation"))
                else:
                    self._send(404, {"detail": "Not Found"})
            except (BadRequest, ValueError) as exc:
                self._send(400, {"error": {"message": str(exc), "type": "BadRequestError",
                                           "code": 400}})
            except Exception as exc:  # the real server answers 500 and stays up
                traceback.print_exc()
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}",
                                           "type": "InternalServerError", "code": 500}})

    return Handler


def serve(service: SimService, host: str, port: int) -> None:
    server = ThreadingHTTPServer((host, port), make_handler(service))
    print(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)",
          file=sys.stderr, flush=True)
    print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
    server.serve_forever()
