"""Every option of the evidence-making sessions, defined once (as nox's `_options.py` does).

An `Option` is one flag: its help, its bounds, whether it repeats or switches, its default and,
where hosts.toml supplies the default, the table and key. A field of an options dataclass below
carries its Option(s) in its metadata. From these alone are generated: each command's argparse
flags (`omniprobe.cli.options`), the options object a command line makes (`options_of`), the
settings a session runs with, hosts.toml's defaults merged in (`settings_of`), and the nox routing
table (cli/nox_args.py reads the generated parsers). `COMMANDS` says which command takes which
options dataclass; a field added to one reaches every command that takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from omniprobe.limits import MAX_MIB, MAX_SEED, MAX_WAIT_S

if TYPE_CHECKING:
    from omniprobe.config.hosts import HostsConfig


@dataclass(frozen=True)
class Bounds:
    """What a number option accepts: the parser `name`, its conversion and its closed range
    (`low_open`: low itself refused); `what` names it in the refusal."""

    name: str
    convert: type
    low: float
    high: float
    what: str
    low_open: bool = False


SECONDS = Bounds("seconds", float, 0, MAX_WAIT_S,
                 "a number of seconds above 0 and at most a week", low_open=True)
GRACE_SECONDS = Bounds("grace_seconds", float, 0, 3600, "a number of seconds from 0 to 3600")
HERTZ = Bounds("hertz", float, 0.1, 1000, "a rate in Hz from 0.1 to 1000")
TCP_PORT = Bounds("port", int, 1, 65535, "a TCP port from 1 to 65535")
INDEX = Bounds("index", int, 0, 1023, "an index from 0")
SEED = Bounds("seed", int, 0, MAX_SEED, f"a seed from 0 to {MAX_SEED} (2**32-1)")
POOL_MIB = Bounds("pool_mib", int, 1, MAX_MIB, f"a memory pool in MiB from 1 to {MAX_MIB}")
REPEAT_COUNT = Bounds("repeat_count", int, 0, 10, "a number of repeats from 0 to 10")
STEP_COUNT = Bounds("step_count", int, 0, 1000, "a number of denoising steps from 0 to 1000")


@dataclass(frozen=True)
class Option:
    """One flag. `help` may name `{hosts_default}` (the hosts.toml key shown as `[table] key`) and
    the words a command fills in (`Takes.words`); literal braces are doubled."""

    flag: str
    help: str
    default: Any = None
    bounds: Bounds | None = None
    repeat: bool = False  # repeatable: its values gather in a tuple
    switch: bool = False  # present or not
    dest: str | None = None
    metavar: str | None = None
    hosts_default: tuple[str, str] | None = None  # (table, key): hosts.toml's value when not given

    @property
    def name(self) -> str:
        """The argparse destination."""
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def help_for(self, words: Mapping[str, str]) -> str:
        shown = f"[{self.hosts_default[0]}] {self.hosts_default[1]}" if self.hosts_default else ""
        return self.help.format(hosts_default=shown, **words)


def option(*options: Option):
    """A dataclass field holding these options (several: their values gathered, in order)."""
    first = options[0]
    if first.repeat:
        return field(default=(), metadata={"options": options})
    return field(default=False if first.switch else first.default, metadata={"options": options})


# The options; each is one flag, whatever commands take it.
HOST = Option("--host", "hosts.toml host, when no env-<host> session selected one")
VENV = Option("--venv", "the real host's probe env, when no env-<host> session built one "
                        "(default: <[env] root>/envs/<host>)")
MODEL = Option("--model", "model path or repo id for {{model}} (default: {model_default})",
               hosts_default=("stack", "model_repo"))
READY_TIMEOUT = Option("--ready-timeout", "seconds for the {started} to get ready (default: "
                       "{hosts_default})", bounds=SECONDS,
                       hosts_default=("serve", "ready_timeout_s"))
REQUEST_TIMEOUT = Option("--request-timeout", "seconds (default: {hosts_default})",
                         bounds=SECONDS, hosts_default=("serve", "request_timeout_s"))
GRACE = Option("--grace", "SIGTERM to SIGKILL (default: {hosts_default})", bounds=GRACE_SECONDS,
               hosts_default=("serve", "stop_grace_s"))
IDLE_TIMEOUT = Option("--idle-timeout", "seconds to wait for an idle GPU before each {started} "
                      "start", default=60.0, bounds=GRACE_SECONDS)
GPU_INDEX = Option("--gpu-index", "NVML index of the GPU (PCI bus order): the sampler watches it "
                   "and the {started} runs on it (CUDA_VISIBLE_DEVICES); both are recorded",
                   default=0, bounds=INDEX)
PORT = Option("--port", "server port (default: {hosts_default})", bounds=TCP_PORT,
              hosts_default=("serve", "port"))
SAMPLE_HZ = Option("--sample-hz", "GPU memory sampling rate", default=10.0, bounds=HERTZ)
FRESH = Option("--fresh", "start a new attempt instead of resuming", switch=True)
ACCEPT_TIMEOUTS = Option("--accept-timeouts", "take an init or request that timed out as "
                         "settled; without it, a resume runs it again (a timeout is not the "
                         "card's answer)", switch=True)
FLAG_SETS = Option("--flag-set", "only this flag set (repeatable)", repeat=True)
FIXTURES = Option("--fixture", "{fixture_scope}only this fixture (repeatable)", repeat=True)
CAPS = Option("--caps", "emulated hosts: sweep these caps (GiB, comma-separated, e.g. "
                        "{caps_example}), one attempt series per cap")
KWARG_SETS = Option("--kwarg-set", "only this offline kwarg set (repeatable; default: every "
                                   "runnable one)", repeat=True)
PROFILES = Option("--profile", "{profile_help}", repeat=True)
SEEDS = Option("--seed", "only this seed (repeatable; default: {seeds_default})", bounds=SEED,
               repeat=True)
WITH = Option("--with", "flag set passing the deploy config (default: the host's only one)",
              dest="flag_set_with", metavar="FLAG_SET")
WITHOUT = Option("--without", "flag set without it (default: the one with the same args and env)",
                 dest="flag_set_without", metavar="FLAG_SET")
KNOB = Option("--knob", "what the deploy config sets (default: its hosts.toml 'knob')")
ONE_FIXTURE = Option("--fixture", "fixture to serve (default: the runnable edit with the fewest "
                                  "references)")
ONE_SEED = Option("--seed", "seed (default: the first sampling seed)", bounds=SEED)
FLOOR = Option("--floor-mib", "the smallest pool limit the search tries (MiB)", default=1024,
               bounds=POOL_MIB)
CEILING = Option("--ceiling-mib", "the largest pool limit the search tries (MiB)", default=32768,
                 bounds=POOL_MIB)
RESOLUTION = Option("--resolution-mib", "the search's step between two pool limits (MiB)",
                    default=256, bounds=POOL_MIB)
REPEATS = Option("--repeats", "trials beyond the first at each side of a band, which widens "
                 "until they hold", default=2, bounds=REPEAT_COUNT)
SPEED_STEPS = Option("--speed-steps", "after each profile's bands, time one request at this many "
                     "denoising steps at the largest reference count, the pool at the ceiling "
                     "(the seed ran 20; 0: none)", default=0, bounds=STEP_COUNT)
BUILD_ENV = Option("--build-env", "first build (or, when nothing changed, only verify) the host's "
                   "Diffusers env, where its runner runs in one (`env build --env diffusers`); "
                   "without it, a Diffusers env not built is refused", switch=True)


@dataclass(frozen=True)
class SessionOptions:
    """What the command line says to every session; None: hosts.toml's default."""

    host: str | None = option(HOST)
    venv: str | None = option(VENV)
    model: str | None = option(MODEL)
    ready_timeout_s: float | None = option(READY_TIMEOUT)
    request_timeout_s: float | None = option(REQUEST_TIMEOUT)
    grace_s: float | None = option(GRACE)
    idle_timeout_s: float = option(IDLE_TIMEOUT)
    gpu_index: int = option(GPU_INDEX)


@dataclass(frozen=True)
class ServerOptions(SessionOptions):
    """What the command line says to a session that starts a server."""

    port: int | None = option(PORT)
    sample_hz: float = option(SAMPLE_HZ)


@dataclass(frozen=True)
class ProbeOptions(ServerOptions):
    """probe-init's and probe-serve's command line; empty tuples: all of them."""

    fresh: bool = option(FRESH)
    accept_timeouts: bool = option(ACCEPT_TIMEOUTS)
    flag_sets: tuple[str, ...] = option(FLAG_SETS)
    fixtures: tuple[str, ...] = option(FIXTURES)
    caps_gib: str | None = option(CAPS)  # emulated hosts: the caps to sweep, e.g. "12,16,20,24,32"


@dataclass(frozen=True)
class OfflineOptions(SessionOptions):
    """probe-offline's command line; empty tuples: all of them (seeds: the sampling seeds)."""

    # The offline matrix's entries asked for: kwarg sets, or a Diffusers host's profiles.
    configurations: tuple[str, ...] = option(KWARG_SETS, PROFILES)
    fixtures: tuple[str, ...] = option(FIXTURES)
    seeds: tuple[int, ...] = option(SEEDS)
    fresh: bool = option(FRESH)
    accept_timeouts: bool = option(ACCEPT_TIMEOUTS)
    caps_gib: str | None = option(CAPS)  # emulated hosts: the caps to sweep, e.g. "16,20,24,32"
    sample_hz: float = option(SAMPLE_HZ)


@dataclass(frozen=True)
class BaselineOptions(OfflineOptions):
    """probe-baseline's command line: probe-offline's, under one profile."""

    build_env: bool = option(BUILD_ENV)  # first build (or verify) the host's Diffusers env


@dataclass(frozen=True)
class CapacityOptions(SessionOptions):
    """probe-capacity's command line: the profiles (empty: all), the fixtures (default: the
    first the host serves at each reference count) and the search's grid."""

    configurations: tuple[str, ...] = option(PROFILES)  # a Diffusers host's profiles
    build_env: bool = option(BUILD_ENV)  # first build (or verify) the host's Diffusers env
    fixtures: tuple[str, ...] = option(FIXTURES)
    fresh: bool = option(FRESH)
    sample_hz: float = option(SAMPLE_HZ)
    floor_mib: int = option(FLOOR)
    ceiling_mib: int = option(CEILING)
    resolution_mib: int = option(RESOLUTION)
    repeats: int = option(REPEATS)
    speed_steps: int = option(SPEED_STEPS)


@dataclass(frozen=True)
class PropagationOptions(ServerOptions):
    """propagation's command line; None: the default the check chooses."""

    flag_set_with: str | None = option(WITH)
    flag_set_without: str | None = option(WITHOUT)
    knob: str | None = option(KNOB)
    fixture: str | None = option(ONE_FIXTURE)
    seed: int | None = option(ONE_SEED)


@dataclass(frozen=True)
class Takes:
    """A command's options: the dataclass its command line makes, the flags of it it leaves
    out, whether the class's own fields come before the inherited ones, and the words its help
    fills in."""

    options: type
    words: Mapping[str, str]
    without: frozenset[str] = frozenset()
    own_first: bool = False


SERVER_WORDS = {"started": "server", "model_default": "the pinned snapshot's folder"}
OFFLINE_WORDS = {"started": "offline runner", "model_default": "the snapshot's repo id",
                 "fixture_scope": ""}
COMMANDS: dict[str, Takes] = {
    **{name: Takes(ProbeOptions, {**SERVER_WORDS, "fixture_scope": "probe-serve: ",
                                  "caps_example": "12,16,20,24,32"})
       for name in ("probe-init", "probe-serve")},
    "probe-offline": Takes(OfflineOptions, {
        **OFFLINE_WORDS, "caps_example": "16,20,24,32",
        "profile_help": "Diffusers hosts: only this Diffusers profile (repeatable; default: all)",
        "seeds_default": "the fixtures' sampling seeds, or a profile's own"}),
    "probe-baseline": Takes(BaselineOptions, {
        **OFFLINE_WORDS, "profile_help": "the Diffusers profile to re-seal with (default: "
                                         "seed-baseline)",
        "seeds_default": "the profile's seeds"},
        without=frozenset({"--kwarg-set", "--caps", "--sample-hz"})),
    "probe-capacity": Takes(CapacityOptions, {
        **OFFLINE_WORDS, "profile_help": "only this Diffusers profile (repeatable; default: all)"},
        own_first=True),
    "propagation": Takes(PropagationOptions, SERVER_WORDS, own_first=True),
}


def command_options(takes: Takes) -> list[Option]:
    """The options a command takes, in the order its help lists them."""
    every = fields(takes.options)
    if takes.own_first:  # a stable sort: the class's own fields, then its base's, each in order
        inherited = {f.name for f in fields(takes.options.__mro__[1])}
        every = sorted(every, key=lambda f: f.name in inherited)
    return [opt for f in every for opt in f.metadata.get("options", ())
            if opt.flag not in takes.without]


def options_of(takes: Takes, given: Mapping[str, Any]):
    """The command's options object from the parsed values (argparse destinations); a flag the
    command does not take keeps its field's default."""
    values = {}
    for f in fields(takes.options):
        present = [opt for opt in f.metadata.get("options", ()) if opt.name in given]
        if not present:
            continue
        if present[0].repeat:
            values[f.name] = tuple(v for opt in present for v in given[opt.name])
        else:
            values[f.name] = given[present[0].name]
    return takes.options(**values)


def given_or_default(options, name: str, cfg: HostsConfig):
    """An option's value, or hosts.toml's default where it has one and none was given (None, or
    an empty text: the command line's parsers refuse every other empty value)."""
    value = getattr(options, name)
    opts = options.__dataclass_fields__[name].metadata.get("options", ())
    where = opts[0].hosts_default if opts else None
    if where is not None and (value is None or value == ""):
        return getattr(getattr(cfg, where[0]), where[1])
    return value


def settings_of(settings: type, options, cfg: HostsConfig, **given):
    """`settings` (a dataclass) from the options, hosts.toml's defaults where none was given:
    each of its fields named as an option takes that option's value; `given` sets others."""
    names = {f.name for f in fields(options)}
    values = {f.name: given[f.name] if f.name in given else given_or_default(options, f.name, cfg)
              for f in fields(settings) if f.name in given or f.name in names}
    return settings(**values)
