"""What a [hosts.<name>] is: its `kind`, and the keys each kind may and must state.

A host's keys used to imply what it was (a [diffusers] table, `simulated = true`); now it says so,
and a key that belongs to another kind is refused by name instead of being ignored."""

from __future__ import annotations

from dataclasses import dataclass

# Keys of every host: the physical machine, its card, and how its runs are started and judged.
_COMMON = frozenset({
    "kind", "name", "hostname", "gpu", "compute_capability", "vram_gb", "host_ram_gib",
    "host_ram_note", "card", "python_provider", "idle_tolerance_mib", "emulation", "model_code",
    "offline_command",
})


@dataclass(frozen=True)
class KindKeys:
    """The keys a kind of host may state, those it must, and those an emulated host of the kind
    takes from the host it emulates (so it need not state them)."""

    description: str
    allowed: frozenset[str]
    required: frozenset[str] = frozenset()
    inherited: tuple[str, ...] = ()
    # Groups of keys of which a host states exactly one.
    one_of: tuple[tuple[str, ...], ...] = ()


KIND_KEYS: dict[str, KindKeys] = {
    "omni": KindKeys(
        "vLLM-Omni's server and offline engine on a real (or emulated) card",
        _COMMON | {"serve_flag_sets", "offline_kwarg_sets", "serve_command", "args_check"},
        required=frozenset({"serve_flag_sets"}),
        inherited=("serve_flag_sets", "offline_kwarg_sets")),
    "sim": KindKeys(
        "omniprobe's own server (omniprobe.sim) standing in for vLLM-Omni",
        _COMMON | {"serve_flag_sets", "offline_kwarg_sets", "serve_command", "args_check",
                   "simulated", "capacity", "memory_file_env"},
        required=frozenset({"serve_flag_sets", "serve_command"}),
        inherited=("serve_flag_sets", "offline_kwarg_sets", "simulated", "capacity")),
    "diffusers": KindKeys(
        "the Diffusers engine over its profiles (probe-offline, probe-capacity)",
        _COMMON | {"diffusers", "diffusers_profiles", "diffusers_profile_list", "gpu_minimum"},
        required=frozenset({"diffusers"}),
        one_of=(("diffusers_profiles", "diffusers_profile_list"),)),
}


# A key of no kind is the model's to refuse (an unknown key); this module judges only the keys
# of one kind stated on another.
_ANY_KIND = frozenset().union(*(rules.allowed for rules in KIND_KEYS.values()))


def kind_problems(host: dict) -> list[tuple[str, str]]:
    """(key, what was expected) for each key of a [hosts.<name>] table (as written, before an
    emulated host takes anything from the host it emulates) that disagrees with its kind."""
    kind = host.get("kind")
    if kind not in KIND_KEYS:
        got = "missing" if kind is None else f"got {kind!r}"
        return [("kind", f"a host states its kind, one of {', '.join(map(repr, KIND_KEYS))}; "
                         f"{got}")]
    rules = KIND_KEYS[kind]
    problems = [(key, f"a {kind!r} host ({rules.description}) does not take it; its keys: "
                      f"{', '.join(sorted(rules.allowed - _COMMON))} besides the common ones")
                for key in host if key in _ANY_KIND and key not in rules.allowed]
    emulated = host.get("emulation") is not None
    problems += [(key, f"a {kind!r} host states it" + (
                  "" if not set(rules.inherited) & {key} else
                  " (or takes it from the host it emulates)"))
                 for key in sorted(rules.required)
                 if key not in host and not (emulated and key in rules.inherited)]
    for group in rules.one_of:
        stated = [key for key in group if key in host]
        if len(stated) != 1:
            problems.append((group[0] if not stated else stated[1],
                             f"a {kind!r} host states exactly one of {', '.join(group)}; "
                             f"got {', '.join(stated) or 'none'}"))
    return problems
