"""An index or host the build cannot reach is named as unreachable, with the URL's host and the
command that failed, never as a clash of pins (issue 34, item 6)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from omniprobe.config.stack import InstallStep
from omniprobe.env.resolve import ResolutionConflict, Unreachable, resolve_plan, unreachable
from omniprobe.env.state import Runner, uv_command

COMPILE = ["uv", "pip", "compile", "pyproject.toml"]
REFUSED = """error: Request failed after 3 retries in 6.7s
  cause: Failed to fetch: http://127.0.0.1:9/simple/six/
  cause: error sending request for url (http://127.0.0.1:9/simple/six/)
  cause: client error (Connect)
  cause: tcp connect error
  cause: Connection refused (os error 111)"""
NO_DNS = """error: Request failed after 3 retries in 8.8s
  cause: Failed to fetch: https://download.pytorch.org/whl/cu130/torch/
  cause: error sending request for url (https://download.pytorch.org/whl/cu130/torch/)
  cause: client error (Connect)
  cause: dns error
  cause: error resolving DNS
  cause: failed to lookup address information: Name or service not known"""
OLD_UV = """error: Failed to fetch: `https://pypi.org/simple/six/`
  Caused by: Request failed after 3 retries
  Caused by: error sending request for url (https://pypi.org/simple/six/)
  Caused by: operation timed out"""
GIT = ("Cloning into 'vllm-omni'...\nfatal: unable to access 'https://github.com/vllm-project/"
       "vllm-omni.git/': Could not resolve host: github.com")
CLASH = ("× No solution found when resolving dependencies:\n  ╰─▶ Because alpha==1.0 depends on "
         "beta>=2.0 and you require beta==1.0, we can conclude that your requirements are "
         "unsatisfiable.")
STRATEGY = ("hint: `filelock` was found on https://download.pytorch.org/whl/cu130, but not at the "
            "requested version (filelock>=3.20). A compatible version may be available on a "
            "subsequent index (e.g., https://pypi.org/simple). By default, uv will only consider "
            "versions that are published on the first index that contains a given package")

# uv's or git's output -> the host named and uv's innermost reason (None: reached the index)
CASES = {
    "uv, connection refused": (REFUSED, "127.0.0.1 (http://127.0.0.1:9/simple/six/)",
                               "Connection refused (os error 111)"),
    "uv, no DNS": (NO_DNS, "download.pytorch.org (https://download.pytorch.org/whl/cu130/torch/)",
                   "failed to lookup address information: Name or service not known"),
    "older uv, timed out": (OLD_UV, "pypi.org (https://pypi.org/simple/six/)",
                            "operation timed out"),
    "git clone, no DNS": (GIT, "github.com (https://github.com/vllm-project/vllm-omni.git/)",
                          "Could not resolve host: github.com"),
    "a clash of pins": (CLASH, None, None),
    "uv's index strategy": (STRATEGY, None, None),
}


@pytest.mark.parametrize(("output", "where", "reason"), CASES.values(), ids=CASES.keys())
def test_an_unreachable_index_is_named_with_its_host_and_the_command(output, where, reason):
    found = unreachable(output, COMPILE)
    if where is None:
        assert found is None
        return
    message = str(found)
    assert message.startswith(f"cannot reach {where}: {reason}; ")
    assert "not a clash of pins" in message
    assert "the command that failed: uv pip compile pyproject.toml" in message


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_plan_whose_index_is_down_is_unreachable_not_a_conflict(monkeypatch):
    port = closed_port()
    monkeypatch.setenv("UV_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    for name in ("UV_NO_INDEX", "UV_FIND_LINKS", "UV_OFFLINE", "UV_EXTRA_INDEX_URL", "UV_INDEX"):
        monkeypatch.delenv(name, raising=False)
    plan = [InstallStep(name="six", version="1.17.0")]
    with pytest.raises(Unreachable) as caught:
        resolve_plan(uv_command(), sys.executable, plan, "six==1.17.0\n",
                     lambda s: [f"{s.name}=={s.version}"], Runner(), lambda line: None)
    assert not isinstance(caught.value, ResolutionConflict)
    message = str(caught.value)
    assert message.startswith(f"cannot reach 127.0.0.1 (http://127.0.0.1:{port}/simple/six/): ")
    assert "the command that failed: " in message and " pip compile " in message


def test_a_clone_from_a_host_that_is_down_is_unreachable(tmp_path):
    argv = ["git", "clone", f"http://127.0.0.1:{closed_port()}/vllm-omni.git", str(tmp_path / "c")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert str(unreachable(proc.stderr, argv)).startswith("cannot reach 127.0.0.1 (http://127.0.0.1:")


def test_the_build_names_a_git_host_it_cannot_reach(tmp_path, monkeypatch, capsys):
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.build import build_env
    from omniprobe.env.state import env_paths

    from .env_scaffold import FakeNvml, make_world
    world = make_world(tmp_path / "world")
    url = f"http://127.0.0.1:{closed_port()}/gitpkg-a.git"
    text = world.project.hosts_file.read_text().replace(f'git = "{world.repo_a}"', f'git = "{url}"')
    world.project.hosts_file.write_text(text)
    for key, value in world.env_vars.items():
        monkeypatch.setenv(key, value)
    echoed: list[str] = []
    with pytest.raises(Unreachable, match=r"^cannot reach 127\.0\.0\.1 \(http://127\.0\.0\.1:"):
        build_env("testhost", project=world.project, nvml=FakeNvml(), echo=echoed.append)
    assert "Failed to connect to 127.0.0.1" in capsys.readouterr().err  # git's own words, shown
    assert not env_paths(load_hosts(world.project.hosts_file), world.project, "testhost").venv.exists()


class IndexGoneAtInstall(Runner):
    """The index answers the resolution, then goes away before `uv pip install` of six."""

    def run(self, argv, **kwargs):
        if list(argv[1:3]) == ["pip", "install"] and any(a.startswith("six") for a in argv):
            return subprocess.CompletedProcess(list(argv), 2, "", NO_DNS)
        return super().run(argv, **kwargs)


def test_an_install_step_whose_index_is_gone_is_unreachable(tmp_path, monkeypatch):
    from omniprobe.env.build import build_env

    from .env_scaffold import FakeNvml, make_world
    world = make_world(tmp_path / "world")
    for key, value in world.env_vars.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(Unreachable) as caught:
        build_env("testhost", project=world.project, nvml=FakeNvml(), echo=lambda line: None,
                  runner=IndexGoneAtInstall())
    message = str(caught.value)
    assert message.startswith("cannot reach download.pytorch.org (https://download.pytorch.org/")
    assert " pip install " in message.splitlines()[1]
