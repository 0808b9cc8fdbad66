"""The structure gate: a request that returned a broken image has structure 'broken', never served.

The one recorder (harness/common/recorder.py) calls `gate_record(record, measure(pixels, hosts.structure))`
on every request of every engine that returned an image, random weights excepted; the verdict
rules count a request as served only when its outcome is ok and its structure is sound.
"""

from __future__ import annotations

from omniprobe.classify.imaging import structure_reasons
from omniprobe.config.report_settings import StructureChecks
from omniprobe.evidence.models.common import StructureVerdict
from omniprobe.evidence.models.requests import ImageMetrics, Measurement


def structure_of(metrics: ImageMetrics | None, thresholds: StructureChecks | None = None) -> StructureVerdict:
    """The structure an image's metrics give: its recorded verdict, or re-derived under
    `thresholds` from the recorded figures; no metrics is 'unchecked'."""
    if metrics is None:
        return "unchecked"
    if thresholds is None:
        return metrics.verdict
    broken = structure_reasons(metrics.opaque_fraction, metrics.flatness, metrics.rgb_std,
                               thresholds)
    return "broken" if broken else "sound"


def gate_record(record: Measurement, metrics: ImageMetrics) -> Measurement:
    """The record with its image metrics attached and its structure set from them."""
    if record.outcome != "ok":
        under = getattr(record, "flag_set", None) or getattr(record, "configuration", None)
        raise ValueError(
            f"request {under}/{record.fixture}/seed {record.seed} has outcome "
            f"{record.outcome!r}; only an ok request returns an image to gate"
        )
    return record.model_copy(update={"image": metrics, "structure": structure_of(metrics)})
