"""A host verdict in lines an engineer can act on, each computed from the evidence.

The opening lines answer first (at most five): what binds, the usable ceiling, what a quantized
flag set does, and whether a spill path for the conditioning KV would change the verdict. The
detail then names, per flag set, the kind of block that keeps it from the target count.

Rules:
- What binds: every flag set failing init binds at init; otherwise the OOM a capacity-blocked
  flag set records at the target count (its ask, where in the model code) on top of the resident
  working set. The conditioning KV is excluded when a run whose cache knob reached the model (a
  smaller cache dtype) still fails at the target count with the same ask, or when the cache of all
  the target count's references together is smaller than that ask (each reference's at most the
  server-peak growth from one reference to two); otherwise it is not excluded.
- A flag set is quantized when its args carry `--quantization`; the others run the unquantized
  (BF16) weights. A count between the ceiling and the target with no unquantized cell was never
  measured at BF16.
- A spill path for the KV changes nothing as the next step when init binds (the cache never
  exists) or when the KV does not bind.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.analysis.verdicts import HostVerdict, UnreachedKnob
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.models.common import OomSignature
from omniprobe.evidence.models.runs import InitResult
from omniprobe.evidence.models.statements import CodeLocation
from omniprobe.evidence.quantities import Range, size_mib
from omniprobe.report.filters import count_range, flat_kwargs, names, num, refs, span

UNQUANTIZED = "BF16"  # the seed report's name for the model's unquantized weights
MIB_PER_MB = 1000**2 / 1024**2


@dataclass(frozen=True)
class Line:
    label: str
    text: str


def quantization(hosts: HostsConfig, flag_set: str) -> str | None:
    args = list(hosts.flag_sets[flag_set].args)
    if "--quantization" in args and args.index("--quantization") + 1 < len(args):
        return args[args.index("--quantization") + 1]
    return None


def common_args(hosts: HostsConfig, flag_sets) -> list[str]:
    """The args every named flag set passes, in the first one's order."""
    arg_lists = [list(hosts.flag_sets[f].args) for f in flag_sets]
    return [a for a in arg_lists[0] if all(a in other for other in arg_lists[1:])] if arg_lists else []


def config_names(flag_sets, unreached: tuple[UnreachedKnob, ...]) -> list[str]:
    """Flag sets as configurations: one whose knob never reached the model is written with its
    base ('cpuoff/cpuoff-fp8v'), once."""
    flag_sets = list(flag_sets)
    twins = {u.flag_set: u.base for u in unreached if u.base in flag_sets}
    out = []
    for name in flag_sets:
        if name in twins:
            continue
        aliases = [u.flag_set for u in unreached if u.base == name and u.flag_set in flag_sets]
        out.append("/".join([name, *aliases]))
    return out


def init_text(init: InitResult) -> str:
    """'ok', or '**OOM in 14 s** (23.51 GiB in use at load)'."""
    if init.outcome == "ready":
        return "ok"
    time = f" in {'~' if init.time_approx else ''}{num(init.time_s)} s" if init.time_s is not None else ""
    text = f"**{init.outcome.upper()}{time}**"
    oom = init.oom
    if oom is not None and (oom.in_use or oom.allocated):
        size, kind = (oom.in_use, "in use") if oom.in_use else (oom.allocated, "allocated")
        text += f" ({size} {oom.note or kind})"
    return text


def kv_per_reference_gib(deltas) -> Range | None:
    return Range.of(round(d.delta_mb / (1024**3 / 1000**2), 2) for d in deltas) if deltas else None


def shrunk_cache_ooms(s, ask: str | None) -> list[str]:
    """Offline kwarg sets that set a cache knob which reached the model and still OOM at the
    target count with the same ask."""
    if not ask:
        return []
    knobs = {d.knob for d in s.hosts.deploy_configs.values() if d.knob}
    unreached = {u.flag_set for u in s.verdict.unreached_offline}
    found = []
    for o in s.offline_results():
        ks = s.hosts.offline_kwarg_sets.get(o.configuration)
        kwargs = (ks.kwargs if ks is not None else None) or {}
        if (
            o.outcome == "oom"
            and o.oom is not None
            and o.oom.requested == ask
            and o.fixture
            and s.fixtures.get(o.fixture).reference_count == s.verdict.target_refs
            and o.configuration not in unreached
            and knobs & {k for k, _ in flat_kwargs(kwargs)}
        ):
            found.append(o.configuration)
    return list(dict.fromkeys(found))


def kv_excluded(s, ask: str | None) -> bool:
    """Whether the evidence shows the conditioning KV is not what binds (rules above)."""
    if shrunk_cache_ooms(s, ask):
        return True
    if not s.kv or not ask:
        return False
    return max(d.delta_mb for d in s.kv) * MIB_PER_MB * s.verdict.target_refs < size_mib(ask)


@dataclass(frozen=True)
class EarlyOom:
    """A flag set that runs out of memory below the target count."""

    flag_set: str
    reference_count: int
    oom: OomSignature


def early_ooms(rows, target: int) -> list[EarlyOom]:
    """Per flag set, its lowest reference count that OOMed below the target, with a signature."""
    found: dict[str, EarlyOom] = {}
    for row in rows:
        for count, cell in sorted(row.cells.items()):
            if (
                cell is not None
                and cell.outcome == "oom"
                and cell.oom is not None
                and count < target
                and row.view.flag_set not in found
            ):
                found[row.view.flag_set] = EarlyOom(row.view.flag_set, count, cell.oom)
    return list(found.values())


def where(location: str, code_read: list[CodeLocation]) -> str:
    """What the code read calls a location (its function), else the location itself."""
    for loc in code_read:
        if loc.ref is not None and str(loc.ref) == location and loc.ref.function:
            return f"the {loc.ref.function}"
    return f"`{location}`"


def _capacity_signature(v: HostVerdict):
    cap = next((b for b in v.blockers if b.kind == "capacity"), None)
    if cap is None:
        return None, None
    recorded = [g for g in cap.oom_signatures if g.requested]
    return cap, max(recorded, key=lambda g: len(g.flag_sets), default=None)


def binding_line(s) -> Line | None:
    v, hosts = s.verdict, s.hosts
    if v.blocker == "init":
        oom = s.init_oom
        text = f"all {len(v.failed_init)} flag sets run out of memory while the server starts"
        if oom is not None:
            text += f", at the same {oom.requested} allocation in `{oom.location.function or oom.location}`"
        return Line("What binds", text)
    cap, signature = _capacity_signature(v)
    if cap is None:
        return None
    if signature is None:
        return Line("What binds", f"{refs(v.target_refs)} run out of memory; no OOM signature is recorded")
    dtype = "" if any(quantization(hosts, f) for f in cap.flag_sets) else f"{UNQUANTIZED} "
    # The failing allocation is the first that did not fit, not the whole gap: "at least".
    text = (f"the resident {dtype}working set: the first failing allocation asks "
            f"{signature.requested} in {where(signature.location, s.collect('code_read'))}")
    shrunk = shrunk_cache_ooms(s, signature.requested)
    if shrunk:
        runs = f"{len(shrunk)} run{'s' if len(shrunk) > 1 else ''} with the conditioning KV"
        text += (f"; {runs} quantized fail{'s' if len(shrunk) == 1 else ''} on it too, so the KV "
                 "is not what binds (its size here is unmeasured)")
    elif kv_excluded(s, signature.requested):
        # Excluded by the estimate alone: the estimate is what the reader is given.
        per_ref = kv_per_reference_gib(s.kv)
        text += ("; the KV is not what binds (its size only estimated, from server-peak growth "
                 f"of {span(per_ref)} GiB per reference)")
    return Line("What binds", text)


def what_binds(s) -> str | None:
    """What binds a not-built host, in a few words, where the evidence excludes its conditioning
    KV (rules above); None otherwise."""
    v = s.verdict
    if v.verdict != "not-built":
        return None
    if v.blocker == "init":
        return "init"
    _, signature = _capacity_signature(v)
    if signature is None or not kv_excluded(s, signature.requested):
        return None
    cap = next(b for b in v.blockers if b.kind == "capacity")
    dtype = "" if any(quantization(s.hosts, f) for f in cap.flag_sets) else f"{UNQUANTIZED} "
    return (f"the resident {dtype}working set plus the {signature.requested} activation in "
            f"{where(signature.location, s.collect('code_read'))}")


def ceiling_line(s) -> Line | None:
    v, hosts = s.verdict, s.hosts
    if v.verdict != "not-built" or v.blocker == "init":
        return None
    if not v.highest_served_refs:
        return Line("Usable ceiling", "no reference count is served with sound output")
    unquantized = not any(quantization(hosts, f) for f in v.served_by)
    text = refs(v.highest_served_refs) + (f" at {UNQUANTIZED}" if unquantized else "")
    args = common_args(hosts, v.served_by)
    if args:
        text += " under " + " ".join(f"`{a}`" for a in args)
    measured = {
        count
        for row in s.rows
        if not quantization(hosts, row.view.flag_set)
        for count, cell in row.cells.items()
        if cell is not None
    }
    gaps = [n for n in range(v.highest_served_refs + 1, v.target_refs) if n not in measured]
    if gaps:
        text += f" ({names(str(n) for n in gaps)} never measured at {UNQUANTIZED})"
    for f in s.findings("ceiling"):
        text += f", {f.statement}"
    sp = s.ceiling_speedup
    if sp is not None:
        text += f", at {span(sp.speedup, 1)}× the {s.baseline_name} baseline's speed"
    return Line("Usable ceiling", text)


def ran_counts(s, flag_set: str) -> list[int]:
    return sorted(
        {
            count
            for row in s.rows
            if row.view.flag_set == flag_set
            for count, cell in row.cells.items()
            if cell is not None and count > 0
        }
    )


def fitting_counts(s, flag_set: str) -> list[int]:
    """The reference counts at which every cell of the flag set ran to an image."""
    cells = [
        (count, cell)
        for row in s.rows
        if row.view.flag_set == flag_set
        for count, cell in row.cells.items()
        if cell is not None and count > 0
    ]
    return sorted(
        {n for n, _ in cells} - {n for n, c in cells if c.outcome != "ok" or c.emulation_breach is not None}
    )


def unlock_lines(s) -> list[Line]:
    v, hosts = s.verdict, s.hosts
    lines = []
    for flag_set in dict.fromkeys(u.flag_set for u in v.capacity_unlocks):
        unlock = next(u for u in v.capacity_unlocks if u.flag_set == flag_set)
        method = quantization(hosts, flag_set)
        shown = f"`--quantization {method}`" if method else flag_set
        counts, ran = fitting_counts(s, flag_set), ran_counts(s, flag_set)
        outcome = {"broken": "its output is broken", "sound": "its output is sound"}.get(
            unlock.structure, "its output was not checked"
        )
        which = "every count it ran" if counts == ran else "only some of the counts it ran"
        lines.append(
            Line(
                f"What {flag_set} does",
                f"{shown} fits {which} ({count_range(counts)} references), and {outcome}",
            )
        )
    return lines


def change_line(s) -> Line | None:
    """What would change a not-built verdict, and whether a spill path for the conditioning KV
    would: the binding constraint decides both."""
    v = s.verdict
    if v.verdict != "not-built":
        return None
    label = "What would change it"
    if v.blocker == "init":
        return Line(label, "a load path that fits the card, which no flag set gives; not a KV "
                           "spill path: the server fails before the cache exists")
    _, signature = _capacity_signature(v)
    if signature is not None and kv_excluded(s, signature.requested):
        return Line(label, f"a working set leaner by at least the {signature.requested} ask at "
                           f"{refs(v.target_refs)}, with sound output; not a KV spill path")
    return Line(label, "not shown: no measurement excludes the conditioning KV, so a spill path "
                       "for it might")


def opening_lines(s) -> list[Line]:
    lines = [binding_line(s), ceiling_line(s), *unlock_lines(s), change_line(s)]
    return [line for line in lines if line is not None][:5]


def headline(s) -> str:
    """The card, its verdict, and what the verdict means here, in a few words."""
    v = s.verdict
    cap = s.hosts.emulated_cap_mib(s.key) if s.host.emulation is not None else None
    size = f"{num(cap)} MiB emulated" if cap else f"{s.host.vram_gb} GB"
    if v.verdict != "not-built":
        return f"**{s.host.name} ({size}): {v.verdict}.**"
    target = refs(v.target_refs)
    meaning = ("blocked at init: no flag set starts the server" if v.blocker == "init"
               else f"no flag set was asked for {target}" if v.blocker == "untested"
               else f"no flag set serves {target} with sound output")
    return f"**{s.host.name} ({size}): {v.verdict}** — {meaning}."


def summary(s) -> str | None:
    """'default cannot start; 5 of 6 flag sets start: …'; None where every flag set fails init
    (the headline says so) or the host is built."""
    v = s.verdict
    if v.verdict != "not-built" or v.blocker == "init":
        return None
    started, failed = list(v.initialised), list(v.failed_init)
    parts = []
    if failed:
        parts.append(f"{names(failed)} cannot start")
    total = len(started) + len(failed)
    said = f"{len(started)} of {total} flag sets start" if failed else f"all {total} flag sets start"
    kinds = []
    for b in v.blockers:
        group = names(config_names(b.flag_sets, v.unreached))
        if b.kind == "capacity":
            kinds.append(f"{group} run out of memory by {refs(v.target_refs)}")
        elif b.kind == "structure":
            kinds.append(f"{group} fit{'s' if len(b.flag_sets) == 1 else ''} but the output is broken")
        elif b.kind == "untested":
            kinds.append(f"{group} never asked for {refs(v.target_refs)}")
    parts.append(said + (": " + "; ".join(kinds) if kinds else ""))
    return "; ".join(parts) + "."


def blocker_lines(s) -> list[Line]:
    """Per flag set (configurations grouped), the kind of block and its evidence."""
    v, target = s.verdict, s.verdict.target_refs
    if v.verdict != "not-built" or v.blocker == "init":
        return []
    early = {e.flag_set: e for e in s.early_ooms}
    lines = []
    for b in v.blockers:
        if b.kind == "init":
            for name in b.flag_sets:
                inits = "; ".join(init_text(i) for _, i in s.failed_inits([name]))
                lines.append(Line(name, f"cannot start the server: {inits}"))
        elif b.kind == "capacity":
            for g in b.oom_signatures:
                shown = config_names(g.flag_sets, v.unreached)
                verb = "starts" if len(shown) == 1 else "start"
                parts = []
                for name in g.flag_sets:
                    e = early.get(name)
                    if e is not None:
                        parts.append(
                            f"runs out of memory from {refs(e.reference_count)} on "
                            f"({e.oom.allocated or e.oom.requested} "
                            f"{'allocated during the request' if e.oom.phase == 'request' else 'at init'})"
                        )
                if g.requested:
                    at = f" at `{g.location}`" if g.location else ""
                    parts.append(f"{refs(target)} run out of memory with a {g.requested} ask{at}")
                elif not parts:
                    parts.append(f"{refs(target)} run out of memory, with no OOM signature recorded")
                lines.append(Line(names(shown), f"{verb}; " + "; ".join(parts)))
        elif b.kind == "structure":
            for name in b.flag_sets:
                unlocks = [u for u in v.capacity_unlocks if u.flag_set == name]
                lines.append(
                    Line(
                        name,
                        f"starts and fits {refs(target)} ("
                        + "; ".join(_unlock_figures(s, u) for u in unlocks)
                        + f"), but its output is {unlocks[0].structure}",
                    )
                )
        else:
            lines.append(
                Line(
                    names(config_names(b.flag_sets, v.unreached)),
                    f"never asked for {refs(target)}, so nothing shows whether they fit",
                )
            )
    return lines


def _unlock_figures(s, u) -> str:
    figures = [f"{u.fixture}: {span(u.wall_s)} s" if u.wall_s else u.fixture]
    sp = s.speedup_of(u)
    if sp is not None:
        figures.append(f"{span(sp.speedup, 1)}× the baseline")
    if u.server_peak_mb:
        figures.append(f"server peak {span(u.server_peak_mb)} MB")
    peak = f"; the run's GPU series maximum {num(u.run_gpu_peak_mib)} MiB" if u.run_gpu_peak_mib else ""
    return ", ".join(figures) + peak
