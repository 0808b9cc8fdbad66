"""A small world for environment tests and the no-op benchmark: a project whose hosts.toml pins
tiny PyPI packages plus two local git repositories, a fake Hugging Face cache, and a fake NVML."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from omniprobe.config.project import Project
from omniprobe.evidence.models.environment import EnvManifest

# Imported as tests.env_scaffold by the tests, as env_scaffold by the benchmarks.
if __package__:
    from .upstream_tree import FILES as UPSTREAM_FILES
    from .upstream_tree import write_tree
else:
    from upstream_tree import FILES as UPSTREAM_FILES
    from upstream_tree import write_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPO = "testorg/tiny-model"
SNAPSHOT_FILES = {"config.json": b'{"layers": 2}\n', "weights/part-1.bin": b"\x00\x01weights"}
# A real 2x2 PNG: references are images that decode (issue 24), not bytes that look like one.
REFERENCE = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAFElEQVR4nGPkOiH3n4GBgYGJ"
                             "AQoAHRQB895AuE0AAAAASUVORK5CYII=")
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(*args: str, cwd: Path | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                         env={**os.environ, **_GIT_ENV})
    return out.stdout.strip()


# A `vllm serve MODEL --omni` stand-in for the serve preflight: it parses what the probe passes
# and, like vLLM, lists every option under --help=all; it never serves.
SERVE_CLI = """import argparse
import sys


def main():
    parser = argparse.ArgumentParser(prog="vllm", add_help=False)
    serve = parser.add_subparsers(dest="command", required=True).add_parser("serve", add_help=False)
    serve.add_argument("model")
    serve.add_argument("--help", nargs="?", const="short")
    serve.add_argument("--omni", action="store_true")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--served-model-name")
    args = parser.parse_args()
    if args.help:
        serve.print_help()
        return 0
    sys.exit("this stand-in never serves")
"""


def make_git_package(folder: Path, dist: str, deps: list[str],
                     tree: dict[str, str] | None = None, *, cli: str | None = None) -> list[str]:
    """A flit package in a fresh repository with two commits, beside the files of `tree`;
    returns both full commits. `cli`: the source of its `cli` module, installed as the `vllm`
    console script."""
    module = folder / dist.replace("-", "_")
    module.mkdir(parents=True)
    write_tree(folder, tree or {})
    scripts = f'[project.scripts]\nvllm = "{module.name}.cli:main"\n' if cli else ""
    if cli:
        (module / "cli.py").write_text(cli)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["flit_core>=3.4,<4"]\nbuild-backend = "flit_core.buildapi"\n'
        f'[project]\nname = "{dist}"\nversion = "0.1.0"\ndescription = "test package"\n'
        f"dependencies = {json.dumps(deps)}\n{scripts}")
    git("init", "-q", str(folder))
    commits = []
    for n in (1, 2):
        (module / "__init__.py").write_text(f"GENERATION = {n}\n")
        git("add", "-A", cwd=folder)
        git("commit", "-qm", f"generation {n}", cwd=folder)
        commits.append(git("rev-parse", "HEAD", cwd=folder))
    git("checkout", "-q", "--detach", commits[0], cwd=folder)
    return commits


def make_hf_cache(cache: Path, repo: str, revision: str, files: dict[str, bytes]) -> Path:
    """The hub cache layout: refs/main, blobs named by content, snapshot links to the blobs."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    snapshot = repo_dir / "snapshots" / revision
    for rel, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def revision_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class FakeNvml:
    """Stands in for pynvml: the same calls, a GPU of our choosing."""

    def __init__(self, name: str = "NVIDIA GeForce RTX 3090", memory_mib: int = 24576,
                 capability: tuple[int, int] = (8, 6), error: Exception | None = None):
        self.name, self.memory_mib, self.capability = name, memory_mib, capability
        self.error = error

    def nvmlInit(self) -> None:
        if self.error is not None:
            raise self.error

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.name.encode()  # older pynvml returns bytes; read_gpu takes either

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        return type("Memory", (), {"total": self.memory_mib * 2**20})()

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.capability

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.1.2"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000


RTX5080 = dict(name="NVIDIA GeForce RTX 5080", memory_mib=16303, capability=(12, 0))


@dataclass
class World:
    root: Path
    project: Project
    env_root: Path
    hf_cache: Path
    repo_a: Path
    repo_b: Path
    commits_a: list[str]
    commits_b: list[str]
    revision: str

    @property
    def env_vars(self) -> dict[str, str]:
        return {"OMNIPROBE_ENV_ROOT": str(self.env_root), "HF_HUB_CACHE": str(self.hf_cache),
                "OMNIPROBE_ROOT": str(self.project.root)}

    def write_hosts(self, **changes: str) -> None:
        self.project.hosts_file.write_text(hosts_toml(self, **changes))


def python_pin() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def hosts_toml(world: World, *, python: str | None = None, six: str = "1.16.0",
               idna: str = "3.7", commit_a: str | None = None, manifest: bool = True) -> str:
    a = commit_a or world.commits_a[0][:10]
    b = world.commits_b[0][:9]
    checks = 'snapshot_manifest = "snapshot-manifest.json"\n' if manifest else ""
    return f'''
[stack]
upstream_repo = "{world.repo_b}"
upstream_commit = "{b}"
recipe_version = "0.0.0"
python = "{python or python_pin()}"
torch = "0.0.0"
torch_index = "https://download.pytorch.org/whl/cu130"
transformers = "0.0.0"
diffusers_repo = "{world.repo_a}"
diffusers_commit = "{a}"
model_snapshot = "{MODEL_REPO}@{world.revision[:8]}"
offline_env = {{ HF_HUB_OFFLINE = "1" }}

[serve]
command = ["vllm", "serve", "{{model}}", "--omni"]
port = 8091
enforce_eager = true
served_model_name = "{MODEL_REPO}"

[probe]
target_reference_count = 1

[hosts.testhost]
kind = "omni"
name = "Test host"
hostname = "{socket.gethostname()}"
gpu = "NVIDIA GeForce RTX 3090"
compute_capability = "8.6"
vram_gb = 24
python_provider = "whatever uv finds"
serve_flag_sets = ["default"]

[hosts.simhost]
kind = "sim"
name = "Simulated host"
hostname = "anywhere"
gpu = "NVIDIA GeForce RTX 3090"
compute_capability = "8.6"
vram_gb = 24
python_provider = "whatever uv finds"
simulated = true
serve_flag_sets = ["default"]
serve_command = ["{{python}}", "-m", "omniprobe.sim", "serve", "{{model}}", "--omni",
                 "--hosts-file", "{{hosts_file}}", "--sim-host", "{{host}}"]
args_check = {{ mode = "parse", args = ["--check-args"] }}

[flag_sets.default]
description = "(none)"

[env]
root = "/nonexistent/overridden-by-OMNIPROBE_ENV_ROOT"

[env.checks]
{checks}
[[env.install]]
name = "six"
version = "{six}"

[[env.install]]
name = "idna"
version = "{idna}"

[[env.install]]
name = "gitpkg-a"
git = "{world.repo_a}"
commit = "{a}"

[[env.install]]
name = "gitpkg-b"
git = "{world.repo_b}"
commit = "{b}"
editable = true
'''


def fixtures_json(reference_sha256: str) -> str:
    return json.dumps({
        "source": {"name": "test.txt"}, "section": "test", "reference_suite": "test-suite",
        "prompt_set": "test",
        "generator": "test",
        "sampling": {"seeds": [1], "num_inference_steps": 1, "true_cfg_scale": 1.0,
                     "negative_prompt": False},
        "fixtures": [{"id": "one-ref", "kind": "edit", "reference_count": 1, "source_name": "one",
                      "prompt": "p", "width": 8, "height": 8,
                      "references": [{"name": "ref-a", "file": "refs/ref-a.png",
                                      "sha256": reference_sha256}]}],
    }, indent=2)


# The simulated host's capacity model, in the sim.toml beside the world's hosts.toml.
SIM_TOML = """[capacity.simhost]
vram_mib = 24576
context_mib = 512
init_chunk_mib = 96
dit_mib = { bf16 = 14336 }
encoder_mib = { bf16 = 12288 }
activation_mib = 1024
reference_mib = 2048
spike_mib = 1536
layerwise_mib = 6144
init_s = 0
reference_s = 0
step_s = 0
"""


def make_world(root: Path) -> World:
    project = Project(root / "project")
    (project.root / "fixtures" / "refs").mkdir(parents=True)
    project.evidence_dir.mkdir()
    (project.root / "fixtures" / "refs" / "ref-a.png").write_bytes(REFERENCE)
    project.fixtures_file.write_text(fixtures_json(hashlib.sha256(REFERENCE).hexdigest()))
    repo_a, repo_b = root / "src" / "gitpkg-a", root / "src" / "gitpkg-b"
    world = World(root=root, project=project, env_root=root / "envroot", hf_cache=root / "hf",
                  repo_a=repo_a, repo_b=repo_b,
                  commits_a=make_git_package(repo_a, "gitpkg-a", []),
                  # [stack] upstream_repo: its clone holds the synthetic upstream tree.
                  commits_b=make_git_package(repo_b, "gitpkg-b", ["six"], UPSTREAM_FILES,
                                             cli=SERVE_CLI),
                  revision=revision_of("tiny-model main"))
    make_hf_cache(world.hf_cache, MODEL_REPO, world.revision, SNAPSHOT_FILES)
    (project.root / "snapshot-manifest.json").write_text(json.dumps({
        "model_snapshot": f"{MODEL_REPO}@{world.revision[:8]}",
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in SNAPSHOT_FILES.items()},
    }))
    world.write_hosts()
    project.sim_file.write_text(SIM_TOML)
    return world


def sample_manifest(**changes) -> EnvManifest:
    """A valid environment manifest of testhost with one failed check; `changes` override keys."""
    data = {
        "host": "testhost", "action": "built", "venv": "/v", "pins_hash": "a" * 64,
        "uv_version": "uv 0.13.9",
        "python": {"pinned": "3.13", "version": "3.13.0", "executable": "/v/bin/python"},
        "host_facts": {"hostname": "box", "platform": "Linux", "machine": "x86_64",
                       "gpu": {"index": 0, "device_count": 1, "name": "NVIDIA GeForce RTX 3090",
                               "memory_total_mib": 24576, "compute_capability": "8.6",
                               "driver_version": "999.1.2"}},
        "model_snapshot": "Qwen/Qwen-Image-2.1@790c9263",
        "pins": [{"name": "six", "kind": "index", "pin": "1.16.0", "source": "default index",
                  "installed_version": "1.16.0", "resolved": "1.16.0"}],
        "freeze": ["six==1.16.0"],
        "checks": [{"name": "package.six", "status": "pass", "detail": "ok"},
                   {"name": "gpu.name", "status": "fail", "detail": "NVML's device name",
                    "expected": "a", "actual": "b"},
                   {"name": "torch.cuda", "status": "skip", "detail": "no torch"}],
        "timings": {"total_s": 1.5, "verify_s": 0.5, "build_s": 1.0},
    }
    return EnvManifest.model_validate({**data, **changes})
