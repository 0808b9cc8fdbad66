"""The simulated server's pieces: capacity model, request parsing, images."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys

import numpy as np
import pytest
import requests
from PIL import Image

from omniprobe.config.hosts import load_hosts
from omniprobe.config.sim_config import SimCapacity
from omniprobe.sim import images
from omniprobe.sim.capacity import Capacity, CapacityError, load_sim_host
from omniprobe.sim.http import BadRequest, build_request, parse_multipart
from omniprobe.sim.model import Flags, UnsupportedFlags, request_peak_mib, resident_mib


@pytest.fixture
def cap(project):
    return load_sim_host(project.hosts_file, "sim").capacity


def test_capacity_model_reproduces_the_3090_shape(cap):
    budget = cap.vram_mib - cap.context_mib
    bf16 = Flags("bf16", cpu_offload=True, layerwise=False)
    assert resident_mib(cap, Flags("bf16", False, False)) > budget  # default: OOM at init
    assert request_peak_mib(cap, bf16, 3) <= budget < request_peak_mib(cap, bf16, 4)
    assert request_peak_mib(cap, Flags("bf16", True, True), 1) > budget
    assert request_peak_mib(cap, Flags("fp8", True, False), 4) <= budget
    with pytest.raises(UnsupportedFlags, match="'awq' is not in the capacity model"):
        resident_mib(cap, Flags("awq", True, False))


def test_margins_hold_under_a_24_gib_torch_cap(cap):
    # Under --torch the cap is on PyTorch's allocations alone (the context comes on top).
    bf16 = Flags("bf16", cpu_offload=True, layerwise=False)
    assert request_peak_mib(cap, bf16, 3) <= 24 * 1024 - 1024
    assert request_peak_mib(cap, bf16, 4) - cap.spike_mib <= 24 * 1024 - 512
    assert request_peak_mib(cap, bf16, 4) > 24 * 1024


def test_multipart_as_requests_sends_it():
    prepared = requests.Request(
        "POST", "http://x/v1/images/edits", data={"prompt": "p", "size": "64x48", "seed": "7"},
        files=[("image", ("a.png", b"AAA", "image/png")), ("image", ("b.png", b"BB", "image/png"))],
    ).prepare()
    fields, parts = parse_multipart(prepared.headers["Content-Type"], prepared.body)
    assert fields == {"prompt": "p", "size": "64x48", "seed": "7"}
    assert parts == [b"AAA", b"BB"]
    # a payload holding CRLFs, dashes and a boundary-like line comes back byte for byte
    tricky = b"\r\n--\r\n\r\n--not-the-boundary\r\n\x00\xff\r\n"
    prepared = requests.Request("POST", "http://x/v1/images/edits", data={"prompt": "p"},
                                files=[("image[]", ("t.png", tricky, "image/png"))]).prepare()
    assert parse_multipart(prepared.headers["Content-Type"], prepared.body) == (
        {"prompt": "p"}, [tricky])


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/json", b"{}"),
    ("multipart/form-data", b"--x\r\n\r\n"),
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="p"'),
])
def test_a_body_that_is_not_a_form_is_a_400(content_type, body):
    with pytest.raises(BadRequest):
        parse_multipart(content_type, body)


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "prompt is required"),
    ({"prompt": "p", "response_format": "url"}, "b64_json"),
    ({"prompt": "p", "model": "other"}, "Model mismatch"),
    ({"prompt": "p", "size": "wide"}, "WxH"),
])
def test_bad_requests_are_400s(fields, message):
    with pytest.raises(BadRequest, match=message):
        build_request(fields, [], "Qwen/Qwen-Image-2.1")


def test_size_defaults_to_the_first_image():
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30)).save(buffer, "PNG")
    request, metrics = build_request({"prompt": "p", "return_stage_metrics": "true"},
                                     [buffer.getvalue()], "m")
    assert (request.width, request.height, metrics) == (40, 30, True)


def test_images_are_deterministic_and_fp8_collapses():
    ref = b"reference bytes"  # collapsed outputs hash their inputs without decoding them
    one = images.png(images.sound("p", [], 2301, 96, 64))
    assert one == images.png(images.sound("p", [], 2301, 96, 64))
    assert one != images.png(images.sound("p", [], 2302, 96, 64))
    assert images.png(images.collapsed("p", [], 1, 96, 64)) != images.png(
        images.collapsed("p", [ref], 1, 96, 64))
    sound = np.asarray(Image.open(io.BytesIO(one)))
    broken = np.asarray(images.collapsed("p", [], 2301, 200, 150))
    assert sound.shape == (64, 96, 4) and (sound[..., 3] == 255).all()
    assert (broken[..., 3] == 255).mean() < 0.04
    assert 100 < broken[..., 3].mean() < 130 and 115 < broken[..., :3].mean() < 135


def test_sim_toml_errors_name_the_file_the_capacity_table_and_key(project):
    from omniprobe.errors import InputError

    text = project.sim_file.read_text()
    project.sim_file.write_text(text.replace("spike_mib = 1536", "spike_mb = 1536"))
    with pytest.raises(InputError) as info:
        load_hosts(project.hosts_file)
    messages = [str(p) for p in info.value.problems]
    assert f"{project.sim_file}: [capacity.sim] key 'spike_mb': unknown key" in " ".join(messages)
    assert any(f"{project.sim_file}: [capacity.sim] key 'spike_mib': required field is missing"
               in m for m in messages)
    project.sim_file.unlink()
    with pytest.raises(InputError, match="a simulated host needs its capacity model: sim.toml"):
        load_hosts(project.hosts_file)


@pytest.mark.parametrize(("table", "expected"), [
    ("[capacity.nope]", "[capacity.nope]: host 'nope' is not defined in hosts.toml"),
    ("[capacity.rtx3090]", "[capacity.rtx3090]: host 'rtx3090' is of kind 'omni'; only a 'sim' "
                           "host has a model"),
    ("[capacity.sim-emulated]", "[capacity.sim-emulated]: host 'sim-emulated' is emulated: it "
                                "takes the model of the host it emulates"),
])
def test_a_capacity_model_names_a_sim_host_of_its_own(project, table, expected):
    from omniprobe.errors import InputError

    text = project.sim_file.read_text()
    project.sim_file.write_text(text + "\n" + text[text.index("[capacity.sim]"):].replace(
        "[capacity.sim]", table))
    with pytest.raises(InputError) as info:
        load_hosts(project.hosts_file)
    assert [str(p) for p in info.value.problems] == [f"{project.sim_file}: {expected}"]


def test_hosts_toml_refuses_a_capacity_model_of_its_own(project):
    from omniprobe.errors import InputError

    model = project.sim_file.read_text().split("[capacity.sim]\n", 1)[1]
    project.hosts_file.write_text(project.hosts_file.read_text().replace(
        "[hosts.sim]\n", f"[hosts.sim.capacity]\n{model}\n[hosts.sim]\n", 1))
    with pytest.raises(InputError) as info:
        load_hosts(project.hosts_file)
    assert [str(p) for p in info.value.problems] == [
        f"{project.hosts_file}: [hosts.sim.capacity]: a simulated host's capacity model lives in "
        "sim.toml as [capacity.sim]; move it there"]


def test_the_sims_reading_of_its_capacity_model_is_the_models_own(repo):
    """The sim reads its table without pydantic; SimCapacity stays the one definition of it."""
    fields = {f.name: f for f in dataclasses.fields(Capacity)}
    assert set(fields) == set(SimCapacity.model_fields)
    for name, field in SimCapacity.model_fields.items():
        ours = fields[name]
        default = (ours.default_factory() if ours.default_factory is not dataclasses.MISSING
                   else ours.default)
        assert (default is dataclasses.MISSING) == field.is_required(), name
        if not field.is_required():
            assert default == field.default, name
    cfg = load_hosts(repo.hosts_file)
    simulated = [name for name, host in cfg.hosts.items() if host.capacity is not None]
    assert {"sim", "sim-emulated", "sim-on-h200"} <= set(simulated)
    for name in simulated:  # an emulated host's model is the one of the host it emulates
        read = load_sim_host(repo.hosts_file, name)
        assert dataclasses.asdict(read.capacity) == cfg.hosts[name].capacity.model_dump(), name
        assert read.memory_file_env == cfg.hosts[name].memory_file_env


@pytest.mark.parametrize(("old", "new", "message"), [
    ("spike_mib = 1536", "spike_mb = 1536", "sim.toml: capacity.sim: unknown key 'spike_mb'"),
    ("spike_mib = 1536", "", "sim.toml: capacity.sim.spike_mib: required field is missing"),
    ("spike_mib = 1536", 'spike_mib = "1536"', "spike_mib: expected a whole number"),
    ("spike_mib = 1536", "spike_mib = true", "spike_mib: expected a whole number"),
    ("step_s = 0.02", "step_s = nan", "step_s: expected a finite number"),
    ('collapsed = ["fp8"]', "collapsed = [8]", "collapsed: expected a list of strings"),
    ("dit_mib = { bf16", "dit_mib = { bf17", "must list the same precisions"),
])
def test_a_bad_capacity_table_is_named_by_the_sim(project, old, new, message):
    text = project.sim_file.read_text()
    assert old in text
    project.sim_file.write_text(text.replace(old, new, 1))
    with pytest.raises(CapacityError, match=message.replace(".", "[.]")):
        load_sim_host(project.hosts_file, "sim")


def test_the_sim_names_a_missing_host_or_model(project):
    with pytest.raises(CapacityError, match="no host 'nope'"):
        load_sim_host(project.hosts_file, "nope")
    with pytest.raises(CapacityError, match="no \\[capacity.rtx3090\\] for host 'rtx3090'"):
        load_sim_host(project.hosts_file, "rtx3090")


def test_the_sims_argument_check_starts_without_pydantic_numpy_or_pil(project):
    """The env preflight parses each flag set in a fresh sim: it must cost an interpreter start,
    not the model code's imports (a server imports its picture code when it first draws)."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['sim', 'serve', 'm', '--omni', '--hosts-file', sys.argv[1], '--sim-host',"
        " 'sim', '--quantization', 'fp8', '--check-args']\n"
        "try:\n    runpy.run_module('omniprobe.sim', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'numpy', 'PIL'}))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(project.hosts_file)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["arguments accepted: Flags(precision='fp8', "
                                        "cpu_offload=False, layerwise=False, "
                                        "kv_cache_dtype='auto')", "[]"]
