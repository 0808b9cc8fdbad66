"""upstream.json: the contract checks of the harness against one upstream vLLM-Omni source, and
the state of every code-read citation of the evidence in that source (`omniprobe upstream check`).

It lives in an attempt under evidence/upstream/, whose attempt.json says it was measured and
when; this file says which upstream was read (version, commit or digest) and what held there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from omniprobe.config.strict import STRICT

CheckStatus = Literal["pass", "fail", "not-found"]
CitationStatus = Literal["holds", "moved", "changed", "gone", "absent", "unanchored"]
UPSTREAM_HOST = "upstream"  # evidence/upstream/: the attempts of `upstream check`, no probe host


class _In(BaseModel):
    model_config = STRICT


class Anchor(_In):
    """What a code citation points at, so a later upstream can be searched for it: the symbol, a
    short snippet of the cited code, or the digest of the cited lines as read."""

    symbol: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                               description="The function or class the cited lines lie in.")
    snippet: str | None = Field(default=None, min_length=3, description="Text of one cited line.")
    lines_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the cited lines, each stripped, joined with newlines.")


class UpstreamSource(_In):
    """Which upstream was read."""

    package: str = "vllm-omni"
    kind: Literal["wheel", "tree", "git"]
    version: str | None = Field(description="`vllm_omni.__version__` as the source states it.")
    commit: str | None = Field(default=None, description="The git commit, where known.")
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="The wheel file's sha256, or a digest of an unpacked tree's files.")


class UpstreamCheck(_In):
    """One named check: PASS, FAIL or NOT FOUND, with the upstream file:line that decides it."""

    name: str = Field(pattern=r"^[a-z-]+:\S+$", description="group:subject, e.g. serve-flag:--omni.")
    status: CheckStatus
    where: str | None = Field(default=None, description="Upstream `file:line` that decides it.")
    detail: str


class CitationState(_In):
    """One code citation of the evidence, looked up in this source."""

    cited_in: str = Field(description="Evidence file and JSON path of the citation.")
    file: str = Field(description="The cited file, as cited.")
    lines: str | None = None
    status: CitationStatus
    found_file: str | None = Field(default=None, description="The file it resolved to.")
    found_lines: str | None = Field(default=None, description="Where it is now, when found.")
    detail: str


class UpstreamContract(_In):
    source: UpstreamSource
    vllm_source: UpstreamSource | None = Field(
        default=None, description="The vLLM whose serve parser the serve-flag checks of vLLM's "
                                  "own flags read (vLLM-Omni's starts from it); null: not read, "
                                  "those flags are NOT FOUND.")
    checks: list[UpstreamCheck] = Field(min_length=1)
    citations: list[CitationState] = []

    @property
    def failed(self) -> list[UpstreamCheck]:
        return [c for c in self.checks if c.status != "pass"]
