"""`omniprobe upstream check` against a synthetic upstream tree and doctored copies of it: each
doctoring changes exactly the checks or citation states that depend on what it changed."""

from __future__ import annotations

import hashlib
import inspect
import shutil
import zipfile
from pathlib import Path

import pytest

from omniprobe import protocol
from omniprobe.cli import main
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.errors import InputError
from omniprobe.evidence.models.common import CodeRef
from omniprobe.evidence.upstream import Anchor
from omniprobe.evidence.validate import load_project
from omniprobe.upstream.anchors import Citation, lines_digest, locate
from omniprobe.upstream.checks import run_checks
from omniprobe.upstream.contract import check_source, differences, record
from omniprobe.upstream.source import open_source
from omniprobe_engine import runner as offline_runner
from omniprobe_engine.images import open_reference
from omniprobe_engine.omni import OmniEngine
from omniprobe_engine.protocol import RequestSpec

from .conftest import REPO
from .upstream_tree import EMPTY_LIKE_LINE, FILES, INIT_PARAMETERS_LINES, write_tree

API = "vllm_omni/entrypoints/openai/api_server.py"
UTILS = "vllm_omni/diffusion/models/utils.py"
EDITS_DECORATOR = '@router.post("/v1/images/edits")'


def _results(root: Path) -> dict[str, str]:
    source = open_source(root)
    cfg = load_hosts(REPO / "hosts.toml")
    return {c.name: c.status for c in run_checks(source, cfg, REPO)}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict[str, str]:
    return _results(write_tree(tmp_path_factory.mktemp("tree")))


def test_the_synthetic_tree_passes_what_it_defines(baseline):
    assert baseline["serve-flag:--enable-cpu-offload"] == "pass"
    assert baseline["serve-flag:--quantization"] == "not-found"  # vLLM's own parser's
    assert baseline["route:/v1/images/edits"] == "pass"
    assert all(baseline[k] == "pass" for k in baseline
               if k.split(":")[0] in ("edits-form", "generations-json", "response",
                                      "sampling-param", "error-path", "offline"))
    assert baseline["offline-kwargs:offline-fp8v"] == "pass"
    assert baseline["offline-kwargs:offline-fp8-encoder-only"] == "not-found"  # no kwargs stated
    # No registered pipeline for the served model: every deploy-config flag set is ignored.
    assert baseline["pipeline:Qwen/Qwen-Image-2.1"] == "fail"
    assert baseline["flag-set-deploy:cpuoff-fp8v"] == "fail"
    assert baseline["log-line:deploy-config-ignored"] == "not-found"
    assert baseline["model-code:Qwen/Qwen-Image-2.1"] == "fail"  # a version before the model
    # A failed request closes upstream's engine, and ends the offline runner.
    assert baseline["offline-failure:engine-survives"] == "pass"
    # The runner takes the worker's peak off the output, and keeps the references' modes.
    assert baseline["offline-peak:worker-peak"] == "pass"
    assert baseline["reference-mode:serve-equals-offline"] == "pass"


DOCTORED = [
    ("serve flag removed",
     {"vllm_omni/entrypoints/cli/serve.py": FILES["vllm_omni/entrypoints/cli/serve.py"].replace(
         '    group.add_argument("--enable-layerwise-offload", action="store_true")\n', "")},
     {"serve-flag:--enable-layerwise-offload": "not-found"}),
    ("edits route renamed",
     {API: FILES[API].replace('"/v1/images/edits"', '"/v1/images/edit"')},
     {"route:/v1/images/edits": "fail", "error-path:edits-500": "not-found",
      "reference-mode:serve-equals-offline": "not-found",
      **{f"edits-form:{f}": "not-found" for f in (
          "image", "prompt", "size", "seed", "num_inference_steps", "true_cfg_scale",
          "response_format", "return_stage_metrics")}}),
    ("form field renamed",
     {API: FILES[API].replace("true_cfg_scale: float | None = Form(None)",
                              "cfg_scale: float | None = Form(None)")},
     {"edits-form:true_cfg_scale": "fail"}),
    ("sampling field removed",
     {"vllm_omni/inputs/data.py": FILES["vllm_omni/inputs/data.py"].replace(
         "    true_cfg_scale: float | None = None\n", "")},
     {"sampling-param:true_cfg_scale": "fail"}),
    ("peak metric no longer written",
     {API: FILES[API].replace('metrics["peak_memory_mb"] = peak', "metrics = {}")},
     {"response:metrics.peak_memory_mb": "fail"}),
    ("the model gets a registered pipeline",
     {"vllm_omni/config/pipeline_registry.py": FILES["vllm_omni/config/pipeline_registry.py"]
      .replace('"bagel": BAGEL_PIPELINE,', '"qwen_image": QWEN_IMAGE_PIPELINE,')},
     {"pipeline:Qwen/Qwen-Image-2.1": "pass", "flag-set-deploy:cpuoff-fp8v": "pass",
      "flag-set-deploy:sim-cpuoff-kvfp8v": "pass"}),
    ("the server converts every upload to RGB",
     {API: FILES[API].replace("normalize_rgb=normalize", "normalize_rgb=True")},
     {"reference-mode:serve-equals-offline": "fail"}),
    ("the model's code arrives",
     {"vllm_omni/diffusion/models/qwen_image_21/__init__.py": ""},
     {"model-code:Qwen/Qwen-Image-2.1": "pass"}),
    ("an offline kwarg no longer a config field",
     {"vllm_omni/diffusion/data.py": FILES["vllm_omni/diffusion/data.py"].replace(
         "    extras: dict = field(default_factory=dict)\n", "")},
     {"offline-kwargs:offline-fp8v": "fail", "offline-kwargs:offline-fp8v-expandable": "fail",
      "offline-kwargs:sim-offline-fp8v": "fail"}),
]


@pytest.mark.parametrize(("case", "doctor", "expected"), DOCTORED, ids=[d[0] for d in DOCTORED])
def test_a_doctored_tree_changes_exactly_the_matching_checks(tmp_path, baseline, case, doctor,
                                                             expected):
    results = _results(write_tree(tmp_path, doctor))
    changed = {name: status for name, status in results.items() if baseline.get(name) != status}
    assert changed == expected


def _runner_that_goes_on(make_engine, requests, results):
    """The offline runner as it was: a failed request is logged and the same engine goes on."""
    engine = make_engine()
    for request in requests:
        try:
            engine.generate(request)
        except Exception:
            continue


class _ClosesOnFailure:
    """An engine as upstream's Omni is: a failed request closes it."""

    peak_source, survives_failure = "worker-reserved", False

    def __init__(self):
        self.asked = 0

    def generate(self, request):
        self.asked += 1
        raise RuntimeError("the request failed; the engine is closed")


def _ends_at_a_failed_request(run, tmp_path: Path) -> bool:
    """Whether `run` asks an engine that closes on a failure nothing after its first failed
    request, so no request reaches an engine that closed."""
    engine = _ClosesOnFailure()
    requests = [RequestSpec(id=f"r{i}", fixture="f", seed=i, prompt="p", width=8, height=8,
                            reference_paths=[], num_inference_steps=1, true_cfg_scale=1.0,
                            output=str(tmp_path / f"{i}.png")) for i in range(3)]
    run(lambda: engine, requests, offline_runner.Results(str(tmp_path / "results.jsonl")))
    return engine.asked == 1


def test_the_protocol_says_what_the_offline_runner_does(tmp_path):
    """The runner cannot import omniprobe: what the upstream checks read of it (protocol.py) is
    held to its code here."""
    assert not OmniEngine.survives_failure
    assert (_ends_at_a_failed_request(offline_runner.run, tmp_path)
            is protocol.ENDS_AT_A_FAILED_REQUEST)
    # the reading sees one going on
    assert not _ends_at_a_failed_request(_runner_that_goes_on, tmp_path)
    opens = inspect.getsource(OmniEngine) + inspect.getsource(open_reference)
    assert ('convert("RGB")' in opens) is protocol.REFERENCES_TO_RGB


@pytest.mark.parametrize(("ends", "closes", "status"), [
    (True, True, "pass"),
    (False, True, "fail"),  # the runner as it was: a failed request, and the same engine goes on
    (False, False, "pass"),  # upstream would keep the engine open
])
def test_a_runner_going_on_after_a_failure_fails_only_where_upstream_closes(
        tmp_path, monkeypatch, ends, closes, status):
    monkeypatch.setattr(protocol, "ENDS_AT_A_FAILED_REQUEST", ends)
    omni = "vllm_omni/entrypoints/omni.py"
    doctor = {} if closes else {omni: FILES[omni].replace("            self.close()\n", "")}
    assert _results(write_tree(tmp_path, doctor))["offline-failure:engine-survives"] == status


def _state(root: Path, ref: CodeRef):
    return locate(open_source(root), Citation("test", ref))


INIT_REF = CodeRef(file=UTILS, lines=INIT_PARAMETERS_LINES, function="init_parameters",
                   anchor=Anchor(snippet="empty_like"))
MOVED_DOWN = FILES[UTILS].replace("def helper():", "\n" * 20 + "def helper():")


@pytest.mark.parametrize(("case", "doctor", "ref", "status", "found_lines"), [
    ("as cited", {}, INIT_REF, "holds", str(EMPTY_LIKE_LINE)),
    ("moved down twenty lines", {UTILS: MOVED_DOWN}, INIT_REF, "moved", str(EMPTY_LIKE_LINE + 20)),
    ("function moved, no snippet", {UTILS: MOVED_DOWN},
     CodeRef(file=UTILS, lines=INIT_PARAMETERS_LINES, function="init_parameters"), "moved",
     "28-33"),
    ("snippet gone from the function", {UTILS: FILES[UTILS].replace("empty_like", "zeros_like")},
     INIT_REF, "changed", INIT_PARAMETERS_LINES),
    ("function renamed", {UTILS: FILES[UTILS].replace("def init_parameters", "def make_params")},
     CodeRef(file=UTILS, lines=INIT_PARAMETERS_LINES, function="init_parameters"), "gone", None),
    ("file deleted", {UTILS: None}, INIT_REF, "absent", None),
    ("a path suffix resolves", {}, CodeRef(file="models/utils.py", lines="11",
                                           anchor=Anchor(snippet="empty_like")), "holds", "11"),
    ("gap path of a model the version predates", {},
     CodeRef(file="qwen_image_21/.../qwen_image_21_transformer.py", lines="293"), "absent", None),
    ("no anchor", {}, CodeRef(file=UTILS, lines="9"), "unanchored", None),
])
def test_a_citation_reports_where_it_stands(tmp_path, case, doctor, ref, status, found_lines):
    state = _state(write_tree(tmp_path, doctor), ref)
    assert (state.status, state.found_lines) == (status, found_lines)


def test_a_digest_anchor_tells_moved_from_changed(tmp_path):
    lines = FILES[UTILS].splitlines()[7:13]
    ref = CodeRef(file=UTILS, lines=INIT_PARAMETERS_LINES,
                  anchor=Anchor(lines_sha256=lines_digest(lines)))
    assert _state(write_tree(tmp_path / "a"), ref).status == "holds"
    moved = _state(write_tree(tmp_path / "b", {UTILS: MOVED_DOWN}), ref)
    assert (moved.status, moved.found_lines) == ("moved", "28-33")
    edited = FILES[UTILS].replace("dtype=dtype", "dtype=torch.float16")
    assert _state(write_tree(tmp_path / "c", {UTILS: edited}), ref).status == "changed"


def test_a_wheel_is_read_like_its_tree_and_identified_by_its_digest(tmp_path):
    wheel = tmp_path / "vllm_omni-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in FILES.items():
            archive.writestr(path, text)
    source = open_source(wheel)
    assert source.identity.kind == "wheel"
    assert source.identity.version == "9.9.9"
    assert source.identity.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert _results(wheel) == _results(write_tree(tmp_path / "tree"))


@pytest.mark.parametrize("make", [
    lambda p: p / "missing",
    lambda p: p,  # a folder without vllm_omni/
    lambda p: (p / "x.whl").write_text("not a zip") and p / "x.whl",
])
def test_a_path_that_is_no_upstream_source_is_refused(tmp_path, make):
    with pytest.raises(InputError) as caught:
        open_source(make(tmp_path))
    assert str(tmp_path) in str(caught.value.problems[0])


def _project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    for name in ("hosts.toml", "sim.toml"):
        shutil.copy(REPO / name, root / name)
    for name in ("fixtures", "deploy", "evidence", "models"):  # models: the configs evidence holds
        shutil.copytree(REPO / name, root / name)
    shutil.rmtree(root / "evidence" / "upstream")
    return Project(root)


def test_record_then_check_differs_only_when_a_result_does(tmp_path, monkeypatch, capsys):
    project = _project(tmp_path)
    tree = write_tree(tmp_path / "tree")
    contract = check_source(project, tree)
    # The real evidence's init_parameters OOM frame is looked up in the synthetic tree too.
    cited = {c.cited_in: c for c in contract.citations}
    assert cited["rtx5080/seed-5080-1-init-matrix/code-read.json $[0].ref"].status == "moved"
    assert all(c.status == "absent" for k, c in cited.items() if "qwen_image_21" in c.file)
    folder = record(project, contract, ["test"])
    loaded, problems = load_project(project)
    assert problems == []
    with pytest.raises(InputError):
        record(project, contract, ["test"])  # never replaced
    monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
    assert main(["upstream", "check", "--source", str(tree), "--check"]) == 0
    assert main(["upstream", "check", "--source", str(tree)]) == 1  # a check fails
    # The same source, doctored in place after recording: the result differs, so --check fails.
    write_tree(tree, {API: FILES[API].replace("true_cfg_scale: float | None = Form(None)",
                                              "cfg_scale: float | None = Form(None)")})
    doctored = check_source(project, tree)
    assert differences(contract, doctored) == [
        "edits-form:true_cfg_scale: committed pass at "
        f"{API}:{_line(FILES[API], 'true_cfg_scale: float')}, now fail at "
        f"{API}:{_line(FILES[API], EDITS_DECORATOR)}"]
    # A tree is identified by its files' digest: the doctored one has no committed evidence.
    assert main(["upstream", "check", "--source", str(tree), "--check"]) == 1
    assert folder.is_dir()


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_an_upstream_attempt_holds_only_its_result(tmp_path):
    project = _project(tmp_path)
    folder = record(project, check_source(project, write_tree(tmp_path / "tree")), ["test"])
    (folder / "runs.json").write_text("[]")
    _, problems = load_project(project)
    assert [p.message for p in problems] == [
        "an upstream attempt holds only upstream.json, not runs.json"]


def test_the_report_shows_the_newest_upstream_result(tmp_path):
    from .rendered import render_harness

    project = _project(tmp_path)
    shutil.copytree(REPO / "templates", project.templates_dir)
    assert "Upstream contract" not in render_harness(project)
    doctor = {API: FILES[API].replace("true_cfg_scale: float | None = Form(None)",
                                      "cfg_scale: float | None = Form(None)")}
    contract = check_source(project, write_tree(tmp_path / "tree", doctor))
    record(project, contract, ["test"])
    text = render_harness(project)
    held = sum(c.status == "pass" for c in contract.checks)
    assert f"{held} of {len(contract.checks)} checks hold" in text
    assert "`edits-form:true_cfg_scale`: FAIL" in text
    assert "`edits-form:prompt`" not in text  # checks that hold are counted, not listed
    assert "| rtx5080/seed-5080-1-init-matrix/code-read.json $[0].ref | moved |" in text
