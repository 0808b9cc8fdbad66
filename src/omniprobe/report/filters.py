"""Formatting filters: every figure reaches the report through one of these, so templates hold
no numbers; and the few pieces of configuration (flags, the serve command) the report quotes."""

from __future__ import annotations

from pathlib import Path

from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.models.runs import Cell
from omniprobe.evidence.models.statements import StatedFigure
from omniprobe.evidence.quantities import Range

EM_DASH = "—"


def num(value: float | int | None) -> str:
    """A figure as the source wrote it: thousands separators, no invented precision."""
    if value is None:
        return "unknown"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,}"


def fixed(value: float | None, digits: int) -> str:
    return "unknown" if value is None else f"{value:,.{digits}f}"


def span(r: Range | None, digits: int | None = None) -> str:
    """'34.62–35.05', or a single figure when min == max."""
    if r is None:
        return "unknown"
    fmt = num if digits is None else (lambda v: fixed(v, digits))
    return fmt(r.min) if r.single or fmt(r.min) == fmt(r.max) else f"{fmt(r.min)}–{fmt(r.max)}"


def figure_text(f: StatedFigure) -> str:
    """A stated figure with its unit, '~' where the seed writes it as approximate."""
    return f"{'~' if f.approximate else ''}{span(f.range) if f.range else num(f.value)} {f.unit}"


def seeds_text(seeds: list[int] | None) -> str:
    if not seeds:
        return "seeds not stated"
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def refs(n: int) -> str:
    return f"{n} reference" + ("" if n == 1 else "s")


def count_range(counts: list[int]) -> str:
    """'1–4' for a run of consecutive counts, else '0, 2' (counts ascending)."""
    if len(counts) > 1 and counts == list(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}–{counts[-1]}"
    return ", ".join(map(str, counts))


def names(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def standin_mark(cell: Cell) -> str:
    return " (stand-in)" if cell.inputs == "stand-in" else ""


def cell_text(cell: Cell | None) -> str:
    """A run-matrix cell: 'OK 34.2 s', '**OOM**', 'OK 44.06–44.35 s — **output broken**';
    one measured on stand-in inputs says so."""
    if cell is None:
        return EM_DASH
    if cell.emulation_breach is not None:
        breach = cell.emulation_breach
        return f"**EMULATION BREACHED** ({num(breach.held_mib)} MiB held, cap {num(breach.cap_mib)} MiB)"
    if cell.outcome != "ok":
        return f"**{cell.outcome.upper()}**" + standin_mark(cell)
    text = "OK" + (f" {span(cell.wall_s)} s" if cell.wall_s else "")
    if cell.structure == "broken":
        text += " — **output broken**"
    elif cell.structure == "unchecked":
        text += " (output not checked)"
    return text + standin_mark(cell)


def sentence(text: str) -> str:
    """The first letter upper case, the rest as written (Jinja's capitalize lowers the rest)."""
    return text[:1].upper() + text[1:]


def flat_kwargs(kwargs: dict, prefix: str = ""):
    """(dotted key, value) of nested kwargs."""
    for key, value in kwargs.items():
        if isinstance(value, dict):
            yield from flat_kwargs(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _kwarg_value(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_kwarg_value(v) for v in value) + "]"
    return str(value)


def kwargs_text(kwargs: dict | None) -> str:
    """Engine kwargs as `key=value` items, nested keys dotted: never a Python repr."""
    if kwargs is None:
        return "not stated"
    return " ".join(f"`{key}={_kwarg_value(value)}`" for key, value in flat_kwargs(kwargs))


def flags_text(hosts: HostsConfig, flag_set: str) -> str:
    fs = hosts.flag_sets[flag_set]
    parts = list(fs.args)
    if fs.deploy_config:
        parts += ["--deploy-config", Path(hosts.deploy_configs[fs.deploy_config].path).name]
    parts += [f"{k}={v}" for k, v in fs.env.items()]
    return " ".join(f"`{p}`" for p in parts) if parts else "(none)"


def serve_text(hosts: HostsConfig, host_key: str) -> str:
    """The serve invocation as a person would type it, with the model as a placeholder."""
    serve, host = hosts.serve, hosts.host(host_key)
    command = " ".join(host.serve_command or serve.command)
    for name, shown in (
        ("{model}", "<snapshot>"),
        ("{python}", "python"),
        ("{hosts_file}", "hosts.toml"),
        ("{host}", host_key),
    ):
        command = command.replace(name, shown)
    return (
        f"{command} --port {serve.port}"
        + (" --enforce-eager" if serve.enforce_eager else "")
        + f" --served-model-name {serve.served_model_name}"
    )


FILTERS = {
    "figure": figure_text,
    "num": num,
    "fixed": fixed,
    "span": span,
    "seeds": seeds_text,
    "cell": cell_text,
    "sentence": sentence,
    "refs": refs,
    "names": names,
}
