"""`omniprobe upstream check`: run the named checks and locate the evidence's code citations in
one upstream source; record the result as evidence, or compare it with the recorded one."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

from omniprobe import __version__
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project
from omniprobe.errors import InputError, Problem
from omniprobe.evidence.attempts import file_attempt
from omniprobe.evidence.load import LoadedAttempt, load_evidence
from omniprobe.evidence.models.attempt import Attempt, Measured
from omniprobe.evidence.upstream import UPSTREAM_HOST, UpstreamContract, UpstreamSource
from omniprobe.upstream.anchors import citations, locate, source_record
from omniprobe.upstream.checks import run_checks
from omniprobe.upstream.source import open_source


def check_source(project: Project, path: Path, vllm_path: Path | None = None) -> UpstreamContract:
    """Every check and every citation's state in the source at `path`, vLLM's own serve flags
    read from vLLM's source at `vllm_path`. Without one, the checks of those flags are the
    committed attempt's of the same source (CI does not download vLLM's wheel), which name the
    vLLM they read."""
    source = open_source(path)
    vllm = None if vllm_path is None else open_source(vllm_path, "vllm")
    cfg = load_hosts(project.hosts_file)
    evidence, problems = load_evidence(project.evidence_dir)
    if problems:
        raise InputError(problems)
    # Simulated evidence cites omniprobe.sim's own code, and a Diffusers host's cites diffusers'
    # and transformers': neither is upstream's.
    diffusers_hosts = {name for name, host in cfg.hosts.items() if host.diffusers is not None}
    cited = citations([a for a in evidence.attempts
                       if a.host != UPSTREAM_HOST and not a.simulated
                       and a.host not in diffusers_hosts])
    contract = UpstreamContract(
        source=source_record(source), vllm_source=None if vllm is None else source_record(vllm),
        checks=run_checks(source, cfg, project.root, vllm),
        citations=[locate(source, c) for c in cited])
    return contract if vllm is not None else _with_recorded_vllm(evidence.attempts, contract)


def _with_recorded_vllm(attempts: list[LoadedAttempt], contract: UpstreamContract
                        ) -> UpstreamContract:
    """The contract with the serve-flag checks that a committed attempt of the same source read
    off vLLM, in place of NOT FOUND; as it was where none did."""
    read = [a.upstream for a in attempts if a.host == UPSTREAM_HOST and a.upstream
            and a.upstream.source == contract.source and a.upstream.vllm_source is not None]
    if not read:
        return contract
    newest = read[-1]
    recorded_checks = {c.name: c for c in newest.checks}
    checks = [recorded_checks.get(c.name, c) if c.status == "not-found"
              and c.name.startswith("serve-flag:") else c for c in contract.checks]
    return contract.model_copy(update={"vllm_source": newest.vllm_source, "checks": checks})


def check_clone(cfg: HostsConfig, path: Path, root: Path,
                vllm_path: Path | None = None) -> UpstreamContract:
    """The named checks alone against the source at `path` (a host env's own clone), vLLM's
    flags read from the vLLM at `vllm_path` (the env's installed one); the evidence's citations
    are the upstream session's to locate."""
    source = open_source(path)
    vllm = None if vllm_path is None else open_source(vllm_path, "vllm")
    return UpstreamContract(source=source_record(source),
                            vllm_source=None if vllm is None else source_record(vllm),
                            checks=run_checks(source, cfg, root, vllm), citations=[])


def _source_id(src: UpstreamSource) -> str:
    mark = (src.commit or src.sha256 or "unidentified")[:12]
    return f"{src.package}-{src.version or 'unknown'}-{src.kind}-{mark}"


def attempt_id(contract: UpstreamContract) -> str:
    vllm = contract.vllm_source
    return _source_id(contract.source) + (f"-with-{_source_id(vllm)}" if vllm else "")


def record(project: Project, contract: UpstreamContract, command: list[str]) -> Path:
    """A new attempt under evidence/upstream/; an attempt of the same source is never replaced."""
    folder = project.evidence_dir / UPSTREAM_HOST / attempt_id(contract)
    if folder.exists():
        raise InputError([Problem(str(folder), "", "this upstream source is already recorded; "
                                  "remove the folder to record it again")])
    now = datetime.now(UTC).replace(microsecond=0)
    version = contract.source.version or "unknown version"
    meta = Attempt(id=folder.name, host=UPSTREAM_HOST, date=now.date().isoformat(),
                   description=f"Contract checks of the harness against {contract.source.package} "
                               f"{version} ({contract.source.kind}), read from its code",
                   provenance=Measured(kind="measured", host=UPSTREAM_HOST,
                                       hostname=socket.gethostname(), tool_version=__version__,
                                       command=command, started_at=now))
    return file_attempt(folder, meta, {"upstream.json": contract})


def recorded(project: Project, contract: UpstreamContract) -> LoadedAttempt | None:
    """The committed attempt of the same upstream source, if any."""
    evidence, problems = load_evidence(project.evidence_dir)
    if problems:
        raise InputError(problems)
    return next((a for a in evidence.attempts if a.host == UPSTREAM_HOST and a.upstream
                 and a.upstream.source == contract.source
                 and a.upstream.vllm_source == contract.vllm_source), None)


def differences(committed: UpstreamContract, fresh: UpstreamContract) -> list[str]:
    """Each check or citation whose result differs (status or upstream location)."""
    checks = _changes({c.name: c for c in committed.checks}, {c.name: c for c in fresh.checks},
                      "{}", ("only in the fresh run", "no longer checked"),
                      lambda c: (c.status, c.where), lambda c: f"{c.status} at {c.where}")
    cited = _changes({c.cited_in: c for c in committed.citations},
                     {c.cited_in: c for c in fresh.citations},
                     "citation {}", ("new", "no longer in the evidence"),
                     lambda c: (c.status, c.found_file, c.found_lines),
                     lambda c: f"{c.status} {c.found_lines or ''}".rstrip())
    return checks + cited


def _changes(old: dict, new: dict, label: str, absent: tuple[str, str], result, said) -> list[str]:
    """A line for each key in one of `old` and `new` only (`absent`: its words when only the new
    one has it, and when only the old one does), or whose `result` differs."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            out.append(f"{label.format(key)}: {absent[0] if a is None else absent[1]}")
        elif result(a) != result(b):
            out.append(f"{label.format(key)}: committed {said(a)}, now {said(b)}")
    return out


STATUS_TEXT = {"pass": "PASS", "fail": "FAIL", "not-found": "NOT FOUND"}


def render(contract: UpstreamContract) -> str:
    """The checks and citations as lines of text, for the terminal."""
    src = contract.source
    ident = src.commit or (f"sha256 {src.sha256}" if src.sha256 else "unidentified")
    lines = [f"{src.package} {src.version or '(version unknown)'} ({src.kind}, {ident})"]
    if contract.vllm_source is not None:
        v = contract.vllm_source
        lines.append(f"vLLM's own serve flags read from {v.package} {v.version} ({v.kind}, "
                     f"{v.commit or v.sha256})")
    for c in contract.checks:
        lines.append(f"{STATUS_TEXT[c.status]:9}  {c.name}  [{c.where or '-'}]  {c.detail}")
    held = sum(c.status == "pass" for c in contract.checks)
    lines.append(f"{held} of {len(contract.checks)} checks hold")
    for c in contract.citations:
        at = f" -> {c.found_file}:{c.found_lines}" if c.found_lines else ""
        lines.append(f"citation {c.status:10} {c.file}:{c.lines or ''}{at}  ({c.cited_in})")
    return "\n".join(lines)
