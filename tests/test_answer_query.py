"""`omniprobe answer` (report/answer_query.py): the report's answer per card and host, asked for
any card and host RAM from the committed evidence; the same words as the report's table where
both ask the same, and a different answer where the card or the RAM differs."""

import pytest

from omniprobe.cli import main
from omniprobe.evidence.validate import load_valid_project
from omniprobe.report.answer_query import asked_answers, asked_card
from omniprobe.report.diffusers_view import diffusers_section

QWEN, KLEIN = "models/qwen-image-2.1/full", "models/flux2-klein/4b"


def _answer(repo, card, ram_gib, folder=QWEN, usable_mib=None):
    loaded = load_valid_project(repo)
    figures = asked_card(loaded.hosts, repo.hosts_file, card, usable_mib)
    (asked,) = asked_answers(loaded, repo.root, figures, round(ram_gib * 1024), folder)
    return asked.row


def test_asked_as_the_report_asks_it_answers_as_the_report_does(repo):
    """Every row of both models' answer tables: the card and each of its RAM sizes."""
    loaded = load_valid_project(repo)
    section = diffusers_section(loaded, repo.root)
    tables = {QWEN: section.answers, **{v.configs: v.answers for v in section.other_models}}
    assert set(tables) == {QWEN, KLEIN}
    keys = {card.name: key for key, card in loaded.hosts.cards.items()}
    checked = 0
    for folder, table in tables.items():
        for row in table.rows:
            for ram_mib in row.ram_mib:
                asked = _answer(repo, keys[row.card], ram_mib / 1024, folder)
                assert (asked.what_runs, asked.giving_nothing_up, asked.grade) == (
                    row.what_runs, row.giving_nothing_up, row.grade), (folder, row.card, ram_mib)
                checked += 1
    assert checked >= 2 * len(keys)


@pytest.mark.parametrize("card, ram_gib, usable_mib, what_runs", [
    # the report's sizes: 32 GiB holds no searched profile's host need, 64 does
    ("rtx3090", 32, None, "0–4: none, each needs 34.2 GiB host RAM or more"),
    ("rtx3090", 64, None, "0–4: `group-leaf-res512`, 13,056 spare"),
    # a size the report never asks: 40 GiB holds the seed baseline's 34.2, not leaf offload's
    ("rtx3090", 40, None, "0–4: `seed-baseline-capacity`"),
    # a card not listed, by its pool: 9,000 MiB runs fewer profiles at more references
    (None, 64, 9000, "0–1: `group-leaf-res512`, 296 spare; 2: `group-leaf-release`, 1,064 "
                     "spare; 3–4: `group-leaf-nokv`, 808 spare"),
])
def test_the_answer_moves_with_the_card_and_the_ram(repo, card, ram_gib, usable_mib, what_runs):
    row = _answer(repo, card, ram_gib, usable_mib=usable_mib)
    assert row.what_runs.startswith(what_runs), row.what_runs
    if usable_mib is not None:  # the user's figure is the answer's assumption, named
        assert row.assumptions == [f"usable pool {usable_mib:,} MiB as given"]


def test_the_command_prints_each_models_answer(repo, monkeypatch, capsys):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo.root))
    assert main(["answer", "--card", "rtx5080", "--host-ram-gib", "30"]) == 0
    out = capsys.readouterr().out
    assert "Qwen-Image-2.1 (models/qwen-image-2.1/full) on the RTX 5080" in out
    assert "FLUX.2 [klein] 4B (models/flux2-klein/4b) on the RTX 5080" in out
    assert "what runs, by reference count: 0–4: `klein-group-leaf`" in out
    assert "never seconds for this card" in out
    # the models set up and not searched are named with the command that searches them
    assert ("FLUX.2 [klein] 9B (models/flux2-klein/9b): set up, not searched yet; `omniprobe "
            "probe-capacity --host h200-klein9b-diffusers` searches it") in out
    assert "FLUX.2 [klein] 9B KV (models/flux2-klein-kv/9b): set up, not searched yet" in out
    # asked of one model (written as a shell completes it), the others are not listed
    assert main(["answer", "--card", "rtx5080", "--host-ram-gib", "30", "--model-folder",
                 "./models/flux2-klein/4b/"]) == 0
    out = capsys.readouterr().out
    assert "FLUX.2 [klein] 4B (models/flux2-klein/4b)" in out and "not searched yet" not in out


@pytest.mark.parametrize("argv, words", [
    (["--card", "rtx4090", "--host-ram-gib", "32"],
     "[cards]: no card 'rtx4090'; expected one of rtx3090, rtx5080"),
    (["--card", "rtx3090", "--host-ram-gib", "32", "--model-folder", "models/none"],
     "models/none: no capacity search of this model folder is on record; expected one of "
     "models/qwen-image-2.1/full, models/flux2-klein/4b"),
    (["--card", "rtx3090", "--host-ram-gib", "32", "--model-folder", "models/flux2-klein/9b"],
     "models/flux2-klein/9b: set up on h200-klein9b-diffusers, h100-klein9b-diffusers and not "
     "searched yet: `omniprobe probe-capacity --host h200-klein9b-diffusers` searches it"),
    (["--card", "rtx3090", "--host-ram-gib", "nan"],
     "argument --host-ram-gib: expected a host RAM in GiB above 0 and at most 4096, got 'nan'"),
    (["--card", "rtx3090", "--host-ram-gib", "0"], "above 0 and at most 4096, got '0'"),
    (["--usable-mib", "-5", "--host-ram-gib", "32"], "argument --usable-mib: expected"),
    (["--card", "rtx3090", "--usable-mib", "9000", "--host-ram-gib", "32"],
     "not allowed with argument"),
    (["--host-ram-gib", "32"], "one of the arguments --card --usable-mib is required"),
])
def test_a_bad_question_is_refused_in_words(repo, monkeypatch, capsys, argv, words):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo.root))
    try:
        code = main(["answer", *argv])
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err


def test_with_no_search_on_record_the_command_says_what_makes_one(tmp_path, monkeypatch, capsys):
    from tests.conftest import make_project

    project = make_project(tmp_path)  # hosts.toml and fixtures
    project.evidence_dir.mkdir()  # and no evidence in it
    monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
    assert main(["answer", "--card", "rtx3090", "--host-ram-gib", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no capacity search is on record: `omniprobe probe-capacity` makes one")
    # each model set up, with a host that searches it (never one capped like a card)
    assert ("Qwen-Image-2.1 (models/qwen-image-2.1/full): set up, not searched yet; `omniprobe "
            "probe-capacity --host h200-diffusers` searches it") in out
    assert "-on-h200-" not in out


def test_the_host_ram_each_running_answer_needs_reads_by_count():
    from omniprobe.analysis.card_answers import HOST_SHORT, RUNS, Answer
    from omniprobe.report.answer_query import host_need_words

    def one(n, status, gib):
        return Answer("c", 65536, n, status, "p", host_need_mib=None if gib is None else gib * 1024)

    assert host_need_words((one(0, RUNS, 41.6), one(1, RUNS, 41.6), one(2, RUNS, 41.7),
                            one(3, HOST_SHORT, 70.0), one(4, RUNS, 41.9))) == (
        "0–1: 41.6 GiB; 2: 41.7 GiB; 4: 41.9 GiB")
    assert host_need_words((one(0, HOST_SHORT, 34.2),)) == "—"
    assert host_need_words((one(0, RUNS, None),)) == "—"  # a need not measured says nothing
