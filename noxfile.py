"""omniprobe's sessions: `nox -l` lists them. Each calls one command of the package.

Options after `--` reach the sessions whose command takes them (docs/guide.md: Options after `--`);
one no session of the run takes is an error. E.g. `nox -s env-sim probe-init probe-serve report
-- --fresh`: a new probe attempt, then the report."""

from __future__ import annotations

import itertools
import json
import os
import runpy
import time
import tomllib
from pathlib import Path

import nox
import nox.command

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
    """hosts.toml's hosts: name -> simulated (an emulated host is simulated when the host it
    emulates is: it takes that host's matrix, as config/hosts.py's HostsConfig says)."""
    hosts = _toml().get("hosts", {})

    def simulated(host: dict) -> bool:
        emulates = host.get("emulation", {}).get("emulates")
        return bool(host.get("simulated", hosts.get(emulates, {}).get("simulated")))

    return {name: simulated(host) for name, host in hosts.items()}


def _run_sessions(session: nox.Session) -> list[str]:
    """The sessions of this nox run, in the noxfile's order: those -s, -k, -t or NOXSESSION chose, and
    any notified. nox has no public accessor for them; its manifest (a private attribute of the
    session) answers `name in manifest` and `list_all_sessions()` publicly."""
    manifest = session._runner.manifest
    return [runner.name for runner, _ in manifest.list_all_sessions() if runner.name in manifest]


def _omniprobe(session: nox.Session, *args: str, **kwargs):
    """Run `omniprobe ARGS`; when it fails, the session's last line says what its exit code
    meant (nox exits 1 for every failure)."""
    try:
        return session.run("omniprobe", *args, **kwargs)
    except nox.command.CommandFailed as failed:
        code = failed.return_code
        command = " ".join(itertools.takewhile(lambda arg: not arg.startswith("-"), args[:2]))
        if code is None:  # it never ran: nox names the reason just above
            session.error(f"omniprobe {command} did not run: {failed.reason or 'not found'}")
        meanings = runpy.run_path(str(Path(__file__).parent / "src/omniprobe/errors.py"))[
            "EXIT_MEANINGS"]
        meaning = meanings.get(code, "not one of omniprobe's exit codes (docs/guide.md: Exit codes)")
        session.error(f"omniprobe {command} exited {code}: {meaning}")


def _args(session: nox.Session) -> list[str]:
    """This session's share of the arguments after `--` (omniprobe/cli/nox_args.py routes each
    option to the sessions of the run whose command takes it; one none takes is an error)."""
    if not session.posargs:
        return []
    routed = _omniprobe(session, "nox-args", "--run", ",".join(_run_sessions(session)),
                        session.name, "--", *session.posargs, silent=True, stderr=None)
    return json.loads(routed)


def _install(session: nox.Session, *extras: str, env: dict[str, str] | None = None) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec, env=env)


@nox.session
def validate(session: nox.Session) -> None:
    """Validate hosts.toml, sim.toml, fixtures/, every evidence file and the committed schemas."""
    _install(session)
    _omniprobe(session, "validate", *_args(session))


@nox.session
def report(session: nox.Session) -> None:
    """Render REPORT.md, report/DETAILS.md, report/HARNESS.md and their figures (-- --check).

    `-- --check` writes nothing and fails, naming each stale file, if a committed one differs."""
    _install(session)
    _omniprobe(session, "report", *_args(session))


@nox.session
def answer(session: nox.Session) -> None:
    """Which searched profile runs each reference count on a card with a host RAM.

    `-- --card rtx3090 --host-ram-gib 64`, from the committed evidence, as the report answers
    its cards; `--usable-mib` for a card not in hosts.toml, `--model-folder` for one model."""
    _install(session)
    _omniprobe(session, "answer", *_args(session))


@nox.session
def schema(session: nox.Session) -> None:
    """Regenerate the JSON Schema files in schemas/ from the pydantic models (-- --check).

    `-- --check` writes nothing and fails if a committed schema differs."""
    _install(session)
    _omniprobe(session, "schema", *_args(session))


@nox.session
def standins(session: nox.Session) -> None:
    """Draw the stand-in fixtures' reference images under fixtures/standins/ (-- --check).

    `-- --check` writes nothing and fails if a file or a pinned digest differs from a fresh draw."""
    _install(session)
    _omniprobe(session, "standins", *_args(session))


@nox.session
def quality(session: nox.Session) -> None:
    """Compare an attempt's images with a baseline's by PSNR, with determinism groups.

    `-- --baseline DIR` names the baseline's folder."""
    _install(session)
    _omniprobe(session, "quality", *_args(session))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite with pytest, a worker per core and one more (-- hands it options).

    Every option after `--` goes to pytest (`-- -n 0`: one process)."""
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
    """Run the Diffusers engine's tests on the CPU: two tiny models through the offline path.

    The models are a tiny Qwen-Image-2.1 and a tiny FLUX.2 [klein]. It runs the streamed build
    too, holds every model folder to the libraries and counts each full-size one on the meta
    device, and installs torch, transformers, diffusers and torchao, pinned to the GPU
    machine's."""
    # The first run downloads the CUDA build of torch with the rest: some 4.7 GB (an earlier
    # session's measure); say so before the install starts, not after minutes of silence.
    session.log("installs torch 2.11.0, torchvision, transformers, diffusers, accelerate and "
                "torchao (pyproject's diffusers extra): on a first run some 4.7 GB to download")
    _install(session, "test", "diffusers")
    session.run("pytest", "-n", "2", "tests/test_diffusers.py", "tests/test_diffusers_build.py",
                "tests/test_full_size_models.py", *session.posargs,
                env={"PYTHONDONTWRITEBYTECODE": ""})


@nox.session
def lint(session: nox.Session) -> None:
    """Lint the package, tests, benchmarks and noxfile with ruff (pyproject.toml's `lint` pin)."""
    session.install(*nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["lint"])
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")


def _env_session(host: str, simulated: bool):
    def env(session: nox.Session) -> None:
        _install(session)
        _omniprobe(session, "env", "build", "--host", host, "--select", *_args(session),
                    env=INVOCATION)

    built = (f"Check {host}'s env, omniprobe itself (a simulated host: nothing is built)"
             if simulated else f"Build {host}'s pinned env from hosts.toml, or verify it if built")
    env.__doc__ = (f"{built}; select {host} for the probe sessions after it.\n\n"
                   "`-- --dry-run` prints the commands instead and selects nothing.")
    return env


for _host, _simulated in _hosts().items():
    nox.session(name=f"env-{_host}")(_env_session(_host, _simulated))


@nox.session(name="probe-init")
def probe_init(session: nox.Session) -> None:
    """Start the server under each flag set and record how its init ends (-- --flag-set F)."""
    _install(session)
    _omniprobe(session, "probe-init", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-serve")
def probe_serve(session: nox.Session) -> None:
    """Serve each seed fixture (or its stand-in) x seed under each flag set (-- --fixture X)."""
    _install(session)
    _omniprobe(session, "probe-serve", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-offline")
def probe_offline(session: nox.Session) -> None:
    """Generate the fixtures offline: Omni(...) per kwarg set, or Diffusers per profile.

    On a Diffusers host it runs hosts.toml's diffusers_profiles (`-- --profile P`), else each
    offline kwarg set (`-- --kwarg-set K`)."""
    _install(session)
    _omniprobe(session, "probe-offline", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-capacity")
def probe_capacity(session: nox.Session) -> None:
    """Bisect the smallest memory pool per Diffusers profile and reference count, as a band.

    One runner per profile, on a Diffusers host without an emulation cap (-- --profile P); where
    the host's runner runs in the Diffusers env, it is built, or only verified, first."""
    _install(session)
    _omniprobe(session, "probe-capacity", "--build-env", *_args(session), env=INVOCATION,
               interrupt_timeout=PROBE_STOP_S)


@nox.session(name="probe-baseline")
def probe_baseline(session: nox.Session) -> None:
    """Re-seal the seed's Diffusers baseline on a Diffusers host, in its own Diffusers env.

    The env (hosts.toml [diffusers_env]) is built, or only verified, first; the images land
    where `nox -s quality` reads them."""
    _install(session)
    _omniprobe(session, "probe-baseline", "--build-env", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session
def propagation(session: nox.Session) -> None:
    """Serve one fixture with and without a deploy config, to see if its knob reached the model.

    `-- --with F` names the flag set that passes the deploy config."""
    _install(session)
    _omniprobe(session, "propagation", *_args(session), env=INVOCATION,
                interrupt_timeout=PROBE_STOP_S)


@nox.session
def upstream(session: nox.Session) -> None:
    """Check the harness against the registry's vLLM-Omni pinned in hosts.toml [upstream].

    Its wheel (downloaded once, read with ast, never imported) must pass every named check, each
    shown with its upstream file:line. `-- --check` fails only when a result differs from the
    committed evidence; `-- --source PATH` checks another wheel, source tree or clone instead."""
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
    _omniprobe(session, "upstream", "check", *args)
