"""hosts.toml as a whole: its tables together (HostsConfig), and load_hosts with the checks that
span tables (cross references, the envs against [stack])."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from omniprobe.config.calibration import Calibration
from omniprobe.config.cards import Card
from omniprobe.config.diffusers import (
    DiffusersProfile,
    DiffusersProfileDefaults,
    with_bases,
    with_defaults,
)
from omniprobe.config.flag_sets import DeployConfig, FlagSet, OfflineKwargSet, Serve
from omniprobe.config.host_entry import Host, model_folders
from omniprobe.config.host_kinds import KIND_KEYS, kind_problems
from omniprobe.config.hosts_common import HostsTable
from omniprobe.config.names import Name
from omniprobe.config.published import PublishedFigure
from omniprobe.config.report_settings import ProbeSettings, QualitySettings, StructureChecks
from omniprobe.config.sim_config import capacity_problems, model_owners, parse_sim_config
from omniprobe.config.stack import DiffusersEnv, EnvChecks, EnvConfig, Stack, UpstreamPin
from omniprobe.errors import InputError, Problem, Refusal, problems_from_validation
from omniprobe.project_files import SIM_FILE
from omniprobe.safe_io import read_text, toml_text


class UnknownHost(Refusal):
    """A host name (from --host, an env session, a manifest) that hosts.toml does not define."""


class HostsConfig(HostsTable):
    stack: Stack
    serve: Serve
    probe: ProbeSettings
    hosts: dict[Name, Host]
    flag_sets: dict[Name, FlagSet]
    deploy_configs: dict[Name, DeployConfig] = {}
    offline_kwarg_sets: dict[Name, OfflineKwargSet] = {}
    diffusers_profile_defaults: DiffusersProfileDefaults | None = Field(
        default=None, description="What a profile that does not state it takes; needed where "
                                  "there are profiles.")
    diffusers_profiles: dict[Name, DiffusersProfile] = {}
    diffusers_profile_lists: dict[Name, list[Name]] = Field(
        default={}, description="Named lists of profiles, for the hosts that run the same ones "
                                "(a host's diffusers_profile_list).")
    cards: dict[Name, Card] = Field(
        default={}, description="GPUs a user may own, each by its usable memory pool's figures "
                                "and their sources; a capacity search's bands are judged against "
                                "each.")
    published_figures: dict[Name, PublishedFigure] = Field(
        default={}, description="What others publish of a model's GPU memory, shown beside its "
                                "bands, never counted as a measurement.")
    calibrations: dict[Name, Calibration] = Field(
        default={}, description="Real Diffusers runs the seed reports, each held against the "
                                "emulation of its card.")
    structure: StructureChecks = StructureChecks()
    quality: QualitySettings = QualitySettings()
    env: EnvConfig | None = Field(
        default=None, description="The probe environment build; null: not configured."
    )
    diffusers_env: DiffusersEnv | None = Field(
        default=None, description="The Diffusers engine's environment (probe-baseline's, and "
                                  "probe-offline's on a Diffusers host whose runner_env is "
                                  "'diffusers'); null: not configured.")
    upstream: UpstreamPin | None = Field(
        default=None, description="The registry's upstream the contract checks run against.")

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data):
        """Each profile takes the settings of the profile it names as its base, then the sampling
        keys it does not state from the defaults table."""
        profiles = data.get("diffusers_profiles") if isinstance(data, dict) else None
        if not isinstance(profiles, dict):
            return data
        profiles = with_bases(profiles)
        defaults = data.get("diffusers_profile_defaults")
        if isinstance(defaults, dict):
            profiles = {name: with_defaults(profile, defaults) for name, profile in profiles.items()}
        return {**data, "diffusers_profiles": profiles}

    @model_validator(mode="before")
    @classmethod
    def _named_profile_lists(cls, data):
        """A host naming a profile list runs that list's profiles."""
        hosts = data.get("hosts") if isinstance(data, dict) else None
        if not isinstance(hosts, dict):
            return data
        lists = data.get("diffusers_profile_lists", {})
        filled = dict(hosts)
        for name, host in hosts.items():
            named = host.get("diffusers_profile_list") if isinstance(host, dict) else None
            if named is None:
                continue
            if not isinstance(lists, dict) or named not in lists:
                raise ValueError(f"[hosts.{name}] key 'diffusers_profile_list': list {named!r} "
                                 "is not defined under [diffusers_profile_lists]")
            filled[name] = {**host, "diffusers_profiles": lists[named]}
        return {**data, "hosts": filled}

    @model_validator(mode="before")
    @classmethod
    def _inherit_emulated(cls, data):
        """An emulated host takes the matrix of the host it emulates, as far as its own kind has
        one (KIND_KEYS' inherited): its flag sets, offline kwarg sets and, for a simulated one,
        the capacity model its server runs."""
        hosts = data.get("hosts") if isinstance(data, dict) else None
        if not isinstance(hosts, dict):
            return data
        filled = dict(hosts)
        for name, host in hosts.items():
            emulation = host.get("emulation") if isinstance(host, dict) else None
            emulates = emulation.get("emulates") if isinstance(emulation, dict) else None
            if emulates is None:
                continue
            target = hosts.get(emulates)
            if not isinstance(target, dict):
                raise ValueError(f"[hosts.{name}.emulation] key 'emulates': host {emulates!r} "
                                 "is not defined under [hosts]")
            if target.get("emulation") is not None:
                raise ValueError(f"[hosts.{name}.emulation] key 'emulates': host {emulates!r} "
                                 "is itself emulated; name a real or simulated host")
            rules = KIND_KEYS.get(host.get("kind"))
            inherited = {key: target[key] for key in (rules.inherited if rules else ())
                         if key in target}
            filled[name] = {**inherited, **host}
        serve = data.get("serve")
        model = serve.get("served_model_name") if isinstance(serve, dict) else None
        if isinstance(model, str):
            filled = {name: {"model_code": model_folders(model), **host}
                      if isinstance(host, dict) else host for name, host in filled.items()}
        return {**data, "hosts": filled}

    @model_validator(mode="after")
    def _defaults_for_profiles(self) -> HostsConfig:
        if self.diffusers_profiles and self.diffusers_profile_defaults is None:
            raise ValueError("[diffusers_profiles] need a [diffusers_profile_defaults] table "
                             "(output_resolution and the sampling a profile does not state)")
        return self

    def host(self, name: str, where: str = "the command") -> Host:
        """The host called `name`; UnknownHost, saying who named it and listing the hosts."""
        if name not in self.hosts:
            raise UnknownHost(f"{where} names host {name!r}, which hosts.toml does not define; "
                              f"hosts: {self.hosts_list()}")
        return self.hosts[name]

    def hosts_list(self) -> str:
        return ", ".join(f"{name} ({'simulated' if h.simulated else h.hostname})"
                         for name, h in self.hosts.items())

    def real_hosts(self) -> dict[str, Host]:
        return {k: h for k, h in self.hosts.items() if not h.simulated}

    def output_resolution(self, profile: str) -> int:
        """The side a profile's condition images are resized to: its own, else the defaults'
        (which _defaults_for_profiles holds present wherever there are profiles)."""
        own = self.diffusers_profiles[profile].output_resolution
        return own if own is not None else self.diffusers_profile_defaults.output_resolution

    @property
    def vram_tolerance(self) -> float:
        """[env.checks] vram_tolerance, its default where hosts.toml has no [env]."""
        return (self.env.checks if self.env else EnvChecks()).vram_tolerance

    def emulated_cap_mib(self, name: str) -> int | None:
        """The capacity an emulated host imposes (MiB); None for a host that is not emulated."""
        emulation = self.host(name).emulation
        if emulation is None:
            return None
        if emulation.capacity_mib is not None:
            return emulation.capacity_mib
        target = self.host(emulation.emulates)
        return target.capacity.vram_mib if target.capacity else target.vram_gb * 1024


def _toml_loc(loc) -> str:
    """A pydantic location as the TOML table and key a user would look for."""
    parts = [str(p) for p in loc]
    if len(parts) == 3 and parts[2] == "[key]":  # the table's name itself
        return f"[{parts[0]}] name {parts[1]!r}"
    if len(parts) >= 3 and parts[0] in {"env", "diffusers_env"} and parts[1] == "install":
        item = f"[[{parts[0]}.install]] item {parts[2]}"
        return f"{item} key '{'.'.join(parts[3:])}'" if len(parts) > 3 else item
    if len(parts) >= 2 and parts[0] in {"hosts", "flag_sets", "deploy_configs", "offline_kwarg_sets",
                                        "diffusers_profiles", "diffusers_profile_lists", "cards",
                                        "calibrations"}:
        table = f"[{parts[0]}.{parts[1]}]"  # one named table; a rule across its keys names it alone
        return f"{table} key '{'.'.join(parts[2:])}'" if len(parts) > 2 else table
    if len(parts) >= 2:
        return f"[{parts[0]}] key '{'.'.join(parts[1:])}'"
    return f"key '{parts[0]}'" if parts else ""


def _cross_references(cfg: HostsConfig, file: str) -> list[Problem]:
    problems = []
    for name, host in cfg.hosts.items():
        for flag_set in host.serve_flag_sets:
            if flag_set not in cfg.flag_sets:
                problems.append(Problem(file, f"[hosts.{name}] key 'serve_flag_sets'",
                                        f"flag set {flag_set!r} is not defined under [flag_sets]"))
        for profile in host.diffusers_profiles if host.diffusers_profile_list is None else ():
            if profile not in cfg.diffusers_profiles:
                problems.append(Problem(
                    file, f"[hosts.{name}] key 'diffusers_profiles'",
                    f"Diffusers profile {profile!r} is not defined under [diffusers_profiles]"))
        for kwarg_set in host.offline_kwarg_sets:
            if kwarg_set not in cfg.offline_kwarg_sets:
                problems.append(Problem(
                    file, f"[hosts.{name}] key 'offline_kwarg_sets'",
                    f"offline kwarg set {kwarg_set!r} is not defined under [offline_kwarg_sets]"))
        if host.card is not None and host.card not in cfg.cards:
            problems.append(Problem(file, f"[hosts.{name}] key 'card'",
                                    f"card {host.card!r} is not defined under [cards] (cards: "
                                    f"{', '.join(cfg.cards) or 'none'})"))
        if host.card is not None and cfg.cards.get(host.card) is not None and (
                host.emulation is not None):
            problems.append(Problem(file, f"[hosts.{name}] key 'card'",
                                    "an emulated host names no card: the host it emulates does"))
    for name, profiles in cfg.diffusers_profile_lists.items():
        problems.extend(Problem(file, f"[diffusers_profile_lists] key '{name}'",
                                f"Diffusers profile {profile!r} is not defined under "
                                "[diffusers_profiles]")
                        for profile in profiles if profile not in cfg.diffusers_profiles)
    problems.extend(_named_twice(cfg, file))
    problems.extend(_card_hosts_agree(cfg, file))
    problems.extend(_cards_as_their_hosts_say(cfg, file))
    problems.extend(_context_within_cap(cfg, file))
    for name, flag_set in cfg.flag_sets.items():
        if flag_set.deploy_config and flag_set.deploy_config not in cfg.deploy_configs:
            problems.append(Problem(file, f"[flag_sets.{name}] key 'deploy_config'",
                                    f"deploy config {flag_set.deploy_config!r} is not defined "
                                    "under [deploy_configs]"))
    problems.extend(_name_clashes(cfg, file))
    problems.extend(_calibration_references(cfg, file))
    problems.extend(_env_against_stack(cfg, file))
    problems.extend(_diffusers_env_choices(cfg, file))
    return problems


def _card_hosts_agree(cfg: HostsConfig, file: str) -> list[Problem]:
    """A card's verdict reads its host's RAM: hosts that name one card state the same RAM, or
    one host's figure would be read as another's."""
    problems: list[Problem] = []
    first: dict[str, str] = {}  # card -> the first host naming it
    for name, host in cfg.hosts.items():
        if host.card is None:
            continue
        other = first.setdefault(host.card, name)
        if cfg.hosts[other].host_ram_gib != host.host_ram_gib:
            problems.append(Problem(file, f"[hosts.{name}] key 'host_ram_gib'",
                                    f"{host.host_ram_gib} GiB, while host {other!r}, which names "
                                    f"the same card {host.card!r}, states "
                                    f"{cfg.hosts[other].host_ram_gib}: a card's verdict reads its "
                                    "host's RAM, so hosts sharing a card state the same"))
    return problems


def _cards_as_their_hosts_say(cfg: HostsConfig, file: str) -> list[Problem]:
    """A card's total is a reading of its marketed size, and a host that names a card names its
    GPU: the same marketed size, and the card's name within the GPU the host names (a card
    renamed, or another card named, would read the host's evidence as another GPU's)."""
    problems = [Problem(file, f"[cards.{key}] key 'memory_total_mib'", why)
                for key, card in cfg.cards.items()
                if (why := card.total_problem(cfg.vram_tolerance))]
    for name, host in cfg.hosts.items():
        card = cfg.cards.get(host.card) if host.emulation is None else None
        if card is None:
            continue
        if card.vram_gb != host.vram_gb:
            problems.append(Problem(file, f"[cards.{host.card}] key 'vram_gb'",
                                    f"{card.vram_gb} GB, while host {name!r}, which names the "
                                    f"card, says {host.vram_gb} GB: one GPU has one marketed "
                                    "size"))
        if card.name.casefold() not in host.gpu.casefold():
            problems.append(Problem(file, f"[cards.{host.card}] key 'name'",
                                    f"{card.name!r} is not the GPU host {name!r} names "
                                    f"({host.gpu!r}): a host's card is its own GPU; name that "
                                    "GPU, or point the host at its own [cards] entry"))
    return problems


def _context_within_cap(cfg: HostsConfig, file: str) -> list[Problem]:
    """A simulated host emulated under a cap runs its model's CUDA context on a card of the
    cap's size: a context the cap cannot hold is refused, as on the simulated card itself."""
    return [Problem(file, f"[hosts.{name}.emulation] key 'capacity_mib'",
                    f"{host.emulation.capacity_mib:,} MiB cannot hold the simulated CUDA "
                    f"context, {host.capacity.context_mib:,} MiB ({SIM_FILE} [capacity."
                    f"{host.emulation.emulates}] context_mib): expected more")
            for name, host in cfg.hosts.items()
            if host.emulation is not None and host.capacity is not None
            and host.emulation.capacity_mib is not None
            and host.capacity.context_mib >= host.emulation.capacity_mib]


def _named_twice(cfg: HostsConfig, file: str) -> list[Problem]:
    """A list that names one profile (flag set, kwarg set) twice would run it twice into one
    attempt, its records the same cell's: each list names each once."""
    lists = [(f"[diffusers_profile_lists] key '{name}'", names)
             for name, names in cfg.diffusers_profile_lists.items()]
    for name, host in cfg.hosts.items():
        # Only the lists a host states: one it took from a named list or from the host it
        # emulates is said once, where it is written.
        emulated = cfg.hosts.get(host.emulation.emulates) if host.emulation else None
        lists += [(f"[hosts.{name}] key '{key}'", getattr(host, key)) for key in
                  ("serve_flag_sets", "offline_kwarg_sets", "diffusers_profiles")
                  if not (key == "diffusers_profiles" and host.diffusers_profile_list)
                  and not (emulated is not None
                           and getattr(host, key) == getattr(emulated, key))]
    return [Problem(file, where, f"{item!r} is named {names.count(item)} times: name it once")
            for where, names in lists for item in dict.fromkeys(names) if names.count(item) > 1]


def _name_clashes(cfg: HostsConfig, file: str) -> list[Problem]:
    """A name is one thing: a flag set and a Diffusers profile of the same name would leave a
    record's name, a report row and a `--profile`/`--flag-set` reading two ways."""
    return [Problem(file, f"[diffusers_profiles.{name}]",
                    f"{name!r} is also a flag set ([flag_sets.{name}]): a flag set and a Diffusers "
                    "profile cannot share a name; rename one of them")
            for name in cfg.diffusers_profiles if name in cfg.flag_sets]


def _calibration_references(cfg: HostsConfig, file: str) -> list[Problem]:
    """A calibration's host emulates a card, and its profiles are that host's."""
    problems = []
    for name, cal in cfg.calibrations.items():
        where = f"[calibrations.{name}]"
        host = cfg.hosts.get(cal.emulated_host)
        if host is None or host.emulation is None or host.diffusers is None:
            problems.append(Problem(file, f"{where} key 'emulated_host'",
                                    f"{cal.emulated_host!r} is not an emulated Diffusers host "
                                    "under [hosts]"))
            continue
        for key, profiles in (("closest", [cal.closest]), ("grid", cal.grid)):
            for profile in profiles:
                if profile not in host.diffusers_profiles:
                    problems.append(Problem(
                        file, f"{where} key '{key}'",
                        f"Diffusers profile {profile!r} is not run on host {cal.emulated_host!r} "
                        "(its diffusers_profiles)"))
    return problems


def _diffusers_env_choices(cfg: HostsConfig, file: str) -> list[Problem]:
    """The seed states no pin of the Diffusers env, so each one says who chose it and why."""
    steps = cfg.diffusers_env.install if cfg.diffusers_env else []
    return [Problem(file, f"[[diffusers_env.install]] item {i} ({step.name}) key 'chosen'",
                    "the seed states no pin of the Diffusers env: record who chose it and why, "
                    'chosen = { chosen_by = "omniprobe", reason = "..." }')
            for i, step in enumerate(steps) if step.chosen is None]


# Install steps that [stack] also pins: step field -> [stack] key that must hold the same value.
_STACK_PINS = {
    "torch": {"version": "torch", "index": "torch_index"},
    "transformers": {"version": "transformers"},
    "diffusers": {"git": "diffusers_repo", "commit": "diffusers_commit"},
    "vllm-omni": {"git": "upstream_repo", "commit": "upstream_commit"},
}


def _env_against_stack(cfg: HostsConfig, file: str) -> list[Problem]:
    """[stack] is what the report cites; [env] may not install anything else under those names."""
    if cfg.env is None:
        return []
    problems = []
    for i, step in enumerate(cfg.env.install):
        for field, stack_key in _STACK_PINS.get(step.name, {}).items():
            want, got = getattr(cfg.stack, stack_key), getattr(step, field)
            if got != want:
                problems.append(Problem(file, f"[[env.install]] item {i} key '{field}'",
                                        f"{step.name}: expected [stack] {stack_key} {want!r}, "
                                        f"got {got!r}"))
    return problems + _manifest_problems(cfg, file)


def _manifest_problems(cfg: HostsConfig, file: str) -> list[Problem]:
    """The snapshot manifest [env.checks] names is a file next to hosts.toml."""
    manifest = cfg.env.checks.snapshot_manifest if cfg.env else None
    if manifest is not None and not (Path(file).parent / manifest).is_file():
        return [Problem(file, "[env.checks] key 'snapshot_manifest'",
                        f"file {manifest!r} not found next to {Path(file).name}")]
    return []


# Checked configs by the texts they are a function of, hosts.toml's and sim.toml's (the path
# only names the file in a problem): a process that loads the project again (every command the
# tests run in process, on copies of the project) checks each pair once. Only successes are
# kept, and the one check that looks beyond the two texts, the snapshot manifest beside
# hosts.toml, runs on every load.
_CHECKED: dict[tuple[str, str | None], HostsConfig] = {}
_CHECKED_MAX = 32


def load_hosts(path: str | Path) -> HostsConfig:
    """Load and check hosts.toml, with the sim.toml beside it; raise InputError listing every
    problem."""
    path = Path(path)
    text = read_text(path)
    sim = _sim_text(path)
    if isinstance(sim, InputError):  # raises, with hosts.toml's own problems: nothing to keep
        return _checked(path, toml_text(path, text), sim)
    cfg = _CHECKED.get((text, sim))
    if cfg is not None:
        if problems := _manifest_problems(cfg, str(path)):
            raise InputError(problems)
        return cfg
    cfg = _checked(path, toml_text(path, text), sim)
    if len(_CHECKED) >= _CHECKED_MAX:
        del _CHECKED[next(iter(_CHECKED))]
    _CHECKED[(text, sim)] = cfg
    return cfg


def parse_hosts(path: Path, text: str) -> HostsConfig:
    """`text` checked as `path`'s contents would be (a change is checked before it is written)."""
    return _checked(path, toml_text(path, text), _sim_text(path))


def _sim_text(path: Path) -> str | None | InputError:
    """The text of the sim.toml beside hosts.toml: None where there is none, the error where it
    cannot be read (said with hosts.toml's own problems)."""
    sim_file = path.parent / SIM_FILE
    if not sim_file.exists():
        return None
    try:
        return read_text(sim_file)
    except InputError as exc:
        return exc


def _kind_problems(path: Path, data: dict) -> list[Problem]:
    """Each host's keys against its kind, as the file states them (before inheritance)."""
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        return []
    return [Problem(str(path), f"[hosts.{name}] key '{key}'", expected)
            for name, host in hosts.items() if isinstance(host, dict)
            for key, expected in kind_problems(host)]


def _with_sim_models(path: Path, data: dict, sim_text: str | None | InputError
                     ) -> tuple[dict, list[Problem]]:
    """hosts.toml's data with each simulated host's capacity model from the sim.toml beside it
    (`sim_text`: its text, see _sim_text), and the problems of those models (said with
    hosts.toml's own). A model stated in hosts.toml is refused: it moved to sim.toml."""
    sim_file = path.parent / SIM_FILE
    hosts = data.get("hosts") if isinstance(data.get("hosts"), dict) else {}
    stated = [Problem(str(path), f"[hosts.{name}.capacity]", f"a simulated host's capacity model "
                      f"lives in {SIM_FILE} as [capacity.{name}]; move it there")
              for name, host in hosts.items() if isinstance(host, dict) and "capacity" in host]
    if stated:
        return data, stated
    if isinstance(sim_text, InputError):
        return data, sim_text.problems
    try:
        sim = parse_sim_config(sim_file, sim_text)
    except InputError as exc:
        return data, exc.problems
    # Validated once, as sim.toml: each host takes its model as a plain table.
    models = {name: sim.capacity[name].model_dump() for name in model_owners(sim, hosts)}
    filled = {name: {**host, "capacity": models[name]} if name in models else host
              for name, host in hosts.items()}
    return ({**data, "hosts": filled} if models else data), capacity_problems(sim, sim_file, hosts)


def _checked(path: Path, data: dict, sim_text: str | None | InputError) -> HostsConfig:
    if "report" in data:  # hosts.toml held it until the report's words moved to its templates
        raise InputError([Problem(str(path), "[report]", "the report's title and issues live in "
                                  "templates/report.toml, as top-level keys; move them there")])
    data, sim_problems = _with_sim_models(path, data, sim_text)
    kinds = _kind_problems(path, data)
    try:
        cfg = HostsConfig.model_validate(data, strict=True)
    except ValidationError as exc:
        # A key its kind refuses is said once, in the kind's words.
        said = {p.path for p in kinds}
        raise InputError(kinds + [p for p in problems_from_validation(path, exc, _toml_loc)
                                  if p.path not in said] + sim_problems) from None
    if kinds or sim_problems:
        raise InputError(kinds + sim_problems)
    problems = _cross_references(cfg, str(path))
    if problems:
        raise InputError(problems)
    return cfg
