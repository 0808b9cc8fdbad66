"""Hostile input, round 4 (issue 53): cards without sense are refused when hosts.toml loads,
naming the file and the [cards.X] key, and nothing is rendered from them; a simulated card's CUDA
context lies within the card."""

from __future__ import annotations

import pytest

from omniprobe.cli import main
from omniprobe.config.hosts import load_hosts, parse_hosts
from omniprobe.errors import InputError

from .conftest import REPO

HOSTS = (REPO / "hosts.toml").read_text()
R3090 = "[cards.rtx3090]\nname = \"RTX 3090\"\nvram_gb = 24\nmemory_total_mib = 24576\n"
R5080 = "[cards.rtx5080]\nname = \"RTX 5080\"\nvram_gb = 16\nmemory_total_mib = 16384\n"


def _card(old: str, new: str, table: str = R3090) -> str:
    """hosts.toml with `old` replaced by `new` within one card's table."""
    assert table in HOSTS and old in table
    return HOSTS.replace(table, table.replace(old, new))


def _figure(table: str, key: str, value) -> str:
    """hosts.toml with one figure of the table's card (the line after its opening) set."""
    start = HOSTS.index(table)
    line = HOSTS.index(f"\n{key} = ", start) + 1
    end = HOSTS.index("\n", line)
    return HOSTS[:line] + f"{key} = {value}" + HOSTS[end:]


CASES = [
    # (case, hosts.toml's text, the [cards.X] key named, what was expected)
    ("memory_total_mib below the overhead", _figure(R3090, "memory_total_mib", 256),
     "[cards.rtx3090]", "overhead_mib 512 MiB must lie below memory_total_mib 256"),
    ("an overhead above the total", _figure(R3090, "overhead_mib", 30000),
     "[cards.rtx3090]", "overhead_mib 30,000 MiB must lie below memory_total_mib 24,576"),
    ("other processes above the total", _figure(R5080, "other_processes_mib", 16384),
     "[cards.rtx5080]", "other_processes_mib 16,384 MiB must lie below memory_total_mib"),
    ("a usable pool of exactly 0",
     _figure(R3090, "other_processes_mib", 24064),
     "[cards.rtx3090]", "is 0 MiB: it must be more than 0"),
    ("a usable pool below 0",
     _figure(R3090, "other_processes_mib", 24100),
     "[cards.rtx3090]", "is -36 MiB: it must be more than 0"),
    ("a 1 TiB total on a card whose host says 24 GB",
     _card("memory_total_mib = 24576", "memory_total_mib = 1048576"),
     "[cards.rtx3090] key 'memory_total_mib'", "1,048,576 MiB is 4167% from vram_gb 24"),
    ("the total and the marketed size both moved to 1 TiB",
     _card("vram_gb = 24\nmemory_total_mib = 24576", "vram_gb = 1024\nmemory_total_mib = 1048576"),
     "[cards.rtx3090] key 'vram_gb'", "1024 GB, while host 'rtx3090', which names the card, "
                                      "says 24 GB"),
    ("a total 10% short of its marketed size",
     _card("memory_total_mib = 24576", "memory_total_mib = 22118"),
     "[cards.rtx3090] key 'memory_total_mib'", "expected within 5% ([env.checks] vram_tolerance"),
    ("a total past 1 TiB", _card("memory_total_mib = 24576", "memory_total_mib = 2097152"),
     "[cards.rtx3090] key 'memory_total_mib'", "less than or equal to 1048576"),
    ("a 200,000-character name", _card('name = "RTX 3090"', f'name = "{"R" * 200_000}"'),
     "[cards.rtx3090] key 'name'", "at most 100 characters"),
    ("a name of two lines", _card('name = "RTX 3090"', 'name = "RTX 3090\\nRTX 4090"'),
     "[cards.rtx3090] key 'name'", "one line of printable characters"),
    ("a name with a bidi override", _card('name = "RTX 3090"', 'name = "RTX \\u202e0903"'),
     "[cards.rtx3090] key 'name'", "one line of printable characters"),
    # A card's identity: the host's evidence reads as its GPU's, so another GPU's name is refused.
    ("a card renamed so its host's evidence reads under a new name",
     _card('name = "RTX 3090"', 'name = "RTX 4090"'),
     "[cards.rtx3090] key 'name'", "'RTX 4090' is not the GPU host 'rtx3090' names "
                                   "('NVIDIA GeForce RTX 3090')"),
    ("a host pointed at another GPU's card",
     HOSTS.replace('card = "rtx5080"', 'card = "rtx3090"'),
     "[cards.rtx3090] key 'vram_gb'", "24 GB, while host 'rtx5080', which names the card, "
                                      "says 16 GB"),
    ("two hosts naming one card whose figures disagree with one of them",
     HOSTS.replace('card = "rtx5080"\n', 'card = "rtx3090"\n').replace(
         "host_ram_gib = 30\nhost_ram_note", "host_ram_note"),
     "[cards.rtx3090] key 'name'", "'RTX 3090' is not the GPU host 'rtx5080' names"),
]


@pytest.mark.parametrize(("case", "text", "where", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_card_without_sense_is_refused_naming_hosts_toml_and_its_key(tmp_path, case, text,
                                                                       where, words):
    path = tmp_path / "hosts.toml"
    (tmp_path / "sim.toml").write_text((REPO / "sim.toml").read_text())
    with pytest.raises(InputError) as refused:
        parse_hosts(path, text)
    named = [str(p) for p in refused.value.problems]
    assert any(p.startswith(f"{path}: {where}") and words in p for p in named), named


def test_the_committed_cards_hold_their_figures_as_their_hosts_say():
    cfg = load_hosts(REPO / "hosts.toml")
    assert {k: c.usable_pool_mib for k, c in cfg.cards.items()} == {
        "rtx3090": 24064, "rtx5080": 15872, "rtx3060-12gb": 11776, "rtx5070": 11715,
        "rtx5090": 32095}


def test_a_card_without_sense_renders_nothing(repo_copy, monkeypatch, capsys):
    report = repo_copy.report_file.read_bytes()
    repo_copy.hosts_file.write_text(_figure(R3090, "other_processes_mib", 24064))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert main(["report"]) == InputError.exit_code
    err = " ".join(capsys.readouterr().err.split())
    assert "[cards.rtx3090]" in err and "must be more than 0" in err and "Traceback" not in err
    assert repo_copy.report_file.read_bytes() == report


SIM = (REPO / "sim.toml").read_text()


@pytest.mark.parametrize(("context", "words"), [
    (24576, "context_mib 24,576 MiB must lie below vram_mib 24,576"),
    (65536, "context_mib 65,536 MiB must lie below vram_mib 24,576"),
    (511, None),
])
def test_a_simulated_cuda_context_lies_within_the_simulated_card(repo_copy, context, words):
    from omniprobe.sim.capacity import CapacityError, load_sim_host

    repo_copy.sim_file.write_text(SIM.replace("context_mib = 512", f"context_mib = {context}"))
    if words is None:
        load_hosts(repo_copy.hosts_file)
        assert load_sim_host(repo_copy.hosts_file, "sim").capacity.context_mib == context
        return
    with pytest.raises(InputError) as refused:
        load_hosts(repo_copy.hosts_file)
    named = [str(p) for p in refused.value.problems]
    assert any(p.startswith(f"{repo_copy.sim_file}: [capacity.sim]: {words}") for p in named), named
    # The sim's own reading of its table refuses it too, naming the same rule.
    with pytest.raises(CapacityError, match=words):
        load_sim_host(repo_copy.hosts_file, "sim")


def test_an_emulated_cap_that_cannot_hold_the_simulated_context_is_refused(repo_copy):
    text = repo_copy.hosts_file.read_text()
    old = 'emulates = "sim"\nmechanism = "sim-account"'
    assert old in text
    repo_copy.hosts_file.write_text(text.replace(old, old + "\ncapacity_mib = 512"))
    with pytest.raises(InputError) as refused:
        load_hosts(repo_copy.hosts_file)
    assert (f"{repo_copy.hosts_file}: [hosts.sim-emulated.emulation] key 'capacity_mib': 512 MiB "
            "cannot hold the simulated CUDA context, 512 MiB (sim.toml [capacity.sim] "
            "context_mib): expected more") in [str(p) for p in refused.value.problems]


EMULATED = "evidence/rtx3090-on-h200-diffusers/2026-12-02T043940Z-rtx3090-on-h200-diffusers-24576mib-offline"


@pytest.mark.parametrize(("case", "old", "new", "words"), [
    ("the card's host renamed", ('[hosts.rtx3090]\n', 'emulates = "rtx3090"'),
     ('[hosts.rtx3090-desk]\n', 'emulates = "rtx3090-desk"'),
     "emulated the card of host 'rtx3090', which hosts.toml no longer defines: restore "
     "[hosts.rtx3090] under that name"),
    ("the emulation pointed at another card", ('emulates = "rtx3090"',),
     ('emulates = "rtx5080"',),
     "emulated 'rtx3090', while [hosts.rtx3090-on-h200-diffusers.emulation] now emulates "
     "'rtx5080': its figures are those of 'rtx3090'"),
])
def test_a_card_that_evidence_names_keeps_its_name(repo_copy, case, old, new, words):
    from omniprobe.evidence.validate import load_project

    text = repo_copy.hosts_file.read_text()
    for before, after in zip(old, new, strict=True):
        assert before in text
        text = text.replace(before, after)
    repo_copy.hosts_file.write_text(text)
    load_hosts(repo_copy.hosts_file)  # hosts.toml alone says nothing against it
    _, problems = load_project(repo_copy)
    named = [str(p) for p in problems]
    said = f"{repo_copy.root / EMULATED / 'attempt.json'}: $.attempt.provenance.emulates: {words}"
    assert any(" ".join(p.split()).startswith(said) for p in named), named
