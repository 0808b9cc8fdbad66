"""The report's part for a model searched beside the seed's (report/model_search_view.py): its
bands and figure from its own searches, its answer per card and host, and the published figures
of hosts.toml beside omniprobe's least pools, each changing with the evidence."""

import shutil

from omniprobe.analysis.card_answers import gives_up
from omniprobe.config.diffusers import DiffusersProfile
from omniprobe.report.model_search_view import figure_path, least_pools
from tests.rendered import render_details, render_report
from tests.test_knob_deltas import LEAF, searched

KLEIN = "evidence/h200-klein-diffusers"
HEADING = "## FLUX.2 [klein] 4B in Diffusers: the same search"


def test_the_least_pool_is_the_least_a_at_the_first_and_last_count_with_its_profile():
    one = searched("one", LEAF, {0: (1536, 1792), 4: (2560, 2816)})
    two = searched("two", LEAF, {0: (1280, 1536), 4: (2816, 3072)})
    assert least_pools({"one": one, "two": two}) == [
        "1,536 MiB at 0 references (`two`)", "2,816 MiB at 4 references (`one`)"]
    assert least_pools({"one": searched("one", LEAF, {1: (1536, 1792)})}) == [
        "1,792 MiB at 1 reference (`one`)"]
    assert least_pools({"one": searched("one", LEAF, {})}) == []


def test_each_model_folder_has_its_own_figure():
    assert figure_path("models/flux2-klein/4b").as_posix() == (
        "report/capacity/flux2-klein-4b-min-pool.svg")


def test_running_without_a_cache_gives_nothing_up_where_the_pipeline_keeps_none():
    klein = DiffusersProfile(description="k", pipeline="Flux2KleinPipeline", offload="group-leaf",
                             use_stream=True, use_kv_cache=False)
    qwen = klein.model_copy(update={"pipeline": "QwenImage21Pipeline"})
    assert gives_up(klein, 1024) == ()
    assert gives_up(qwen, 1024) == ("KV cache off",)


def test_where_the_cache_lives_is_what_a_host_placement_gives_up():
    leaf = DiffusersProfile(description="q", pipeline="QwenImage21Pipeline", offload="group-leaf",
                            use_stream=True, use_kv_cache=True)
    for placement, words in (("gpu", ()), ("host-pinned", ("KV cache in pinned host memory",)),
                             ("host-pinned-packed", ("KV cache in packed pinned host memory",)),
                             ("host-pageable", ("KV cache in pageable host memory",))):
        assert gives_up(leaf.model_copy(update={"kv_placement": placement}), 1024) == words


def test_the_second_model_has_its_bands_answers_and_published_figures_from_their_files(
        repo_copy):
    text, details = render_report(repo_copy), render_details(repo_copy)
    section = text[text.index(HEADING):]
    assert ("| `klein-group-leaf` | 1,536–1,792 | 1,536–1,792 | 2,048–2,304 | 2,816–3,072 | "
            "2,560–2,816 |") in section
    assert "(report/capacity/flux2-klein-4b-min-pool.svg)" in section
    # the seed model's section and figure keep their own profiles only
    assert "`klein-" not in text[text.index("## Qwen-Image-2.1 in Diffusers"):text.index(HEADING)]
    klein = details[details.index("## FLUX.2 [klein] 4B in Diffusers: what its search cost"):]
    # more references fitting in less is said for this model too
    assert ("- `klein-group-leaf`: 4 reference(s) fit at 2,816 MiB, where 3 failed at 2,816"
            in klein)
    # its answer: the RTX 5080's 30 GiB host holds what Qwen-Image-2.1's searches never fit
    assert "| RTX 5080 | 30 GiB (its host's) | 0–4: `klein-group-leaf`, 12,800 spare |" in klein
    assert "| sglang | 13,180 MB | measured in continuous integration |" in klein
    assert "| Black Forest Labs | ~8 GB | a claim, its method not given |" in klein
    # a search stopped before its first band is said, with what it tried
    assert ("Stopped before their first band, never banded since: `klein-group-leaf-nostream` in "
            "2026-12-05T041410Z-h200-klein-diffusers-capacity: 7 trial(s) at 0 reference(s), "
            "15–20 s each.") in klein
    # a published figure follows hosts.toml
    hosts = repo_copy.hosts_file
    hosts.write_text(hosts.read_text().replace("value = 13180\n", "value = 13200\n"))
    assert "| sglang | 13,200 MB |" in render_details(repo_copy)
    # without the model's evidence, no section
    shutil.rmtree(repo_copy.root / KLEIN)
    assert HEADING not in render_report(repo_copy)
    assert "FLUX.2 [klein] 4B in Diffusers" not in render_details(repo_copy)


def test_a_models_opening_line_groups_cards_by_answer_at_the_least_host_ram_that_holds_it():
    from omniprobe.analysis.card_answers import HOST_SHORT, RUNS, Answer
    from omniprobe.report.answers_view import AnswerRow, model_line

    def row(card, rams, status, stated=False):
        answers = tuple(Answer(card, rams[-1] * 1024, n, status, "leaf", 512, 1.0)
                        for n in range(3))
        return AnswerRow(card, tuple(r * 1024 for r in rams), stated, answers, answers)

    words = {"leaf": "leaf offload"}
    rows = [row("A", (16,), HOST_SHORT), row("A", (32, 64), RUNS),
            row("B", (30,), RUNS, stated=True),
            row("C", (16,), HOST_SHORT), row("C", (32, 64), RUNS),
            row("D", (16, 32, 64), HOST_SHORT)]
    assert model_line(rows, words) == (
        "1–2 references with leaf offload (`leaf`; derived) on the A and C with 32 GiB RAM, and "
        "the B with its host's 30 GiB; nothing searched runs on the D with any host RAM asked")
    # a larger host on A: its least RAM moves, and its line with it
    rows[1] = row("A", (64,), RUNS)
    assert model_line(rows, words).startswith(
        "1–2 references with leaf offload (`leaf`; derived) on the A with 64 GiB RAM, and the B "
        "with its host's 30 GiB, and the C with 32 GiB RAM;")
