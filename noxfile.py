"""omniprobe's sessions: `nox -l` lists them. Each calls one command of the package."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["validate", "tests", "lint"]
nox.options.reuse_venv = "yes"


def _install(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session
def validate(session: nox.Session) -> None:
    """Validate hosts.toml, fixtures/, every evidence file and the committed schemas."""
    _install(session)
    session.run("omniprobe", "validate", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Render REPORT.md from the evidence (`-- --check` fails if the committed one is stale)."""
    _install(session)
    session.run("omniprobe", "report", *session.posargs)


@nox.session
def schema(session: nox.Session) -> None:
    """Regenerate the JSON Schema files in schemas/ from the pydantic models."""
    _install(session)
    session.run("omniprobe", "schema", *session.posargs)


@nox.session
def quality(session: nox.Session) -> None:
    """PSNR against a baseline's images and determinism groups (`-- --baseline DIR`)."""
    _install(session)
    session.run("omniprobe", "quality", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest); GPU tests skip without CUDA."""
    _install(session, "test")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Lint the package, tests and noxfile with ruff."""
    session.install("ruff==0.17.5")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")
