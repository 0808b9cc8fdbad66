import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.errors import InputError


def test_committed_hosts_load(repo):
    cfg = load_hosts(repo.hosts_file)
    assert cfg.hosts["rtx5080"].compute_capability == "12.0"
    assert cfg.stack.model_revision == "790c9263"
    assert cfg.probe.target_reference_count == 4
    assert "--quantization" in cfg.flag_sets["fp8"].args


def _errors(path) -> list[str]:
    with pytest.raises(InputError) as info:
        load_hosts(path)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'hostname = "cachyos-alexander"',
            'hostname = "cachyos-alexander"\ncolour = "red"',
            "[hosts.rtx3090] key 'colour': unknown key",
        ),
        (
            'hostname = "cachyos-alexander"\n',
            "",
            "[hosts.rtx3090] key 'hostname': required field is missing",
        ),
        ("vram_gb = 24", 'vram_gb = "lots"',
         "[hosts.rtx3090] key 'vram_gb': Input should be a valid integer"),
        (
            '"cpuoff-expandable", "fp8"]',
            '"cpuoff-expandable", "fp8", "turbo"]',
            "[hosts.rtx3090] key 'serve_flag_sets': flag set 'turbo' is not defined under [flag_sets]",
        ),
        (
            'deploy_config = "deploy-fp8v"',
            'deploy_config = "nope"',
            "[flag_sets.cpuoff-fp8v] key 'deploy_config': deploy config 'nope'",
        ),
        ("port = 8091", 'port = 8091\nbind_host = "0.0.0.0"',
         "[serve] key 'bind_host': Input should be '127.0.0.1' (got '0.0.0.0')"),
        # A card without its total, or with a figure whose source is not said; a host that names
        # a card hosts.toml does not define.
        ("memory_total_mib = 12227\n", "",
         "[cards.rtx5070] key 'memory_total_mib': required field is missing"),
        ("memory_total_mib = 12227", "memory_total_mib = 0",
         "[cards.rtx5070] key 'memory_total_mib': Input should be greater than 0"),
        ('overhead_source = { kind = "assumed", where = "chosen by omniprobe: as for the RTX 3090" }\n'
         'other_processes_mib = 0\nother_processes_source = { kind = "assumed", where = '
         '"chosen by omniprobe: a card with no desktop on it" }\n\n[cards.rtx5070]',
         'overhead_source = { kind = "guessed", where = "x" }\nother_processes_mib = 0\n'
         'other_processes_source = { kind = "assumed", where = "x" }\n\n[cards.rtx5070]',
         "[cards.rtx3060-12gb] key 'overhead_source.kind': Input should be 'nvml', "
         "'public-nvidia-smi' or 'assumed'"),
        ("seeds = [2301, 2302, 2303, 2304]", "seeds = [2301, 4294967296]",
         "[diffusers_profiles.seed-baseline] key 'seeds.1': Input should be less than or equal "
         "to 4294967295"),
        ("seeds = [2301, 2302, 2303, 2304]", "seeds = [-1]",
         "[diffusers_profiles.seed-baseline] key 'seeds.0': Input should be greater than or "
         "equal to 0"),
        ('card = "rtx5080"', 'card = "rtx5080-super"',
         "[hosts.rtx5080] key 'card': card 'rtx5080-super' is not defined under [cards]"),
        # A calibration reads its real run from one place, on an emulated Diffusers host, under
        # profiles that host runs (issue 32).
        ('figure = "diffusers_ceiling_references"\n', "",
         "[calibrations.b2g]: name exactly one of figure or baseline_attempt"),
        ('ceiling = true\nclosest', 'ceiling = true\nbaseline_attempt = "x"\nclosest',
         "[calibrations.b2g]: name exactly one of figure or baseline_attempt"),
        ('emulated_host = "rtx5080-on-h200-diffusers"\nfigure',
         'emulated_host = "rtx5080"\nfigure',
         "[calibrations.b2g] key 'emulated_host': 'rtx5080' is not an emulated Diffusers host"),
        ('closest = "seed-baseline-capacity"\ngrid', 'closest = "group-leaf-turbo"\ngrid',
         "[calibrations.b2g] key 'closest': Diffusers profile 'group-leaf-turbo' is not run on "
         "host 'rtx5080-on-h200-diffusers'"),
        ('grid = ["seed-baseline", ', 'grid = ["cpuoff-fp8", ',
         "[calibrations.q3-4r] key 'grid': Diffusers profile 'cpuoff-fp8' is not run"),
        # Hosts that name one card state one host RAM: a card's verdict reads it (issue 53).
        ('card = "rtx3090"', 'card = "rtx5080"',
         "[hosts.rtx5080] key 'host_ram_gib': 30.0 GiB, while host 'rtx3090', which names the "
         "same card 'rtx5080', states None"),
        # A list names each profile, flag set or kwarg set once (issue 53).
        ('card-emulations = ["model-cpu", ', 'card-emulations = ["model-cpu", "model-cpu", ',
         "[diffusers_profile_lists] key 'card-emulations': 'model-cpu' is named 2 times: name "
         "it once"),
        ('diffusers_profiles = ["tiny-cpu", "tiny-cpu-nokv"]',
         'diffusers_profiles = ["tiny-cpu", "tiny-cpu-nokv", "tiny-cpu"]',
         "[hosts.diffusers-tiny-cpu] key 'diffusers_profiles': 'tiny-cpu' is named 2 times"),
        # A profile's base must be a profile, and no circle.
        ('base = "group-leaf"\ndescription = "leaf-level group offload with streams and expandable',
         'base = "group-leafy"\ndescription = "leaf-level group offload with streams and expandable',
         "[diffusers_profiles.group-leaf-expandable] key 'base': 'group-leafy' is not a profile of "
         "[diffusers_profiles]"),
        ('[diffusers_profiles.group-leaf]\n', '[diffusers_profiles.group-leaf]\nbase = "group-leaf-nokv"\n',
         "[diffusers_profiles.group-leaf-nokv] key 'base': a circle of bases, group-leaf -> "
         "group-leaf-nokv -> group-leaf"),
        # A flag set and a Diffusers profile are two things: never one name for both.
        ("[diffusers_profiles.group-leaf-lowmem]", "[diffusers_profiles.fp8]",
         "[diffusers_profiles.fp8]: 'fp8' is also a flag set ([flag_sets.fp8]): a flag set and a "
         "Diffusers profile cannot share a name"),
        ('emulated_host = "rtx3090-on-h200-diffusers"\nbaseline_attempt',
         'emulated_host = "rtx3090-on-h200-diffusers"\nceiling = true\nbaseline_attempt',
         "[calibrations.q3-4r]: ceiling = true reads a figure"),
    ],
)
def test_bad_hosts_name_file_table_and_key(repo_copy, old, new, expected):
    text = repo_copy.hosts_file.read_text()
    assert old in text
    repo_copy.hosts_file.write_text(text.replace(old, new, 1))
    errors = _errors(repo_copy.hosts_file)
    assert any(str(repo_copy.hosts_file) in e and expected in e for e in errors), errors


@pytest.mark.parametrize(("old", "new"), [
    # a named list's repeat, not again at each host that takes the list
    ('card-emulations = ["model-cpu", ', 'card-emulations = ["model-cpu", "model-cpu", '),
    # a flag set repeated by a real host, not again at the host that emulates its card
    ('serve_flag_sets = [', 'serve_flag_sets = ["cpuoff", '),
])
def test_a_repeat_is_named_once_where_it_is_written(repo_copy, old, new):
    text = repo_copy.hosts_file.read_text()
    repo_copy.hosts_file.write_text(text.replace(old, new, 1))
    errors = [e for e in _errors(repo_copy.hosts_file) if "is named 2 times" in e]
    assert len(errors) == 1, errors


def test_invalid_toml_is_named(repo_copy):
    repo_copy.hosts_file.write_text("[stack\n")
    errors = _errors(repo_copy.hosts_file)
    assert "not valid TOML" in errors[0] and str(repo_copy.hosts_file) in errors[0]


def test_a_config_loaded_again_answers_to_what_changed_since(repo_copy):
    """A load remembers its checked config by hosts.toml's and sim.toml's text: an unchanged
    project gives the same config; a changed sim.toml, or a snapshot manifest gone since, is
    still found."""
    first = load_hosts(repo_copy.hosts_file)
    assert load_hosts(repo_copy.hosts_file) is first
    sim = repo_copy.root / "sim.toml"
    text = sim.read_text()
    assert "vram_mib = 24576" in text
    sim.write_text(text.replace("vram_mib = 24576", "vram_mib = -1", 1))
    assert any("sim.toml" in e and "vram_mib" in e for e in _errors(repo_copy.hosts_file))
    sim.write_text(text)
    hosts = repo_copy.hosts_file.read_text()
    named = hosts.replace("vram_tolerance = ", 'snapshot_manifest = "m.json"\nvram_tolerance = ', 1)
    assert named != hosts
    repo_copy.hosts_file.write_text(named)
    (repo_copy.root / "m.json").write_text("{}")
    assert load_hosts(repo_copy.hosts_file).env.checks.snapshot_manifest == "m.json"
    (repo_copy.root / "m.json").unlink()
    assert _errors(repo_copy.hosts_file) == [
        f"{repo_copy.hosts_file}: [env.checks] key 'snapshot_manifest': file 'm.json' not found "
        "next to hosts.toml"]
