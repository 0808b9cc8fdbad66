"""The pieces every evidence format shares: outcome and digest types, the strict base model, code
references, OOM signatures and failure causes, artifact references."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from omniprobe.config.inside_path import InsidePath
from omniprobe.config.strict import STRICT
from omniprobe.evidence.quantities import Size
from omniprobe.evidence.upstream import Anchor
from omniprobe.limits import MAX_WAIT_S, require_timestamp

Outcome = Literal["ok", "oom", "error", "timeout"]
InitOutcome = Literal["ready", "oom", "error", "timeout"]
StructureVerdict = Literal["sound", "broken", "unchecked"]
PeakSource = Literal["worker-reserved", "sim-model", "torch-reserved"]
Weights = Literal["snapshot", "random"]
Sha256Prefix = Annotated[str, Field(pattern=r"^[0-9a-f]{8,64}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# When something ran: not before 2000, not after now (omniprobe.limits).
Timestamp = Annotated[datetime, AfterValidator(require_timestamp)]
Wall = Annotated[float, Field(ge=0, le=MAX_WAIT_S, description="Seconds, at most a week "
                                                               "(the longest timeout).")]


M = TypeVar("M", bound=BaseModel)


class EvidenceModel(BaseModel):
    # Strict when loaded (parse_file): no coercion of "2301" or true to an int; finite floats.
    model_config = STRICT


def replaced(model: M, **changes) -> M:
    """A copy of `model` with `changes`, validated as a new one (pydantic's model_copy checks
    nothing: a copy could hold what no file may)."""
    return type(model).model_validate({**dict(model), **changes})




class CodeRef(EvidenceModel):
    file: str
    lines: str | None = Field(default=None, pattern=r"^\d+(-\d+)?(ff)?$")
    function: str | None = None
    anchor: Anchor | None = Field(
        default=None, description="What `omniprobe upstream check` looks for in a later upstream.")

    def __str__(self) -> str:
        return f"{self.file}:{self.lines}" if self.lines else self.file


class OomSignature(EvidenceModel):
    """What PyTorch's CUDA OOM text says, field by field, sizes as written."""

    phase: Literal["init", "request"]
    requested: Size | None = None
    allocated: Size | None = Field(default=None, description="Allocated by PyTorch.")
    reserved_unallocated: Size | None = None
    in_use: Size | None = Field(default=None, description="This process's memory in use.")
    total_capacity: Size | None = None
    allowed: Size | None = Field(default=None, description="Only under a per-process cap.")
    location: CodeRef | None = Field(default=None, description="Innermost frame in model code.")
    via: str | None = None
    note: str | None = None


class EmulationBreach(EvidenceModel):
    """The first sample at which an emulated server's process tree held more than the cap."""

    t_s: float = Field(ge=0, description="Seconds since the server was started.")
    held_mib: float = Field(ge=0, description="What the process tree held then.")
    cap_mib: int = Field(gt=0)




class FailureCause(EvidenceModel):
    """Why an init or a request failed, as its log or error text shows it. Only `card` and `host`
    are evidence about the card on its host; the other kinds say the card was never measured."""

    kind: Literal["card", "host", "server", "environment"] = Field(
        description="card: the model or the card (CUDA OOM, a crash in model code); host: the "
                    "card's host ran out of RAM (the kernel killed the process for memory: "
                    "classify/host_ram.py), evidence about the host as the card's is; server: "
                    "the server software (a traceback in upstream code that is not an OOM); "
                    "environment: the harness or the environment (command not found, import "
                    "error, argument error, a port or permission problem, a dead connection).")
    reason: str = Field(description="What the text shows, e.g. \"import error: No module named 'x'\".")


class ArtifactRef(EvidenceModel):
    """A large file kept outside git, in the project's artifacts folder."""

    path: InsidePath = Field(description="Relative to the artifacts folder.")
    sha256: Sha256
    bytes: int = Field(ge=0)



CheckStatus = Literal["pass", "fail", "skip"]
