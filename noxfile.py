"""omniprobe's sessions: `nox -l` lists them. Each calls one command of the package.

Options after `--` reach the sessions whose command takes them (README: Options after `--`);
one no session of the run takes is an error. E.g. `nox -s env-sim probe-init probe-serve report
-- --fresh`: a new probe attempt, then the report."""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["validate", "tests", "lint"]
nox.options.reuse_venv = "yes"


# One id per nox run, in every session's environment: an env-<host> session records its host under
# it, and the probe sessions of the same run read it back (each session is its own process).
INVOCATION = {"OMNIPROBE_INVOCATION": f"{os.getpid()}-{time.time_ns()}"}
# Ctrl-C: nox waits this long for a probe to stop its server (SIGTERM, grace) before escalating.
PROBE_STOP_S = 30


def _toml() -> dict:
    with open(Path(__file__).parent / "hosts.toml", "rb") as handle:
        return tomllib.load(handle)


def _hosts() -> dict[str, bool]:
    """hosts.toml's hosts: name -> simulated."""
    hosts = _toml().get("hosts", {})
    return {name: bool(host.get("simulated")) for name, host in hosts.items()}


def _run_sessions(session: nox.Session) -> list[str]:
    """The sessions of this nox run, in the noxfile's order: those -s, -k, -t or NOXSESSION chose, and
    any notified. nox has no public accessor for them; its manifest (a private attribute of the
    session) answers `name in manifest` and `list_all_sessions()` publicly."""
    manifest = session._runner.manifest
    return [runner.name for runner, _ in manifest.list_all_sessions() if runner.name in manifest]


def _args(session: nox.Session) -> list[str]:
    """This session's share of the arguments after `--` (omniprobe/cli/nox_args.py routes each
    option to the sessions of the run whose command takes it; one none takes is an error)."""
    if not session.posargs:
        return []
    routed = session.run("omniprobe", "nox-args", "--run", ",".join(_run_sessions(session)),
                         session.name, "--", *session.posargs, silent=True, stderr=None)
    return json.loads(routed)


def _install(session: nox.Session, *extras: str, env: dict[str, str] | None = None) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec, env=env)


@nox.session
def validate(session: nox.Session) -> None:
    """Validate hosts.toml, fixtures/, every evidence file and the committed schemas."""
    _install(session)
    session.run("omniprobe", "validate", *_args(session))


@nox.session
def report(session: nox.Session) -> None:
    """Render REPORT.md from the evidence (`-- --check` fails if the committed one is stale)."""
    _install(session)
    session.run("omniprobe", "report", *_args(session))


@nox.session
def schema(session: nox.Session) -> None:
    """Regenerate the JSON Schema files in schemas/ from the pydantic models (-- --check)."""
    _install(session)
    session.run("omniprobe", "schema", *_args(session))


@nox.session
def standins(session: nox.Session) -> None:
    """Draw the stand-in reference images under fixtures/ (`-- --check`: only compare)."""
    _install(session)
    session.run("omniprobe", "standins", *_args(session))


@nox.session
def quality(session: nox.Session) -> None:
    """PSNR against a baseline's images and determinism groups (`-- --baseline DIR`)."""
    _install(session)
    session.run("omniprobe", "quality", *_args(session))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest, a worker per core and one more; it takes every option after --)."""
    # The suite starts some 600 Python processes (servers, parses, supervisors, harnesses): with
    # bytecode cached as modules are first imported, none of them compiles numpy, pydantic or
    # omniprobe anew (a set PYTHONDONTWRITEBYTECODE would make each one do it; compiling every
    # installed module at install, UV_COMPILE_BYTECODE, costs more than the suite's share).
    _install(session, "test")
    # One worker more than cores: a test spends part of its time waiting on its servers.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = str((cores or 1) + 1)
    session.run("pytest", "-n", workers, "--dist", "loadgroup", *session.posargs,
                env={"PYTHONDONTWRITEBYTECODE": ""})


@nox.session(name="tests-diffusers")
def tests_diffusers(session: nox.Session) -> None:
    """Run the Diffusers engine's tests on the CPU: a tiny Qwen-Image-2.1 through the offline path,
    and its streamed build (installs torch, transformers, diffusers and torchao, pinned to the GPU
    machine's)."""
    _install(session, "test", "diffusers")
    session.run("pytest", "-n", "2", "tests/test_diffusers.py", "tests/test_diffusers_build.py",
                *session.posargs,
                env={"PYTHONDONTWRITEBYTECODE": ""})


@nox.session
def lint(session: nox.Session) -> None:
    """Lint the package, tests and noxfile with ruff, pinned once: pyproject.toml's `lint` extra."""
    session.install(*nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["lint"])
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")


def _env_session(host: str, simulated: bool):
    def env(session: nox.Session) -> None:
        _install(session)
        session.run("omniprobe", "env", "build", "--host", host, "--select", *_args(session),
                    env=INVOCATION)

    built = ("Check the simulated host's env (omniprobe itself: nothing is installed)" if simulated
             else f"Build {host}'s pinned env from hosts.toml (a re-run only verifies it)")
    env.__doc__ = (f"{built}, then select {host} for the probe sessions that follow "
                   "(-- --dry-run: print the commands, select nothing).")
    return env


for _host, _simulated in _hosts().items():
    nox.session(name=f"env-{_host}")(_env_session(_host, _simulated))


@nox.session(name="probe-init")
def probe_init(session: nox.Session) -> None:
    """Start the server under each flag set; record how init ends (-- --fresh --flag-set F)."""
    _install(session)
    session.run("omniprobe", "probe-init", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-serve")
def probe_serve(session: nox.Session) -> None:
    """Serve each seed fixture (or its stand-in) x seed per flag set (-- --fresh --fixture X)."""
    _install(session)
    session.run("omniprobe", "probe-serve", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-offline")
def probe_offline(session: nox.Session) -> None:
    """Generate the fixtures with an offline Omni(...) engine per kwarg set (-- --kwarg-set K)."""
    _install(session)
    session.run("omniprobe", "probe-offline", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-baseline")
def probe_baseline(session: nox.Session) -> None:
    """Re-seal the seed's Diffusers baseline on a Diffusers host, in its own baseline env (built,
    or only verified, first: hosts.toml [baseline_env]); its images land where quality reads them."""
    _install(session)
    session.run("omniprobe", "probe-baseline", "--build-env", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session
def propagation(session: nox.Session) -> None:
    """Serve one fixture with and without a deploy config: did its knob reach the model? (-- --with F)"""
    _install(session)
    session.run("omniprobe", "propagation", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session
def upstream(session: nox.Session) -> None:
    """Check the harness against the registry's vLLM-Omni pinned in hosts.toml [upstream]: its
    wheel (downloaded once, read with ast, never imported) must pass every named check, each shown
    with its upstream file:line. `-- --check` fails only when a result differs from the committed
    evidence; `-- --source PATH` checks another wheel, source tree or clone instead."""
    _install(session)
    args = _args(session)
    if "--source" not in args:
        pin = _toml()["upstream"]
        folder = Path(session.create_tmp()) / "upstream-wheel"
        pattern = f"{pin['package'].replace('-', '_')}-{pin['version']}-*.whl"
        if not list(folder.glob(pattern)):
            session.install("pip")
            session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", f"{pin['package']}=={pin['version']}",
                        "--dest", str(folder))
        args += ["--source", str(sorted(folder.glob(pattern))[0])]
    vllm = _toml()["upstream"].get("vllm")
    if vllm and "--vllm-source" not in args:
        # vLLM's wheel (some 300 MB), downloaded once; a --check without it (CI) takes vLLM's
        # own serve flags from the committed attempt's reading of them.
        folder = Path(session.create_tmp()) / "vllm-wheel"
        if not list(folder.glob(f"vllm-{vllm}-*.whl")) and "--check" not in args:
            session.install("pip")
            session.run("python", "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", f"vllm=={vllm}", "--dest", str(folder))
        wheels = sorted(folder.glob(f"vllm-{vllm}-*.whl"))
        args += ["--vllm-source", str(wheels[0])] if wheels else []
    session.run("omniprobe", "upstream", "check", *args)
