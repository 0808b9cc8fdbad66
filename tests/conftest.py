"""Shared helpers: a throw-away project with the sim host, free ports, and process checks."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

from omniprobe import project_files
from omniprobe.cli import build_parser, run_command
from omniprobe.cli.options import options_from
from omniprobe.config.hosts import load_hosts
from omniprobe.config.project import Project
from omniprobe.env.simulated import sim_env_digest
from omniprobe.evidence.attempts import AttemptStore, open_probe_attempt
from omniprobe.evidence.models.attempt import AttemptEnvironment, ServedModel
from omniprobe.harness.common.process import free_port

REPO = Path(__file__).resolve().parent.parent
# A memory filesystem for the tests' scratch where the machine has one: the suite copies the
# project some thousand times, and a disk that discards each deleted block pays for every file
# (on this project's 2-core machine, half the suite's kernel time). TMPDIR, when set, wins.
MEMORY_TMP = Path("/dev/shm")


def pytest_configure(config) -> None:
    if (config.option.basetemp is None and "TMPDIR" not in os.environ
            and MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK | os.X_OK)):
        os.environ["TMPDIR"] = str(MEMORY_TMP)  # the servers and runners the tests start too
        tempfile.tempdir = None  # read TMPDIR anew


def hosts_copy(root: Path) -> Path:
    """The committed hosts.toml, with the sim.toml and the model folders it names (models/)
    beside it, copied into a tmp project at `root`: the one place tests copy them, so a change of
    their format is one edit here."""
    target = root / project_files.HOSTS_FILE
    shutil.copy(REPO / project_files.HOSTS_FILE, target)
    shutil.copy(REPO / project_files.SIM_FILE, root / project_files.SIM_FILE)
    shutil.copytree(REPO / "models", root / "models")  # validate reads each host's folder
    return target


def hosts_written(root: Path, text: str) -> Path:
    """`text` (an edited copy of the committed hosts.toml) as root's hosts.toml, with the
    committed sim.toml beside it."""
    target = root / project_files.HOSTS_FILE
    target.write_text(text)
    shutil.copy(REPO / project_files.SIM_FILE, root / project_files.SIM_FILE)
    return target


SRC = REPO / "src"


def open_sim_attempt(project: Project, command: list[str], *, fresh: bool,
                     host_name: str = "sim") -> AttemptStore:
    """A probe attempt of a simulated host as the probe opens one (open_probe_attempt), in the
    sim's environment: a new one, or with `fresh=False` the newest to resume."""
    environment = AttemptEnvironment(digest=sim_env_digest(), served=ServedModel(
        model="Qwen/Qwen-Image-2.1", source="simulated"))
    store, _ = open_probe_attempt(project, host_name, load_hosts(project.hosts_file).host(host_name),
                                  command, environment=environment, fresh=fresh, fresh_id=None,
                                  complete=lambda _: False)
    return store


def make_project(root: Path, *, faults: list[str] = (), seeds: list[int] = (2301,),
                 size: tuple[int, int] = (64, 48)) -> Project:
    """A copy of hosts.toml and fixtures/ with small images and the given sim faults: every
    fixture that states a size (simulated, stand-in, or the original a stand-in copies it from)
    asks for `size`, so a request costs the harness milliseconds, not a 1248x832 decode."""
    hosts_copy(root)
    shutil.copytree(REPO / "fixtures", root / "fixtures")
    shutil.copytree(REPO / "deploy", root / "deploy")  # the sim host's deploy config
    suite = json.loads((root / "fixtures" / "fixtures.json").read_text())
    suite["sampling"]["seeds"] = list(seeds)
    for fixture in suite["fixtures"]:
        if fixture.get("width") is not None:
            fixture["width"], fixture["height"] = size
    (root / "fixtures" / "fixtures.json").write_text(json.dumps(suite, indent=2))
    if faults:
        hosts = (root / "hosts.toml").read_text()
        extra = "".join(f', "--fault", "{f}"' for f in faults)
        hosts = hosts.replace('"--sim-host", "{host}"]', f'"--sim-host", "{{host}}"{extra}]')
        (root / "hosts.toml").write_text(hosts)
    return Project(root)


def in_process(project: Project, argv: list[str], **doubles) -> tuple[int, str]:
    """An evidence-making command run in process as `omniprobe ARGV` runs it: its options from
    the CLI's parser, its command line recorded, its errors through the CLI's one handler; with
    test doubles (readers, nvml). Returns (exit code, output)."""
    from omniprobe.harness.offline.capacity_session import run_capacity
    from omniprobe.harness.offline.session import run_offline
    from omniprobe.harness.serve.propagation import run_propagation
    from omniprobe.harness.serve.session import run_probe

    args = build_parser().parse_args(argv)
    out, command, name = io.StringIO(), ["omniprobe", *argv], argv[0]
    if name == "probe-offline":
        call = partial(run_offline, project, options_from(args))
    elif name == "probe-capacity":
        call = partial(run_capacity, project, options_from(args))
    elif name == "propagation":
        call = partial(run_propagation, project, options_from(args))
    else:
        call = partial(run_probe, project, name, options_from(args))
    code = run_command(lambda: call(command=command, out=out, **doubles), out)
    return code, out.getvalue()


def fixtures_problems(project: Project, mutate) -> list[str]:
    """The problems loading the project's fixtures.json names once `mutate` has edited its data
    (the load must refuse it)."""
    from omniprobe.config.fixtures import load_fixtures
    from omniprobe.errors import InputError

    data = json.loads(project.fixtures_file.read_text())
    mutate(data)
    project.fixtures_file.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_fixtures(project.fixtures_file)
    return [str(p) for p in info.value.problems]


def probe_argv(session: str, port: int, *extra: str) -> list[str]:
    return [session, "--host", "sim", "--port", str(port), "--grace", "2", *extra]


def processes_with(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line mentions marker (zombies have none and hold nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(entry.name), cmdline.strip()))
    return found


def wait_for(predicate, timeout_s: float, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    return predicate()


def _sigint_default() -> None:
    """Run in the child before exec: a process started with SIGINT ignored (pytest in the
    background, under nohup) passes that on, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Children:
    """Processes a test starts, each the leader of its own group, with SIGINT as a terminal
    gives it; at teardown every group is killed, and so is anything left that names `marker`
    (a server or runner whose supervisor outlived its harness), whether the test passed or not."""

    def __init__(self, marker: str):
        self.marker = marker
        self.started: list[subprocess.Popen] = []

    def start(self, command: list[str], **popen) -> subprocess.Popen:
        proc = subprocess.Popen(command, start_new_session=True, preexec_fn=_sigint_default,
                                **popen)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        own_group = os.getpgid(0)
        for pid, _ in processes_with(self.marker):
            with contextlib.suppress(ProcessLookupError):
                group = os.getpgid(pid)
                if group == own_group:
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(group, signal.SIGKILL)


@pytest.fixture
def children(tmp_path):
    started = Children(str(tmp_path))
    yield started
    started.kill_all()


@pytest.fixture
def harness(children):
    """Start the probe CLI as its own process, as nox would run it."""

    def start(project: Project, session: str, port: int, *extra: str,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        return children.start(
            [sys.executable, "-m", "omniprobe", session, "--host", "sim", "--port", str(port),
             "--grace", "2", *extra],
            cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(SRC), "OMNIPROBE_ROOT": str(project.root),
                 "OMNIPROBE_SIM_TIME_SCALE": "0", **(env or {})})

    return start


@pytest.fixture(autouse=True)
def _instant_sim(monkeypatch):
    """Simulated model times are zero unless a test asks otherwise; the sim sees our PYTHONPATH."""
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.delenv("OMNIPROBE_INVOCATION", raising=False)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    proj = make_project(tmp_path)
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    monkeypatch.delenv("OMNIPROBE_ARTIFACTS", raising=False)
    return proj


PROJECT_PARTS = ("hosts.toml", "sim.toml", "fixtures", "evidence", "templates", "schemas",
                 "deploy", "models", "REPORT.md", "report")


@pytest.fixture
def repo() -> Project:
    """The committed project itself: read it, never write to it."""
    return Project(REPO)


# A reference must be a file of its own (one link): fixtures/ is always copied.
_COPIED_PARTS = frozenset({"fixtures"})


class _Pristine:
    """This process's own copy of the committed project, which each test's copy hard-links
    instead of copying (a few ms a copy, not 20; the suite makes some 450).

    A test that edits a linked file in place (a write, a chmod) edits this copy too: each use
    first compares every file's inode, mode, size and time with what they were when it was
    made, and puts a fresh copy from the repo in place of each that differs. Folders are never
    linked, so a file a test adds, removes or renames is its copy's alone. Where a link cannot
    be made (another filesystem), the file is copied."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.made: dict[Path, tuple[int, ...]] = {}

    @staticmethod
    def _state(path: Path) -> tuple[int, ...] | None:
        try:
            st = path.lstat()
        except OSError:
            return None
        return st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_uid, st.st_gid

    def tree(self) -> Path:
        """The copy, as the repo has it."""
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="omniprobe-pristine-"))
            atexit.register(shutil.rmtree, self.root, ignore_errors=True)
            _copy_parts(REPO, self.root, lambda part: shutil.copy2)
            self.made = {path: self._state(path) for part in PROJECT_PARTS
                         if part not in _COPIED_PARTS
                         for path in [self.root / part, *(self.root / part).rglob("*")]
                         if path.is_file()}
        for path, state in self.made.items():
            if self._state(path) != state:
                fresh = path.with_name(f".{path.name}.pristine")
                shutil.copy2(REPO / path.relative_to(self.root), fresh)
                os.replace(fresh, path)
                self.made[path] = self._state(path)
        return self.root


def _copy_parts(source: Path, target: Path, place_of) -> None:
    """Each of PROJECT_PARTS from `source` into `target`, every file placed by `place_of(part)`
    (a copy or a link)."""
    for part in PROJECT_PARTS:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, target / part, copy_function=place_of(part))
        elif src.exists():
            place_of(part)(src, target / part)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


_PRISTINE = _Pristine()


def copy_repo(root: Path) -> Project:
    """A private copy at `root` of the committed project with its evidence and report."""
    _copy_parts(_PRISTINE.tree(), root,
                lambda part: shutil.copy2 if part in _COPIED_PARTS else _link_or_copy)
    return Project(root)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Project:
    """A private copy of the committed project with its evidence and report, safe to break."""
    return copy_repo(tmp_path)


def agreeing(outcome: str, structure: str, **given) -> dict:
    """Record fields that agree with themselves (evidence/models/requests.py RECORD_INVARIANTS) for a test
    that cares only about outcome and structure: an ok record names an image, a checked one holds
    the image check of its verdict, an OOM its signature. What `given` holds wins."""
    fields: dict = {}
    if outcome == "ok":
        fields.update(artifact="sim/a/images/x.png", output_sha256="0" * 64)
    if structure != "unchecked":
        fields["image"] = {"mode": "RGBA", "width": 16, "height": 16,
                           "opaque_fraction": 1.0 if structure == "sound" else 0.0,
                           "alpha_mean": 255.0, "rgb_mean": 120.0, "rgb_std": 30.0,
                           "flatness": 0.1, "verdict": structure,
                           "reasons": [] if structure == "sound" else ["transparent"]}
    if outcome == "oom":
        fields["oom"] = {"phase": "request"}
    return {**fields, **given}
