"""Environment build and checks without the network: config, dry run, Python provisioning,
NVML, the snapshot and reference checks, the stamp and the manifest evidence."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from omniprobe import cli
from omniprobe.analysis.summaries import manifest_summary
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env import checks as envchecks
from omniprobe.env.build import _provide_python
from omniprobe.env.checks import require_env_ok
from omniprobe.env.manifest import record_manifest
from omniprobe.env.nvml_facts import gpu_checks, host_facts, read_gpu
from omniprobe.env.references import references_check
from omniprobe.env.snapshot import snapshot_checks
from omniprobe.env.state import (
    EnvBuildError,
    EnvError,
    Stamp,
    env_paths,
    pins_hash,
    stamp_state,
    uv_command,
    write_stamp,
)
from omniprobe.env.upstream_clone import clone_contract, contract_warnings
from omniprobe.errors import InputError
from omniprobe.evidence.load import load_attempt

from .conftest import hosts_written
from .env_scaffold import (
    MODEL_REPO,
    REPO_ROOT,
    RTX5080,
    SIM_TOML,
    SNAPSHOT_FILES,
    FakeNvml,
    World,
    hosts_toml,
    make_hf_cache,
    revision_of,
    sample_manifest,
)
from .upstream_tree import FILES as UPSTREAM_FILES
from .upstream_tree import write_tree as write_upstream_tree

REAL = Project(REPO_ROOT)
UPSTREAM_API = "vllm_omni/entrypoints/openai/api_server.py"


def _world(tmp_path: Path, *, manifest: bool = True) -> World:
    """A world on paper: files only, no repositories, enough for checks that need no venv."""
    project = Project(tmp_path / "project")
    (project.root / "fixtures" / "refs").mkdir(parents=True)
    project.evidence_dir.mkdir()
    world = World(root=tmp_path, project=project, env_root=tmp_path / "envroot",
                  hf_cache=tmp_path / "hf", repo_a=tmp_path / "a", repo_b=tmp_path / "b",
                  commits_a=["a" * 40], commits_b=["b" * 40], revision=revision_of("main"))
    if manifest:
        (project.root / "snapshot-manifest.json").write_text(json.dumps({
            "model_snapshot": f"{MODEL_REPO}@{world.revision[:8]}",
            "files": {r: hashlib.sha256(d).hexdigest() for r, d in SNAPSHOT_FILES.items()}}))
    project.hosts_file.write_text(hosts_toml(world, manifest=manifest))
    project.sim_file.write_text(SIM_TOML)
    return world


def _by_name(checks) -> dict:
    return {c.name: c for c in checks}


# --- hosts.toml [env] -------------------------------------------------------------------


def test_real_hosts_toml_env_follows_the_recipe_order():
    cfg = load_hosts(REAL.hosts_file)
    assert [s.name for s in cfg.env.install] == ["torch", "transformers", "diffusers", "vllm",
                                                 "vllm-omni"]
    # vLLM at the version the pinned vLLM-Omni's recipe names, with that recipe as its source.
    vllm = cfg.env.install[3]
    assert (vllm.version, vllm.recipe) == ("0.31.0", "recipes/Qwen/Qwen-Image-2.1.md")
    assert cfg.env.checks.snapshot_manifest is None  # the seed states no file digests
    assert [s.name for s in cfg.env.install if s.editable] == ["vllm-omni"]


@pytest.mark.parametrize("edit, where, words", [
    ('version = "2.13.0+cu130"', "[[env.install]] item 0 key 'version'",
     "expected [stack] torch '2.13.0+cu130', got '2.12.0'"),
    ('\ncommit = "122b1e11"', "[[env.install]] item 2 key 'commit'",
     "expected [stack] diffusers_commit '122b1e11', got 'abcdef12'"),
    ('editable = true', "[[env.install]] item 4 key 'colour'", "unknown key"),
    ('name = "transformers"\nversion = "5.14.1"', "[[env.install]] item 1",
     "give either 'version' (from an index) or 'git' with 'commit'"),
    ('vram_tolerance = 0.05', "[env.checks] key 'snapshot_manifest'",
     "file 'absent.json' not found"),
])
def test_env_config_errors_name_file_table_and_key(tmp_path, edit, where, words):
    replacement = {
        'version = "2.13.0+cu130"': 'version = "2.12.0"',
        '\ncommit = "122b1e11"': '\ncommit = "abcdef12"',
        'editable = true': 'editable = true\ncolour = "blue"',
        'name = "transformers"\nversion = "5.14.1"':
            'name = "transformers"\nversion = "5.14.1"\ngit = "x"\ncommit = "1234567"',
        'vram_tolerance = 0.05': 'vram_tolerance = 0.05\nsnapshot_manifest = "absent.json"',
    }[edit]
    text = REAL.hosts_file.read_text()
    assert edit in text
    bad = hosts_written(tmp_path, text.replace(edit, replacement, 1))
    with pytest.raises(InputError) as info:
        load_hosts(bad)
    message = str(info.value)
    assert str(bad) in message and where in message and words in message, message


def test_venv_inside_the_repository_is_refused(tmp_path):
    cfg = load_hosts(REAL.hosts_file)
    with pytest.raises(EnvError, match="inside the repository .* outside git"):
        env_paths(cfg, REAL, "rtx3090", venv=REPO_ROOT / "venv")


def test_unknown_host_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(REPO_ROOT))
    assert cli.main(["env", "build", "--host", "rtx4090", "--dry-run"]) == 3  # a refusal
    assert ("error: --host names host 'rtx4090', which hosts.toml does not define; hosts: "
            "rtx3090") in capsys.readouterr().err


# --- dry run ----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["rtx3090", "rtx5080"])
def test_dry_run_prints_the_pinned_commands_and_runs_nothing(host, tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError(f"dry run ran {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(REPO_ROOT))
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(tmp_path / "envs"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli.main(["env", "build", "--host", host, "--dry-run"]) == 0
    out = capsys.readouterr().out
    commands = [shlex.split(line, comments=True) for line in out.splitlines()
                if line and not line.startswith("#")]
    venv = tmp_path / "envs" / "envs" / host
    python = str(venv / "bin" / "python")
    uv = uv_command()
    installs = [c for c in commands if c[:3] == [uv, "pip", "install"]]
    assert [c[-1] for c in installs] == [
        str(venv / "omniprobe-step-torch" / "pyproject.toml"), "transformers==5.14.1",
        f"diffusers @ git+file://{tmp_path}/envs/git/diffusers-122b1e11"
        "@<full commit of 122b1e11>",
        "vllm==0.31.0",
        f"{tmp_path}/envs/git/vllm-omni-8484d85d1"]
    assert installs[0][3:5] == ["--python", python]
    # Torch's index serves torch only (issue 23 item 2): an explicit index of its step, in the
    # resolution and in torch's install; no step searches it for anything else.
    assert not any("--index-url" in c or "--extra-index-url" in c for c in commands)
    assert installs[0][-2] == "-r"
    torch_index = ('#   [[tool.uv.index]]\n#   name = "torch-index"\n'
                   '#   url = "https://download.pytorch.org/whl/cu130"\n#   explicit = true\n'
                   '#   [tool.uv.sources]\n#   "torch" = { index = "torch-index" }')
    assert out.count(torch_index) == 2  # the plan's pyproject.toml and the torch step's
    assert installs[4][-2] == "--editable"
    # The vLLM step says its version and where it comes from; the recipe check, the resolution
    # (before the venv) and the serve preflight are shown.
    assert ("vllm==0.31.0  # vllm 0.31.0 from the default index; version from "
            "recipes/Qwen/Qwen-Image-2.1.md of https://github.com/vllm-project/vllm-omni.git at "
            "8484d85d1") in out
    assert (f"# check vllm 0.31.0 against {tmp_path}/envs/git/vllm-omni-8484d85d1/"
            "recipes/Qwen/Qwen-Image-2.1.md") in out
    [resolve] = [c for c in commands if c[:3] == [uv, "pip", "compile"]]
    assert commands.index(resolve) < commands.index(
        [uv, "venv", "--clear", "--python", "<python 3.13 found by uv>", str(venv)])
    assert f"#   serve.entry_point: {python} imports the script vllm" in out
    # The preflight serves what the probe will: the snapshot folder; the snapshot check and the
    # command that fetches a missing one are listed with every other check (issue 23 item 3).
    snapshot = f"{tmp_path}/hub/models--Qwen--Qwen-Image-2.1/snapshots/<the commit starting 790c9263>"
    assert (f"#   serve.args: {venv}/bin/vllm serve '{snapshot}' --omni --help=all, which "
            "must list every option of each flag set") in out
    assert (f"#   model.snapshot: Qwen/Qwen-Image-2.1 at the commit starting 790c9263 in the hub "
            f"cache {tmp_path}/hub; where it is missing, fetch it: `omniprobe env fetch-model`") in out
    assert "`hf download Qwen/Qwen-Image-2.1 --revision <the full commit starting 790c9263>`" in out
    assert [uv, "python", "find", "--system", "3.13"] in commands
    assert [uv, "python", "install", "3.13"] in commands
    assert commands.index(["git", "-C", f"{tmp_path}/envs/git/vllm-omni-8484d85d1", "checkout",
                           "--detach", "--quiet", "8484d85d1"]) < commands.index(installs[0])
    assert ["git", "clone", "--no-checkout", "--quiet",
            "https://github.com/huggingface/diffusers.git",
            f"{tmp_path}/envs/git/diffusers-122b1e11"] in commands
    assert [uv, "venv", "--clear", "--python", "<python 3.13 found by uv>", str(venv)] in commands
    assert not venv.exists()
    # The diffusers pin overrides vLLM-Omni's own diffusers requirement, chosen by omniprobe
    # (issue 23 item 1): in the resolution and every install, its file shown.
    assert ("# override: diffusers 122b1e11 replaces every other requirement on diffusers (uv "
            "--override), chosen by omniprobe: vLLM-Omni 0.30.0 requires diffusers==0.40.0") in out
    overrides = str(venv / "omniprobe-overrides.txt")
    assert all(c[c.index("--override") + 1] == overrides for c in installs)
    assert "--override" in resolve
    assert (f"#   diffusers @ git+file://{tmp_path}/envs/git/diffusers-122b1e11@<full commit of "
            "122b1e11>") in out.split(f"# write {overrides}:")[1]


# --- Python provisioning ----------------------------------------------------------------


class ScriptedRunner:
    """Answers commands from a script: argv tuple -> list of (returncode, stdout, stderr)."""

    def __init__(self, script):
        self.script, self.ran = script, []

    def run(self, argv, **kwargs):
        self.ran.append(tuple(argv))
        rc, out, err = self.script[tuple(argv)].pop(0)
        return SimpleNamespace(returncode=rc, stdout=out, stderr=err)


FIND = ("uv", "python", "find", "--system", "3.13")
INSTALL = ("uv", "python", "install", "3.13")


def test_missing_python_is_installed_by_uv():
    find, install = FIND, INSTALL
    runner = ScriptedRunner({find: [(2, "", "no interpreter"), (0, "/uv/py3.13/bin/python\n", "")],
                             install: [(0, "", "")]})
    assert _provide_python("uv", "3.13", runner, lambda line: None) == "/uv/py3.13/bin/python"
    assert runner.ran == [find, install, find]


def test_python_that_uv_cannot_provide_fails_clearly():
    find, install = FIND, INSTALL
    runner = ScriptedRunner({find: [(2, "", "none")],
                             install: [(1, "", "error: failed to download cpython-3.13")]})
    with pytest.raises(EnvBuildError) as info:
        _provide_python("uv", "3.13", runner, lambda line: None)
    assert "Python 3.13 is not on this machine and uv could not install it" in str(info.value)
    assert "uv python install 3.13" in str(info.value)
    assert "failed to download cpython-3.13" in str(info.value)


# --- GPU through NVML -------------------------------------------------------------------


def test_nvml_facts_are_read_through_the_nvml_layer():
    gpu = read_gpu(FakeNvml(**RTX5080))
    assert (gpu.name, gpu.compute_capability, gpu.memory_total_mib) == (
        "NVIDIA GeForce RTX 5080", "12.0", 16303)
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("999.1.2", "13.0")


@pytest.mark.parametrize("host, fake, failed", [
    ("rtx3090", FakeNvml(), set()),
    ("rtx5080", FakeNvml(**RTX5080), set()),  # 16303 MiB is within 5% of 16 GB
    ("rtx3090", FakeNvml(**RTX5080), {"gpu.name", "gpu.compute_capability", "gpu.memory"}),
    ("rtx5080", FakeNvml(name="NVIDIA GeForce RTX 5080", memory_mib=12288, capability=(12, 0)),
     {"gpu.memory"}),
    ("rtx3090", FakeNvml(error=RuntimeError("NVML Shared Library Not Found")), {"gpu.nvml"}),
])
def test_gpu_checks_against_hosts_toml(host, fake, failed):
    cfg = load_hosts(REAL.hosts_file)
    checks = gpu_checks(cfg.host(host), host_facts(fake), cfg.env.checks.vram_tolerance)
    assert {c.name for c in checks if c.status == "fail"} == failed
    if not failed:
        assert _by_name(checks)["gpu.driver"].actual == "999.1.2"


# --- model snapshot ---------------------------------------------------------------------


def _snapshot(world: World, monkeypatch) -> dict:
    monkeypatch.setenv("HF_HUB_CACHE", str(world.hf_cache))
    cfg = load_hosts(world.project.hosts_file)
    return _by_name(snapshot_checks(cfg, world.project))


def test_snapshot_at_the_pinned_revision_with_matching_files(tmp_path, monkeypatch):
    world = _world(tmp_path)
    make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, SNAPSHOT_FILES)
    checks = _snapshot(world, monkeypatch)
    assert checks["model.snapshot"].status == "pass"
    assert checks["model.snapshot"].actual == world.revision
    assert checks["model.snapshot_files"].status == "pass"


def test_snapshot_without_a_manifest_skips_the_file_check(tmp_path, monkeypatch):
    world = _world(tmp_path, manifest=False)
    make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, SNAPSHOT_FILES)
    checks = _snapshot(world, monkeypatch)
    assert checks["model.snapshot"].status == "pass"
    assert checks["model.snapshot_files"].status == "skip"


def test_missing_snapshot(tmp_path, monkeypatch):
    world = _world(tmp_path)
    make_hf_cache(world.hf_cache, "otherorg/other-model", world.revision, SNAPSHOT_FILES)
    checks = _snapshot(world, monkeypatch)
    assert checks["model.snapshot"].status == "fail"
    assert f"missing: {MODEL_REPO} is not in the cache" in checks["model.snapshot"].detail
    assert checks["model.snapshot_files"].status == "fail"


def test_missing_cache_folder(tmp_path, monkeypatch):
    checks = _snapshot(_world(tmp_path), monkeypatch)
    assert checks["model.snapshot"].status == "fail"
    assert "no Hugging Face cache at" in checks["model.snapshot"].detail


def test_snapshot_at_another_revision(tmp_path, monkeypatch):
    world = _world(tmp_path)
    other = revision_of("an older main")
    make_hf_cache(world.hf_cache, MODEL_REPO, other, SNAPSHOT_FILES)
    checks = _snapshot(world, monkeypatch)
    assert checks["model.snapshot"].status == "fail"
    assert f"cached at {other[:12]} (refs: main), not at the pinned {world.revision[:8]}" in (
        checks["model.snapshot"].detail)


def test_tampered_snapshot_file(tmp_path, monkeypatch):
    world = _world(tmp_path)
    snapshot = make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, SNAPSHOT_FILES)
    (snapshot / "weights" / "part-1.bin").resolve().write_bytes(b"\x00\x01weightz")
    checks = _snapshot(world, monkeypatch)
    assert checks["model.snapshot"].status == "pass"
    files = checks["model.snapshot_files"]
    assert files.status == "fail"
    assert files.detail.startswith("weights/part-1.bin: sha256")
    assert "config.json" not in files.detail


def test_snapshot_file_missing_or_unlisted(tmp_path, monkeypatch):
    world = _world(tmp_path)
    files = {"config.json": SNAPSHOT_FILES["config.json"], "extra.txt": b"not in the manifest"}
    make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, files)
    detail = _snapshot(world, monkeypatch)["model.snapshot_files"].detail
    assert "weights/part-1.bin: missing" in detail
    assert "extra.txt: not in the manifest" in detail


# --- reference suite --------------------------------------------------------------------


def test_a_real_host_checks_the_stand_ins_references_only():
    check = references_check(REAL)
    assert check.status == "pass", check.detail
    assert check.detail == "4 files match the fixtures' sha256"  # the stand-ins' a-d


def test_a_simulated_host_checks_the_simulated_references_too():
    check = references_check(REAL, simulated=True)
    assert check.status == "pass", check.detail
    assert check.detail == "8 files match the fixtures' sha256"


def test_with_no_bound_references_the_check_skips(tmp_path):
    suite = json.loads(REAL.fixtures_file.read_text())
    suite["fixtures"] = [f for f in suite["fixtures"] if "references" not in f]
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "fixtures.json").write_text(json.dumps(suite))
    check = references_check(Project(tmp_path))
    assert check.status == "skip" and "references-suite-2" in check.detail


def test_reference_digests(tmp_path):
    from .env_scaffold import REFERENCE, fixtures_json

    project = _world(tmp_path).project
    project.fixtures_file.write_text(fixtures_json(hashlib.sha256(REFERENCE).hexdigest()))
    ref = project.root / "fixtures" / "refs" / "ref-a.png"
    assert references_check(project).status == "fail"  # not there yet
    ref.write_bytes(REFERENCE)
    assert references_check(project).status == "pass"
    ref.write_bytes(REFERENCE + b"!")
    check = references_check(project)
    assert check.status == "fail"
    assert "refs/ref-a.png: sha256 differs" in check.detail


# --- stamp ------------------------------------------------------------------------------


def test_stamp_states(tmp_path, monkeypatch):
    world = _world(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(world.env_root))
    cfg = load_hosts(world.project.hosts_file)
    paths = env_paths(cfg, world.project, "testhost")
    want = pins_hash(cfg, world.project)
    assert stamp_state(paths, want) == (False, f"no build stamp at {paths.stamp}: the env was "
                                               "never completely built")
    stamp = Stamp(state="incomplete", host="testhost", pins_hash=want, python="py",
                  started_at="2026-11-30T10:00:00Z")
    write_stamp(paths, stamp)
    assert stamp_state(paths, want)[1].startswith("incomplete: the build started 2026-11-30")
    write_stamp(paths, stamp.model_copy(update={"state": "complete"}))
    assert stamp_state(paths, want)[1].startswith("the venv interpreter")
    paths.python.parent.mkdir(parents=True)
    paths.python.write_text("")
    assert stamp_state(paths, want)[0]
    assert stamp_state(paths, "0" * 64)[1].startswith("stale: built for pins")
    paths.stamp.write_text("{")
    assert stamp_state(paths, want)[1].startswith("unreadable build stamp")


def test_pins_hash_follows_the_pins(tmp_path):
    world = _world(tmp_path)
    before = pins_hash(load_hosts(world.project.hosts_file), world.project)
    world.project.hosts_file.write_text(hosts_toml(world, idna="3.6"))
    assert pins_hash(load_hosts(world.project.hosts_file), world.project) != before


# --- manifest evidence ------------------------------------------------------------------




def test_manifest_summary():
    summary = manifest_summary(sample_manifest())
    assert summary["ok"] is False
    assert summary["failed"] == ["gpu.name: NVML's device name"]
    assert summary["checks"] == {"pass": 1, "fail": 1, "skip": 1}
    assert summary["gpu"] == "NVIDIA GeForce RTX 3090"
    assert summary["packages"] == [{"name": "six", "pin": "1.16.0", "resolved": "1.16.0"}]


def test_manifest_rejects_unknown_keys_and_bad_status():
    with pytest.raises(ValueError, match="checks.0.status"):
        sample_manifest(checks=[{"name": "gpu.name", "status": "passed", "detail": "x"}])
    with pytest.raises(ValueError, match="colour"):
        sample_manifest(colour="blue")


def test_manifest_is_filed_once_per_state(tmp_path):
    world = _world(tmp_path)
    cfg = load_hosts(world.project.hosts_file)
    started = "2026-11-30T10:00:00Z"
    from datetime import datetime

    at = datetime.fromisoformat(started)
    folder, written = record_manifest(world.project, cfg, sample_manifest(), command=["x"],
                                      started_at=at)
    assert written and folder.name == "2026-11-30T100000Z-testhost-env"
    attempt, problems = load_attempt(folder)
    assert problems == []
    assert attempt.environment.host == "testhost"
    assert attempt.meta.provenance.kind == "measured"
    # Same state again (only timings differ): nothing new is filed.
    again = sample_manifest(timings={"total_s": 9.0, "verify_s": 9.0}, action="verified")
    assert record_manifest(world.project, cfg, again, command=["x"], started_at=at) == (
        folder, False)
    # A changed state in the same second gets its own attempt beside the first.
    changed = sample_manifest(freeze=["six==1.16.0", "idna==3.7"])
    folder2, written2 = record_manifest(world.project, cfg, changed, command=["x"], started_at=at)
    assert written2 and folder2.name == "2026-11-30T100000Z.002-testhost-env"
    sim, _ = record_manifest(world.project, cfg, sample_manifest(host="simhost"), command=["x"],
                             started_at=at)
    assert load_attempt(sim)[0].meta.provenance.kind == "simulated"


# --- the upstream contract of the env's own clone ------------------------------------------

EDITS_ROUTE_RENAMED = {UPSTREAM_API: UPSTREAM_FILES[UPSTREAM_API].replace(
    '"/v1/images/edits"', '"/v1/images/edit"')}


def _clone_world(tmp_path, monkeypatch, doctor=None):
    """The paper world with its upstream (gitpkg-b, [stack] upstream_repo) cloned as the
    synthetic upstream tree, doctored as asked; None: not cloned."""
    world = _world(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(world.env_root))
    cfg = load_hosts(world.project.hosts_file)
    paths = env_paths(cfg, world.project, "testhost")
    if doctor is not None:
        [step] = [s for s in cfg.env.install if s.name == "gitpkg-b"]
        write_upstream_tree(paths.clone_dir(step), doctor)
    return world, cfg, paths


def test_the_env_holds_its_own_clone_against_the_contract(tmp_path, monkeypatch):
    world, cfg, paths = _clone_world(tmp_path / "as-is", monkeypatch, {})
    contract, note = clone_contract(cfg, world.project, paths)
    assert note is None and contract.source.kind == "tree" and contract.citations == []
    status = {c.name: c.status for c in contract.checks}
    assert status["route:/v1/images/edits"] == "pass"
    world, cfg, paths = _clone_world(tmp_path / "renamed", monkeypatch, EDITS_ROUTE_RENAMED)
    doctored, _ = clone_contract(cfg, world.project, paths)
    changed = {c.name: c.status for c in doctored.checks if status[c.name] != c.status}
    assert changed["route:/v1/images/edits"] == "fail"
    warnings = contract_warnings(SimpleNamespace(upstream=doctored, upstream_note=None))
    failed = [c for c in doctored.checks if c.status == "fail"]
    # One warning per failed check, each naming it and where upstream decides it.
    assert len(warnings) == len(failed) and all(
        f"check {c.name} FAILS at {c.where or '(no location)'}: {c.detail}" in w
        for c, w in zip(failed, warnings, strict=True))
    assert any("route:/v1/images/edits" in w for w in warnings)


def test_an_env_without_its_clone_says_the_contract_was_not_checked(tmp_path, monkeypatch):
    world, cfg, paths = _clone_world(tmp_path, monkeypatch)
    contract, note = clone_contract(cfg, world.project, paths)
    assert contract is None and note.startswith("no clone of gitpkg-b at ")
    [warning] = contract_warnings(SimpleNamespace(upstream=None, upstream_note=note))
    assert warning == f"upstream contract not checked: {note}"


def test_the_manifest_records_the_clones_contract(tmp_path, monkeypatch):
    world, cfg, paths = _clone_world(tmp_path, monkeypatch, EDITS_ROUTE_RENAMED)
    contract, _ = clone_contract(cfg, world.project, paths)
    from datetime import datetime

    folder, _ = record_manifest(world.project, cfg, sample_manifest(upstream=contract),
                                command=["x"], started_at=datetime(2026, 11, 30, 10))
    attempt, problems = load_attempt(folder)
    assert problems == []
    assert attempt.environment.upstream.checks == contract.checks
    # A manifest written before the field still loads: no contract recorded.
    assert sample_manifest().upstream is None


def test_a_probe_session_warns_of_each_failed_contract_check_before_it_runs(
        tmp_path, monkeypatch):
    world, cfg, paths = _clone_world(tmp_path, monkeypatch, EDITS_ROUTE_RENAMED)
    contract, _ = clone_contract(cfg, world.project, paths)
    verified = SimpleNamespace(ok=True, paths=paths,
                               manifest=SimpleNamespace(upstream=contract, upstream_note=None))
    monkeypatch.setattr(envchecks, "verify_env", lambda *args, **kwargs: verified)
    out = io.StringIO()
    assert require_env_ok("testhost", project=world.project, out=out) is verified
    lines = out.getvalue().splitlines()
    assert lines == [f"warning: {w}" for w in contract_warnings(verified.manifest)]
    assert any("route:/v1/images/edits FAILS" in line for line in lines)


# --- the model snapshot's fetch and the dry run's checks (issue 23 item 3) ---------------


def test_a_missing_snapshot_says_the_command_that_fetches_it(tmp_path, monkeypatch):
    world = _world(tmp_path)
    checks = _snapshot(world, monkeypatch)
    detail = checks["model.snapshot"].detail
    assert checks["model.snapshot"].status == "fail"
    assert (f"fetch it: `omniprobe env fetch-model` (takes the commit of {MODEL_REPO} starting "
            f"{world.revision[:8]} from its commit list, then downloads it into "
            f"{world.hf_cache})") in detail
    assert f"`hf download {MODEL_REPO} --revision <the full commit starting" in detail


@pytest.mark.parametrize(("commits", "revision", "found"), [
    (["790c9263" + "a" * 32, "1" * 40], None, "790c9263" + "a" * 32),
    (["1" * 40], None, "no commit of Qwen/Qwen-Image-2.1's main branch starts with 790c9263"),
    (["790c9263" + "a" * 32, "790c9263" + "b" * 32], None, "2 commits of Qwen/Qwen-Image-2.1 start"),
    ([], "790c9263" + "c" * 32, "790c9263" + "c" * 32),   # given: no listing
])
def test_fetch_model_finds_the_full_revision_by_its_prefix(tmp_path, monkeypatch, commits,
                                                          revision, found):
    from omniprobe.env.fetch_model import FetchFailed, fetch_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_hosts(REAL.hosts_file)
    asked = []

    def download(repo, rev, cache):
        asked.append((repo, rev, cache))
        return str(cache / "snapshot")

    def listed(repo):
        assert revision is None, "a full revision given is not looked up"
        return commits

    if len(found) == 40:
        folder = fetch_model(cfg, revision=revision, list_commits=listed, download=download,
                             echo=lambda line: None)
        assert asked == [("Qwen/Qwen-Image-2.1", found, tmp_path / "hub")]
        assert folder == tmp_path / "hub" / "snapshot"
    else:
        with pytest.raises(FetchFailed, match=found) as caught:
            fetch_model(cfg, list_commits=listed, download=download, echo=lambda line: None)
        assert "omniprobe env fetch-model --revision <40 hex digits>" in str(caught.value)
        assert asked == []


def test_fetch_model_refuses_a_revision_of_another_prefix_and_names_hub_failures(monkeypatch):
    from omniprobe.env.fetch_model import FetchFailed, fetch_model

    cfg = load_hosts(REAL.hosts_file)
    with pytest.raises(InputError, match="does not start with the pinned 790c9263"):
        fetch_model(cfg, revision="f" * 40)

    def offline(repo):
        raise OSError("network is unreachable")
    with pytest.raises(FetchFailed, match="the Hub did not give Qwen/Qwen-Image-2.1 at 790c9263: "
                                          "OSError: network is unreachable"):
        fetch_model(cfg, list_commits=offline, echo=lambda line: None)


def test_the_dry_run_lists_every_check_the_build_runs(tmp_path, monkeypatch):
    """Each check verify_env makes is on a line of the dry run's plan, in the same order, and the
    serve preflight's --help=all line names the snapshot folder the probe serves."""
    from omniprobe.env.checks import planned_checks, verify_env
    from omniprobe.env.state import Runner

    world = _world(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(world.hf_cache))
    monkeypatch.setenv("OMNIPROBE_ENV_ROOT", str(world.env_root))
    cfg = load_hosts(world.project.hosts_file)
    paths = env_paths(cfg, world.project, "testhost")
    made = [c.name.split(":")[0] for c in verify_env(cfg, world.project, "testhost", paths,
                                                     runner=Runner(), nvml=FakeNvml()).checks]
    planned = [name for line in planned_checks(cfg, world.project, "testhost", paths)
               for name in line.split(": ")[0].split(", ")]
    assert [n for n in planned if n in made] == list(dict.fromkeys(made))
    make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, SNAPSHOT_FILES)
    [args] = [line for line in planned_checks(cfg, world.project, "testhost", paths)
              if line.startswith("serve.args:")]
    snapshot = world.hf_cache / f"models--{MODEL_REPO.replace('/', '--')}" / "snapshots" / world.revision
    assert f"serve {snapshot} --omni --help=all" in args
