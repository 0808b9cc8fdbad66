import json
import re

import pytest

from omniprobe import cli
from omniprobe.errors import InputError
from omniprobe.evidence.models import Cell
from omniprobe.evidence.quantities import Range
from omniprobe.report.render import cell_text, check_report, num, render_report, span, write_report

from .conftest import agreeing
from .evidence_scaffold import add_attempt

MATRIX = "evidence/rtx3090/seed-3090-1-serve-matrix"


def test_committed_report_is_fresh(repo):
    assert check_report(repo) == ""


def test_report_carries_the_seed_sections(repo):
    text = render_report(repo)
    for heading in (
        "## Verdicts",
        "## Where the cache lives",
        "## KV size",
        "## Run matrix — RTX 3090",
        "## Run matrix — RTX 5080",
        "## Output structure and the FP8 quality collapse",
        "## Offline engine runs",
        "## Measured runs and PSNR",
        "## Propagation gap",
        "## Helper-system follow-through",
        "## Out-of-scope confirmation",
        "## Evidence and provenance",
    ):
        assert heading in text
    assert "**RTX 3090 (24 GB): not-built — blocked at init, capacity, quality.**" in text
    assert "**RTX 5080 (16 GB): not-built — blocked at init.**" in text
    verdict = text[text.index("**RTX 3090 ("):text.index("**RTX 5080 (")]
    assert [line.split("**")[1] for line in verdict.splitlines() if line.startswith("- **")] == [
        "Init", "Capacity", "Quality"]
    assert "194–438 MB" in text  # KV deltas computed from the 1→2 reference peaks
    assert "26.09 / 28.75 / 26.51 / 28.92 | 27.57 |" in text  # mean computed from the rows


def test_a_changed_figure_changes_the_report_and_check_fails(repo_copy, monkeypatch, capsys):
    runs = repo_copy.root / MATRIX / "runs.json"
    data = json.loads(runs.read_text())
    data["runs"][1]["cells"][0]["wall_s"] = {"min": 31.5, "max": 31.5}
    runs.write_text(json.dumps(data))
    diff = check_report(repo_copy)
    assert "+| seed-3090-1-serve-matrix | cpuoff |" in diff and "OK 31.5 s" in diff
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    assert cli.main(["report", "--check"]) == 1
    assert "REPORT.md is stale" in capsys.readouterr().err
    write_report(repo_copy)
    assert cli.main(["report", "--check"]) == 0


def test_an_edited_template_renders_anew_in_the_same_process(repo_copy):
    """Compiled templates are kept per process by name: an edit (or another copy) must show."""
    before = render_report(repo_copy)
    template = repo_copy.templates_dir / "report.md.j2"
    text = template.read_text()
    template.write_text(text.replace("\n", "\nAn added line of words.\n", 1))
    after = render_report(repo_copy)
    assert "An added line of words." in after and "An added line of words." not in before
    template.write_text(text)
    assert render_report(repo_copy) == before


def test_verdict_wording_follows_the_evidence(repo_copy):
    add_attempt(repo_copy, "rtx5080", "fixed", runs=[{
        "flag_set": "int8", "init": {"outcome": "ready"},
        "cells": [{"fixture": "edit-compose-four", "outcome": "ok", "quality": "sound"}]}])
    text = render_report(repo_copy)
    assert "**RTX 5080 (16 GB): built.**" in text
    assert "4 references are served with sound output under int8" in text
    assert "cannot host this stack" not in text


def test_report_refuses_invalid_evidence(repo_copy):
    (repo_copy.root / MATRIX / "runs.json").write_text("[{")
    with pytest.raises(InputError, match=r"serve-matrix/runs\.json: line 1 column 3: not valid JSON"):
        render_report(repo_copy)


def test_templates_hold_no_figures(repo):
    for template in repo.templates_dir.glob("*.j2"):
        words = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", "", template.read_text(), flags=re.S)
        figures = [
            w
            for w in re.findall(r"\S*\d\S*", words)
            if not re.fullmatch(r"\(?(sha256|BF16|FP8|DiT-FP8)", w)
        ]
        assert figures == [], template.name


@pytest.mark.parametrize(
    ("value", "text"),
    [(23444, "23,444"), (34.2, "34.2"), (81.16, "81.16"), (None, "unknown"), (0.035, "0.035")],
)
def test_num(value, text):
    assert num(value) == text


@pytest.mark.parametrize(
    ("r", "digits", "text"),
    [
        (Range(min=34.62, max=35.05), None, "34.62–35.05"),
        (Range(min=36.7, max=36.7), None, "36.7"),
        (Range(min=2.199, max=2.217), 1, "2.2"),
        (Range(min=3.287, max=3.309), 1, "3.3"),
        (None, None, "unknown"),
    ],
)
def test_span(r, digits, text):
    assert span(r, digits) == text


@pytest.mark.parametrize(
    ("cell", "text"),
    [
        (None, "—"),
        (Cell(fixture="f", outcome="oom", quality="unchecked"), "**OOM**"),
        (
            Cell(fixture="f", outcome="ok", quality="sound", wall_s=Range(min=34.2, max=34.2)),
            "OK 34.2 s",
        ),
        (
            Cell(fixture="f", outcome="ok", quality="broken", wall_s=Range(min=44.06, max=44.35)),
            "OK 44.06–44.35 s — **output broken**",
        ),
        (Cell(fixture="f", outcome="ok", quality="unchecked"), "OK (output not checked)"),
    ],
)
def test_cell_text(cell, text):
    assert cell_text(cell) == text


def test_identical_psnr_rows_render_without_a_mean(repo_copy):
    rows = repo_copy.root / "evidence/rtx3090/seed-3090-2-measured-pair/psnr.json"
    data = json.loads(rows.read_text())
    rows_data = data["psnr"]
    rows_data[0] = {**rows_data[0], "identical": True}
    del rows_data[0]["psnr_db"]
    rows.write_text(json.dumps(data))
    text = render_report(repo_copy)
    assert "| identical / 28.75 / 26.51 / 28.92 | — |" in text


def test_a_filed_environment_manifest_is_shown(repo_copy):
    from datetime import UTC, datetime

    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.manifest import record_manifest

    from .env_scaffold import sample_manifest

    assert "## Probe environments" not in render_report(repo_copy)
    manifest = sample_manifest(
        host="rtx3090", python={"pinned": "3.13", "version": "3.13.16", "executable": "/v/bin/python"},
        pins=[{"name": "transformers", "kind": "index", "pin": "5.14.1", "source": "default index",
               "installed_version": "5.14.1", "resolved": "5.14.1"}],
        checks=[{"name": "gpu.name", "status": "fail", "detail": "NVML's device name",
                 "expected": "a", "actual": "b"}])
    record_manifest(repo_copy, load_hosts(repo_copy.hosts_file), manifest, command=["omniprobe", "env"],
                    started_at=datetime(2026, 11, 30, tzinfo=UTC))
    text = render_report(repo_copy)
    assert "## Probe environments" in text
    assert "| 3.13.16 | NVIDIA GeForce RTX 3090 | 24,576 | 8.6 | 999.1.2 |" in text
    assert "0 pass, 1 fail, 0 skipped — **not ok**" in text
    assert "transformers `5.14.1` → `5.14.1`" in text


def test_timeline_figures_are_rendered_and_checked(repo_copy):
    folder = add_attempt(repo_copy, "rtx3090", "probed")
    points = [{"t_s": t / 10, "device_mib": 1000 + 100 * t, "process_mib": 900 + 100 * t}
              for t in range(20)]
    (folder / "runs.json").write_text(json.dumps([{
        "flag_set": "cpuoff", "init": {"outcome": "ready"},
        "lifetimes": [{"session": "probe-serve", "started_at": "2026-11-30T09:00:00Z",
                       "command": ["vllm"], "init": {"outcome": "ready"},
                       "timeline": {"sampler": "NVML", "state": "sampled", "target_hz": 10,
                                    "rate_hz": 10.0, "samples": 20, "peak_mib": 2800,
                                    "peak_source": "process", "peak_t_s": 1.9, "points": points}}]}]))
    (folder / "requests.json").write_text(json.dumps([{
        "flag_set": "cpuoff", "fixture": "edit-compose-pair", "seed": 2301, "outcome": "ok",
        "quality": "sound", "wall_s": 1.0, "started_s": 0.5, "lifetime": 0,
        **agreeing("ok", "sound")}]))
    figure = "report/timelines/rtx3090/probed/cpuoff-0.svg"
    text = render_report(repo_copy)
    assert f"]({figure})" in text
    assert "NVML: peak 2,800 MiB (process) at 1.9 s; 20 samples at 10.0 Hz" in text
    assert f"{figure} (fresh render)" in check_report(repo_copy)
    write_report(repo_copy)
    svg = (repo_copy.root / figure).read_text()
    assert svg.startswith("<svg") and "edit-compose-pair seed 2301: ok" in svg
    assert check_report(repo_copy) == ""
    (folder / "runs.json").write_text("[]")
    write_report(repo_copy)
    assert not (repo_copy.root / figure).exists()


def test_measured_image_structure_is_tabulated(repo_copy):
    folder = add_attempt(repo_copy, "rtx3090", "gated")
    (folder / "runs.json").write_text(json.dumps([{"flag_set": "fp8", "init": {"outcome": "ready"}}]))

    def image(opaque, verdict):
        return {"mode": "RGBA", "width": 8, "height": 8, "opaque_fraction": opaque, "alpha_mean": 115.0,
                "rgb_mean": 124.5, "rgb_std": 3.0, "flatness": 0.0, "verdict": verdict}

    (folder / "requests.json").write_text(json.dumps([
        {"flag_set": "fp8", "fixture": "edit-compose-four", "seed": seed, "outcome": "ok",
         "quality": "broken", "wall_s": 44.0, "image": image(opaque, "broken"),
         "artifact": f"rtx3090/gated/{seed}.png", "output_sha256": "0" * 64}
        for seed, opaque in ((2301, 0.008), (2302, 0.035))]))
    text = render_report(repo_copy)
    assert "| gated | fp8 | edit-compose-four | 2 | 2 | 0.008–0.035 | 115.0 | 124.5 | 0.000 |" in text


def verdict_block(text, host_name):
    start = text.index(f"**{host_name} (")
    return text[start:text.index("\n**", start + 2) if "\n**" in text[start + 2:] else None]


def quality_bullet(text):
    return next(line for line in text.splitlines() if line.startswith("- **Quality**: fp8"))


def test_the_verdict_quotes_the_four_reference_cell_not_the_flag_sets_maximum(repo_copy):
    runs = repo_copy.root / MATRIX / "runs.json"
    line = quality_bullet(render_report(repo_copy))
    assert "edit-compose-four: 44.06–44.35 s" in line and "server peak 22,918 MB" in line
    assert "23,532" not in line  # the three-reference cell's peak
    assert "the run's GPU series maximum 23,983 MiB" in line
    data = json.loads(runs.read_text())
    fp8 = next(r for r in data["runs"] if r["flag_set"] == "fp8")
    cell = {c["fixture"]: c for c in fp8["cells"]}
    cell["edit-compose-three"]["server_peak_mb"] = {"min": 23999, "max": 23999}
    cell["edit-compose-four"]["server_peak_mb"] = {"min": 22111, "max": 22111}
    runs.write_text(json.dumps(data))
    line = quality_bullet(render_report(repo_copy))
    assert "server peak 22,111 MB" in line and "23,999" not in line


def test_the_oom_signature_is_named_only_with_the_flag_sets_that_record_it(repo_copy):
    text = render_report(repo_copy)
    capacity = next(line for line in text.splitlines() if line.startswith("- **Capacity**"))
    recorded, unrecorded = capacity.split("; ")
    where = "`qwen_image_21/qwen_image_21_transformer.py:293`"
    assert f"with a 490.00 MiB ask at {where} under cpuoff" in recorded
    assert "cpuoff-layerwise" not in recorded
    assert unrecorded == "with no OOM signature recorded under cpuoff-layerwise."


def test_only_real_disagreements_with_the_detail_are_named(repo):
    text = render_report(repo)
    notes = [line for line in text.splitlines() if line.startswith("- edit-compose-")]
    assert notes == [
        "- edit-compose-pair: 34.1 s in the matrix table; the detail gives 34.62–35.05 s.",
        "- edit-compose-three: 38.9 s in the matrix table; the detail gives 39.44–39.69 s.",
        "- edit-compose-four: 23,522 MB server peak in the verdict and the summary; "
        "the detail gives 22,918 MB.",
    ]


@pytest.mark.parametrize(
    ("stated", "detail", "agrees"),
    [
        ((44.3, 44.3), (44.06, 44.35), True),
        ((44.1, 44.4), (44.06, 44.35), True),
        ((34.1, 34.1), (34.62, 35.05), False),
        ((23522, 23522), (22918, 22918), False),
        ((44.4, 44.4), (44.06, 44.3), False),
    ],
)
def test_a_stated_figure_agrees_at_its_own_precision(stated, detail, agrees):
    from omniprobe.analysis.derived import agrees_at_stated_precision

    assert agrees_at_stated_precision(Range(min=stated[0], max=stated[1]),
                                      Range(min=detail[0], max=detail[1])) is agrees


def test_estimates_the_measurements_contradict_get_a_note(repo_copy):
    text = render_report(repo_copy)
    assert "give 0.18–0.41 GiB per reference" in text
    assert ("**disagrees**: the server peaks under fp8 and cpuoff at edit-compose-pair "
            "differ by 1.99 GiB") in text
    assert "allows at most 0.549 of the pixels to be fully transparent" in text
    figures = repo_copy.root / MATRIX / "figures.json"
    data = json.loads(figures.read_text())
    kv = next(f for f in data["figures"] if f["key"] == "kv_per_reference")
    kv["range"] = {"min": 0.15, "max": 0.45}
    figures.write_text(json.dumps(data))
    text = render_report(repo_copy)
    assert "**Note**: the measurements disagree with that estimate" not in text
    assert "| consistent: the server-peak deltas from one reference to two" in text


def test_a_knob_that_never_reached_the_model_is_named_as_its_base(repo_copy):
    text = render_report(repo_copy)
    assert ("under cpuoff (and cpuoff-fp8v, which ran as cpuoff: its `extras.prefix_kv_cache_dtype` "
            "never reached the model), cpuoff-expandable") in text
    prop = repo_copy.root / MATRIX / "propagation.json"
    data = json.loads(prop.read_text())
    data["propagation"][0]["bytes_identical"] = False
    prop.write_text(json.dumps(data))
    text = render_report(repo_copy)
    assert "which ran as cpuoff" not in text
    assert "under cpuoff, cpuoff-fp8v, cpuoff-expandable" in text


def test_real_hosts_come_first_and_simulated_hosts_in_an_appendix(repo):
    text = render_report(repo)
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings[1] == "## Verdicts"
    appendix = headings.index("## Appendix: simulated hosts")
    assert all("Simulated" not in h for h in headings[:appendix])
    assert all(h.startswith("### ") for h in headings[appendix + 1:])
    verdicts = text[text.index("## Verdicts"):text.index("\n## ", text.index("## Verdicts") + 1)]
    assert "**Simulated GPU" not in verdicts
    assert "GiB GPU (" not in text  # no "24 GiB GPU (24 GB)"


def test_the_history_shows_a_later_attempt_whose_verdict_differs(repo_copy):
    add_attempt(repo_copy, "rtx5080", "fixed", runs=[{
        "flag_set": "int8", "init": {"outcome": "ready"},
        "cells": [{"fixture": "edit-compose-four", "outcome": "ok", "quality": "sound"}]}])
    text = render_report(repo_copy)
    history = text[text.index("## Verdict history — RTX 5080"):]
    rows = [line for line in history.splitlines()[6:8]]
    assert rows[0].startswith("| `seed-5080-1-init-matrix` | 2026-10-07/08 | transcribed | `8484d85d1` |")
    assert rows[0].endswith(
        "| not-built | init (default, cpuoff, cpuoff-layerwise, fp8, fp8-expandable, int8) |")
    assert rows[1].startswith("| `fixed` | 2026-11-30 | measured | not recorded |")
    assert rows[1].endswith("| built | — |")


def test_what_the_source_says_reaches_the_report_from_evidence(repo_copy):
    text = render_report(repo_copy)
    verdict = text[text.index("**RTX 3090 ("):text.index("**RTX 5080 (")]
    assert "No host-DRAM spill path for the conditioning KV exists" in verdict
    assert "edit-compose-four minus ref-shop-hesper" in text
    assert "| edit-compose-pair | edit | 2 | 1248×832 |" in text
    assert "## Reproducibility" in text
    assert "only viable image backend" in text[text.index("- **#164"):]
    (repo_copy.root / "evidence/rtx5080/seed-5080-1-init-matrix/findings.json").unlink()
    assert "only viable image backend" not in render_report(repo_copy)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"enforce_eager": True, "extras": {"prefix_kv_cache_dtype": "fp8_v"}},
         "`enforce_eager=True` `extras.prefix_kv_cache_dtype=fp8_v`"),
        ({"quantization_config": {"method": "fp8", "ignored_layers": ["img_mlp"]}},
         "`quantization_config.method=fp8` `quantization_config.ignored_layers=[img_mlp]`"),
    ],
)
def test_kwargs_text(kwargs, text):
    from omniprobe.report.render import kwargs_text

    assert kwargs_text(kwargs) == text
