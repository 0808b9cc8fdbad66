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
    ],
)
def test_bad_hosts_name_file_table_and_key(repo_copy, old, new, expected):
    text = repo_copy.hosts_file.read_text()
    assert old in text
    repo_copy.hosts_file.write_text(text.replace(old, new, 1))
    errors = _errors(repo_copy.hosts_file)
    assert any(str(repo_copy.hosts_file) in e and expected in e for e in errors), errors


def test_invalid_toml_is_named(repo_copy):
    repo_copy.hosts_file.write_text("[stack\n")
    errors = _errors(repo_copy.hosts_file)
    assert "not valid TOML" in errors[0] and str(repo_copy.hosts_file) in errors[0]
