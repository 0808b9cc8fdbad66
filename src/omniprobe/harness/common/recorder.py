"""The one recorder of every engine's requests (serve, offline Omni, Diffusers): from what an
engine returned to a validated record. Engines only produce results; the recorder hashes and
measures the image, applies the structure gate (never to random weights, which have no output
structure to judge), and builds the record. Its callers write it."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from omniprobe.atomic import write_bytes_atomic
from omniprobe.classify.imaging import UnreadableImage, decode_pixels, measure, pixels_sha256
from omniprobe.classify.structure_gate import gate_record
from omniprobe.config.report_settings import StructureChecks
from omniprobe.digests import sha256_bytes
from omniprobe.evidence.models.requests import Measurement

M = TypeVar("M", bound=Measurement)

RANDOM_WEIGHTS_NOTE = ("random weights: the image means nothing, so the structure gate is not "
                       "applied (capacity only)")


def record_request(model: type[M], fields: dict, image: bytes | None, path: Path, *,
                   artifacts_dir: Path, checks: StructureChecks, save: bool,
                   unreadable: str = "malformed response: the image does not decode") -> M:
    """The record of one request. `image`: the bytes the engine returned (None: none); `save`
    writes them to `path` (an engine that wrote its own file passes False). An image that does
    not decode turns the request into an error, `unreadable` saying whose."""
    fields = dict(fields)
    pixels = None
    if fields.get("outcome") == "ok" and image is None:  # an ok record names its image
        fields.update(outcome="error", error="the answer says ok but holds no image")
    if image is not None:
        try:
            pixels = decode_pixels(image, path.name)
        except UnreadableImage as exc:
            fields.update(outcome="error", error=f"{unreadable}: {exc}")
        else:
            if save:
                write_bytes_atomic(path, image)
            fields.update(output_sha256=sha256_bytes(image), pixels_sha256=pixels_sha256(pixels),
                          artifact=str(path.relative_to(artifacts_dir)))
    if pixels is not None and fields.get("weights") == "random":
        fields.update(structure="unchecked", structure_note=RANDOM_WEIGHTS_NOTE)
    record = model.model_validate(fields)
    if pixels is not None and record.weights != "random":
        record = gate_record(record, measure(pixels, checks))
    return record
