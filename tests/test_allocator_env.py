"""Which allocator variable the env's torch honours (issue 23 item 5): read back from a torch in
a fresh interpreter of the env, recorded as the check's `actual`, and the one the harness sets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.env.allocator import (
    ALLOC_VARS,
    allocator_check,
    allocator_env,
    check_allocator_env,
    honoured_var,
    uses_allocator_env,
)
from omniprobe.env.serve_command import server_env
from omniprobe.env.state import EnvPaths, Runner

from .conftest import REPO

GET = "torch._C._accelerator_getAllocatorSettings()"
SNAP = "torch.cuda.memory._snapshot()['allocator_settings']"


def back(settings, api=GET):
    return {"api": api, "settings": settings}


@pytest.mark.parametrize(("readbacks", "status", "actual"), [
    # both names reach the allocator: the newer one is set
    ({"PYTORCH_ALLOC_CONF": back("expandable_segments:True"),
      "PYTORCH_CUDA_ALLOC_CONF": back("expandable_segments:True")}, "pass", "PYTORCH_ALLOC_CONF"),
    # the release that ignored the new name
    ({"PYTORCH_ALLOC_CONF": back(""),
      "PYTORCH_CUDA_ALLOC_CONF": back("expandable_segments:True")},
     "pass", "PYTORCH_CUDA_ALLOC_CONF"),
    # a torch that reads only the new name
    ({"PYTORCH_ALLOC_CONF": back("expandable_segments:True"),
      "PYTORCH_CUDA_ALLOC_CONF": back("")}, "pass", "PYTORCH_ALLOC_CONF"),
    # the snapshot's reading of an older torch
    ({"PYTORCH_ALLOC_CONF": back("expandable_segments:False", SNAP),
      "PYTORCH_CUDA_ALLOC_CONF": back("expandable_segments:True", SNAP)},
     "pass", "PYTORCH_CUDA_ALLOC_CONF"),
    # neither: the -expandable flag sets would measure the plain configuration
    ({"PYTORCH_ALLOC_CONF": back(""), "PYTORCH_CUDA_ALLOC_CONF": back("")}, "fail", "neither"),
    # nothing to read it back with
    ({"PYTORCH_ALLOC_CONF": back(None, None), "PYTORCH_CUDA_ALLOC_CONF": None}, "fail", None),
])
def test_the_variable_torch_reads_back(readbacks, status, actual):
    check = allocator_check(readbacks)
    assert (check.status, check.actual) == (status, actual), check.detail


def test_the_harness_sets_the_honoured_variable_and_drops_ours():
    cfg = load_hosts(REPO / "hosts.toml")
    assert cfg.flag_sets["cpuoff-expandable"].env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    base = {"PATH": "/bin", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    env = server_env(cfg, "cpuoff-expandable", base, alloc_var="PYTORCH_ALLOC_CONF")
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    env = server_env(cfg, "cpuoff-expandable", base, alloc_var="PYTORCH_CUDA_ALLOC_CONF")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in env
    # A flag set that sets none keeps ours.
    assert server_env(cfg, "cpuoff", base, alloc_var="PYTORCH_CUDA_ALLOC_CONF")[
        "PYTORCH_ALLOC_CONF"] == "max_split_size_mb:64"
    assert allocator_env({"A": "1"}, "PYTORCH_ALLOC_CONF") == {"A": "1"}
    assert uses_allocator_env(cfg, "rtx3090") and not uses_allocator_env(cfg, "sim")


# A torch stand-in in a real venv: what `import torch` finds there reads the variables as the
# release that ignored the new name did (only the old one), or as a newer one (both).
FAKE_TORCH = '''
import os, types
NAMES = {names!r}
_C = types.SimpleNamespace(_accelerator_getAllocatorSettings=lambda: next(
    (os.environ[n] for n in NAMES if n in os.environ), ""))
'''


@pytest.mark.parametrize(("names", "actual"), [
    (["PYTORCH_CUDA_ALLOC_CONF"], "PYTORCH_CUDA_ALLOC_CONF"),
    (["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"], "PYTORCH_ALLOC_CONF"),
    ([], "neither"),
])
def test_the_env_check_reads_the_setting_back_from_the_envs_torch(tmp_path, names, actual):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH.format(names=names))
    cfg = load_hosts(REPO / "hosts.toml")
    check = check_allocator_env(cfg, "rtx3090", EnvPaths(venv, tmp_path / "git"), Runner(),
                                torch_pinned=True)
    assert check.actual == actual, check.detail
    assert honoured_var([check]) == (None if actual == "neither" else actual)
    assert ALLOC_VARS == ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def test_a_host_whose_flag_sets_set_no_allocator_variable_skips_it(tmp_path):
    cfg = load_hosts(REPO / "hosts.toml")
    check = check_allocator_env(cfg, "sim", EnvPaths(tmp_path, tmp_path), Runner(), True)
    assert check.status == "skip"
