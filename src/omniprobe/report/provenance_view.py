"""Where the evidence comes from, in words: attempts' provenance, the harness's own attempts and
the upstream contract's result."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.load import LoadedAttempt
from omniprobe.report.filters import num


def newest_upstream(attempts: list[LoadedAttempt]) -> LoadedAttempt | None:
    """The most recently run `upstream check` attempt, if any."""
    checked = [a for a in attempts if a.upstream is not None and a.meta.provenance.kind == "measured"]
    return max(checked, key=lambda a: a.meta.provenance.started_at, default=None)


def is_harness_attempt(a: LoadedAttempt, hosts: HostsConfig) -> bool:
    """The harness's own runs: simulated hosts (emulations of the simulated server included) and
    the upstream contract check."""
    host = hosts.hosts.get(a.host)
    return a.upstream is not None or a.simulated or (host is not None and host.simulated)


@dataclass(frozen=True)
class FailedCheck:
    name: str
    status_text: str
    where: str | None
    detail: str


@dataclass(frozen=True)
class Contract:
    held: int
    total: int
    failed: list[FailedCheck]


def contract(upstream: LoadedAttempt | None) -> Contract | None:
    if upstream is None:
        return None
    u = upstream.upstream
    shown = {"fail": "FAIL", "not-found": "NOT FOUND"}
    return Contract(
        sum(c.status == "pass" for c in u.checks),
        len(u.checks),
        [FailedCheck(c.name, shown.get(c.status, c.status.upper()), c.where, c.detail) for c in u.failed],
    )


def provenance_text(p) -> str:
    """Where an attempt's figures come from, in words."""
    if p.kind == "transcribed":
        return p.section
    if p.kind == "measured":
        return f"measured on `{p.hostname}` by omniprobe {p.tool_version}, started {p.started_at}"
    if p.kind == "emulated":
        server = ", server omniprobe.sim" if p.simulated_server else ""
        emulates = f" {p.emulates}" if p.emulates else ""
        return (
            f"emulated{emulates} capped at {num(p.cap_mib)} MiB on {p.physical_gpu} (compute capability "
            f"{p.physical_compute_capability}, `{p.hostname}`) by {p.mechanism}{server}, omniprobe "
            f"{p.tool_version}, started {p.started_at}"
        )
    return f"{p.model}, omniprobe {p.tool_version}, started {p.started_at}"


@dataclass(frozen=True)
class ProvenanceRow:
    """One host's attempts of one stack, machine and kind, for a measured part's table."""

    host: str
    kind: str
    attempts: list[str]
    dates: str
    machine: str
    stack: str


STACK_PACKAGES = ("torch", "transformers", "diffusers", "torchao", "vllm", "vllm-omni")


def _stack(a: LoadedAttempt, hosts: HostsConfig) -> str:
    """What the attempt ran on: its recorded packages; else, for the seed's own probe runs, the
    seed's pins (hosts.toml [stack]) unless the pins the attempt states differ from them; else
    those stated pins; another engine's run the seed transcribes (its Diffusers baseline) states
    none."""
    packages = a.meta.environment.packages if a.meta.environment is not None else {}
    if packages:
        return ", ".join(f"{name} {packages[name]}" for name in STACK_PACKAGES
                         if packages.get(name))
    s, pins = hosts.stack, a.meta.pins
    stated = [] if pins is None else [(what, value, pinned) for what, value, pinned in (
        ("torch", pins.torch, s.torch), ("upstream main", pins.upstream_commit,
                                         s.upstream_commit)) if value]
    probe_run = bool(a.runs or a.offline)
    if stated and not (probe_run and all(value == pinned for _, value, pinned in stated)):
        return ", ".join(f"{what} {value}" for what, value, _ in stated)
    if not probe_run:
        return "not stated"
    return (f"torch {s.torch}, transformers {s.transformers}, diffusers `{s.diffusers_commit}`, "
            f"vLLM-Omni {s.recipe_version} at `{s.upstream_commit}` (hosts.toml [stack])")


def _machine(a: LoadedAttempt, hosts: HostsConfig) -> str:
    p = a.meta.provenance
    if p.kind == "emulated":
        return f"{p.physical_gpu} (`{p.hostname}`)"
    if p.kind == "measured":
        return f"`{p.hostname}`"
    host = hosts.hosts.get(a.host)
    return (f"`{host.hostname}` ({host.name}, compute capability {host.compute_capability}; "
            f"{host.python_provider})" if host is not None else a.host)


def provenance_rows(attempts: list[LoadedAttempt], hosts: HostsConfig, *,
                    per_host: bool = True) -> list[ProvenanceRow]:
    """The attempts grouped by host, kind, machine and stack, in the order they come; without
    `per_host`, the hosts of one kind, machine and stack share a row (the short table, where a
    reader wants where evidence came from rather than which attempt)."""
    groups: dict[tuple[str, str, str, str], list[LoadedAttempt]] = {}
    for a in attempts:
        key = (a.host if per_host else "", a.meta.provenance.kind, _machine(a, hosts),
               _stack(a, hosts))
        groups.setdefault(key, []).append(a)
    return [ProvenanceRow(", ".join(dict.fromkeys(a.host for a in group)), kind,
                          [a.id for a in group],
                          ", ".join(sorted({a.meta.date for a in group})), machine, stack)
            for (_, kind, machine, stack), group in groups.items()]
