"""A Diffusers profile's offload settings (issue 32): the offload value names the level, streams
and pinning are settings of their own, validated before anything is built, and a profile written
before is migrated; an int8 text encoder asked of a text encoder that cannot take it is refused."""

from __future__ import annotations

import json

import pytest

from omniprobe.config.diffusers import DiffusersProfile, offload_setting_problems
from omniprobe.config.hosts import load_hosts
from omniprobe.errors import InputError

from .conftest import in_process, make_project

BASE = {"description": "d", "use_kv_cache": True}


@pytest.mark.parametrize(
    ("offload", "use_stream", "low_cpu_mem_usage", "record_stream", "expected"),
    [
        # What apply_group_offloading takes: streams at either level, and with them pinning on
        # the fly and recorded streams.
        ("group-leaf", True, False, False, []),
        ("group-leaf", True, True, True, []),
        ("group-leaf", False, False, False, []),
        ("group-block", True, True, False, []),
        ("none", False, False, False, []),
        ("model-cpu", False, False, False, []),
        # use_stream = false together with record_stream = true.
        ("group-leaf", False, False, True, ["record_stream = true needs use_stream = true"]),
        ("group-block", False, False, True, ["record_stream = true needs use_stream = true"]),
        # low_cpu_mem_usage where it is ignored: group offload without streams pins nothing...
        ("group-leaf", False, True, False, ["low_cpu_mem_usage = true needs use_stream = true"]),
        # ... and offload that is not group offload takes no stream setting at all.
        ("model-cpu", False, True, False, ["low_cpu_mem_usage: offload 'model-cpu' ignores it"]),
        ("none", True, False, False, ["use_stream: offload 'none' ignores it"]),
        ("model-cpu", True, True, True,
         ["use_stream, low_cpu_mem_usage, record_stream: offload 'model-cpu' ignores it"]),
    ],
)
def test_stream_settings_are_checked_against_the_offload_mode(offload, use_stream,
                                                              low_cpu_mem_usage, record_stream,
                                                              expected):
    problems = offload_setting_problems(offload, use_stream, low_cpu_mem_usage, record_stream)
    assert len(problems) == len(expected)
    assert all(p.startswith(e) for p, e in zip(problems, expected, strict=True)), problems


@pytest.mark.parametrize(("offload", "use_stream", "low_cpu_mem_usage", "expected"), [
    # packed needs the page-locked copies group offload with streams keeps
    ("group-leaf", True, False, []),
    ("group-block", True, False, []),
    ("group-leaf", True, True, ['pinned_weights = "packed" needs use_stream = true and '
                                "low_cpu_mem_usage = false"]),
    ("group-leaf", False, False, ['pinned_weights = "packed" needs use_stream = true']),
    ("model-cpu", False, False, ["pinned_weights: offload 'model-cpu' ignores it"]),
    ("none", False, False, ["pinned_weights: offload 'none' ignores it"]),
])
def test_packed_pinned_weights_need_the_copies_streams_keep(offload, use_stream,
                                                            low_cpu_mem_usage, expected):
    problems = offload_setting_problems(offload, use_stream, low_cpu_mem_usage, False, "packed")
    assert len(problems) == len(expected)
    assert all(p.startswith(e) for p, e in zip(problems, expected, strict=True)), problems
    assert offload_setting_problems(offload, use_stream, low_cpu_mem_usage, False, "blocks") == (
        offload_setting_problems(offload, use_stream, low_cpu_mem_usage, False))


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ('offload = "group-leaf"\nuse_stream = false\nrecord_stream = true',
         "record_stream = true needs use_stream = true"),
        ('offload = "model-cpu"\nlow_cpu_mem_usage = true',
         "low_cpu_mem_usage: offload 'model-cpu' ignores it"),
        ('offload = "group-leaf"\nlow_cpu_mem_usage = true',
         "low_cpu_mem_usage = true needs use_stream = true"),
        ('offload = "group-leaf-stream"\nuse_stream = false',
         "offload 'group-leaf-stream' means use_stream = true"),
        ('offload = "group-leaf-nostream"', "[diffusers_profiles.bad] key 'offload'"),
        ('offload = "group-leaf"\nuse_stream = true\nlow_cpu_mem_usage = true\n'
         'pinned_weights = "packed"',
         'pinned_weights = "packed" needs use_stream = true and low_cpu_mem_usage = false'),
        ('offload = "group-leaf"\nuse_stream = true\npinned_weights = "tight"',
         "[diffusers_profiles.bad] key 'pinned_weights'"),
    ],
)
def test_a_bad_profile_is_named_by_its_table_in_hosts_toml(repo_copy, settings, expected):
    with open(repo_copy.hosts_file, "a") as handle:
        handle.write(f'\n[diffusers_profiles.bad]\ndescription = "d"\nuse_kv_cache = true\n'
                     f'{settings}\n')
    with pytest.raises(InputError) as info:
        load_hosts(repo_copy.hosts_file)
    errors = [str(p) for p in info.value.problems]
    assert any(str(repo_copy.hosts_file) in e and "[diffusers_profiles.bad]" in e
               and expected in e for e in errors), errors


@pytest.mark.parametrize(
    ("given", "offload", "use_stream"),
    [
        # Before streams were a setting: the offload value said them.
        ({"offload": "group-leaf-stream"}, "group-leaf", True),
        ({"offload": "group-leaf-stream", "use_stream": True}, "group-leaf", True),
        ({"offload": "group-block"}, "group-block", False),
        ({"offload": "group-leaf", "use_stream": True}, "group-leaf", True),
    ],
)
def test_a_profile_written_before_streams_were_a_setting_is_migrated(given, offload, use_stream):
    profile = DiffusersProfile.model_validate({**BASE, **given})
    assert (profile.offload, profile.use_stream) == (offload, use_stream)
    # What a run stores of it is the migrated form, and it reads back the same.
    dumped = profile.model_dump(mode="json")
    assert dumped["offload"] == offload and DiffusersProfile.model_validate(dumped) == profile


def test_the_committed_profiles_state_their_pinning():
    from .conftest import REPO

    profiles = load_hosts(REPO / "hosts.toml").diffusers_profiles
    assert not any(p.offload == "group-leaf-stream" for p in profiles.values())
    pinning = {name: (p.offload, p.use_stream, p.low_cpu_mem_usage)
               for name, p in profiles.items()}
    # The profile names committed evidence uses keep their meaning: leaf offload with streams.
    assert pinning["group-leaf"] == ("group-leaf", True, False)
    assert pinning["seed-baseline"] == ("group-leaf", True, False)
    # The offloads that do not pin.
    assert pinning["group-leaf-nostream"] == ("group-leaf", False, False)
    assert pinning["group-leaf-lowmem"] == ("group-leaf", True, True)
    te8 = profiles["seed-baseline-te8"]
    assert (te8.quantize_dit, te8.quantize_text_encoder) == ("int8-weight-only",) * 2
    # The calibration grid: level x streams x int8 text encoder, each with the int8 DiT.
    grid = {(p.offload, p.use_stream, p.quantize_text_encoder is not None)
            for p in profiles.values() if p.quantize_dit and not p.use_kv_cache
            and p.steps == 2}
    assert grid == {(level, streams, te8) for level in ("group-leaf", "group-block")
                    for streams in (True, False) for te8 in (True, False)}


def test_an_int8_text_encoder_on_a_text_encoder_that_cannot_take_it_is_refused_before_work(
        tmp_path, monkeypatch):
    project = make_project(tmp_path, size=(96, 64))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    config = project.root / "models/qwen-image-2.1/tiny/text_encoder.json"
    data = json.loads(config.read_text())
    data["class"] = "transformers.T5EncoderModel"
    config.write_text(json.dumps(data))
    manifest = config.parent / "model.json"  # the folder names the class in both places
    data = json.loads(manifest.read_text())
    data["components"]["text_encoder"] = ["transformers", "T5EncoderModel"]
    manifest.write_text(json.dumps(data))
    text = project.hosts_file.read_text()
    old = ('[diffusers_profiles.tiny-cpu]\n'
           'description = "the tiny model on the CPU: everything resident, two steps"\n')
    assert old in text
    project.hosts_file.write_text(text.replace(
        old, old + 'quantize_text_encoder = "int8-weight-only"\n', 1))
    code, out = in_process(project, ["probe-offline", "--host", "diffusers-tiny-cpu"])
    assert code == 2, out
    assert ("[diffusers_profiles.tiny-cpu] key 'quantize_text_encoder'" in out
            and "'transformers.T5EncoderModel'" in out
            and "transformers.Qwen3VLForConditionalGeneration" in out), out
    assert not (project.evidence_dir / "diffusers-tiny-cpu").exists()


@pytest.mark.parametrize(("settings", "label"), [
    ({"offload": "group-leaf", "use_stream": True}, "group-leaf with streams"),
    ({"offload": "group-leaf"}, "group-leaf without streams"),
    ({"offload": "group-leaf", "use_stream": True, "low_cpu_mem_usage": True},
     "group-leaf with streams, low_cpu_mem_usage"),
    ({"offload": "group-block", "use_stream": True, "record_stream": True},
     "group-block with streams, record_stream"),
    ({"offload": "group-leaf", "use_stream": True, "pinned_weights": "packed"},
     "group-leaf with streams, weights pinned packed"),
    ({"offload": "model-cpu"}, "model-cpu"),
])
def test_the_report_names_the_offload_with_its_stream_settings(settings, label):
    assert DiffusersProfile.model_validate({**BASE, **settings}).offload_label == label



def test_the_runner_is_given_the_profiles_stream_settings(repo):
    """What a run hands its runner (and the settings a run stores) is the migrated profile, its
    stream settings included."""
    from omniprobe.harness.offline.matrix import offline_matrix

    cfg = load_hosts(repo.hosts_file)
    host = "rtx5080-on-h200-diffusers"
    entries, _, _ = offline_matrix(cfg, repo, host, cfg.hosts[host],
                                   ("group-leaf", "group-leaf-lowmem", "seed-baseline-te8"))
    given = {e.name: e.kwargs["profile"] for e in entries}
    pick = ("offload", "use_stream", "low_cpu_mem_usage", "record_stream",
            "quantize_text_encoder")
    assert {name: tuple(p[k] for k in pick) for name, p in given.items()} == {
        "group-leaf": ("group-leaf", True, False, False, None),
        "group-leaf-lowmem": ("group-leaf", True, True, False, None),
        "seed-baseline-te8": ("group-leaf", True, False, False, "int8-weight-only")}
