"""A pinned wheel list for a machine that reaches no registry (wheels/h200.txt): download it where
a registry is reachable, every hash checked, and check a folder of wheels against it there.

A list line is pip's requirements form, one pin and its hash: `name==version --hash=sha256:HEX`.
The check hashes every file in the folder, since `pip install --find-links` may pick any of them
(another platform tag of a pinned name and version included): each must be a regular file whose
sha256 is its pin's. The download runs pip as a module of this Python where it has one, else the
pip beside it or on PATH (a uv venv has none), else says what to install.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omniprobe.errors import EnvironmentFailure, InputError, Problem
from omniprobe.safe_io import read_text

_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][0-9A-Za-z.+-]*)"
                   r" --hash=sha256:(?P<sha256>[0-9a-f]{64})$")
# The GPU machine's Python: CPython 3.12 on x86-64 manylinux (device KINDS.md).
TARGET = ("--python-version", "3.12", "--implementation", "cp",
          *[arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                            "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                            "manylinux2014_x86_64", "manylinux1_x86_64")
            for arg in ("--platform", tag)])


class WheelDownloadFailed(EnvironmentFailure):
    """pip could not fetch the list (no registry, or a hash that differs)."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str

    def matches(self, wheel: Path) -> bool:
        norm = lambda text: re.sub(r"[-_.]+", "_", text).lower()  # noqa: E731
        head = wheel.name.split("-")
        return len(head) > 2 and norm(head[0]) == norm(self.name) and head[1] == self.version


def read_pins(path: Path) -> list[Pin]:
    """The list's pins; InputError naming each line that is not `name==version --hash=sha256:HEX`."""
    pins, problems = [], []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line.strip())
        if match is None:
            problems.append(Problem(str(path), f"line {number}", "expected "
                                    f"'name==version --hash=sha256:<64 hex>', got {line!r}"))
        else:
            pins.append(Pin(**match.groupdict()))
    names = [p.name.lower() for p in pins]
    problems += [Problem(str(path), "", f"{n} is pinned twice") for n in sorted(set(names))
                 if names.count(n) > 1]
    if problems:
        raise InputError(problems)
    return pins


def pip_command(python: str = sys.executable,
                which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """How to run pip for the download: `python -m pip` where that Python has pip, else a pip
    beside it or on PATH (`pip download` of wheels for another platform installs nothing, so
    any pip serves); WheelDownloadFailed saying what to install otherwise."""
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return [python, "-m", "pip"]
    for candidate in (os.path.join(os.path.dirname(python), name) for name in ("pip3", "pip")):
        if os.access(candidate, os.X_OK):
            return [candidate]
    found = which("pip3") or which("pip")
    if found:
        return [found]
    raise WheelDownloadFailed(f"no pip to download with: {python} has no pip module and no pip "
                              "is beside it or on PATH; install one (`uv pip install --python "
                              f"{python} pip`, or `{python} -m ensurepip`)")


def download_command(list_path: Path, dest: Path, pip: list[str] | None = None) -> list[str]:
    return [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps",
            "--only-binary=:all:", "--require-hashes", *TARGET, "--dest", str(dest),
            "-r", str(list_path)]


_CHUNK_BYTES = 1 << 20
# What `pip install --find-links` takes from a folder: wheels and source archives.
PIP_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")


def file_sha256(path: Path) -> str | None:
    """The sha256 of a regular file, opened without following a symlink; None for anything else
    (a symlink to /dev/zero would never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # fdopen would refuse a folder
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        digest = hashlib.sha256()
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def wheel_folder_problems(pins: list[Pin], folder: Path) -> list[str]:
    """What is wrong with a folder of wheels against the list: each pin missing; each file that
    is not a regular file, or whose sha256 is not its pin's (every file of a pinned name and
    version is hashed, not the first); each file the list does not pin."""
    files = sorted(p for p in folder.iterdir() if p.name.endswith(PIP_ARCHIVES)) \
        if folder.is_dir() else []
    problems = []
    for pin in pins:
        if not any(pin.matches(f) for f in files):
            problems.append(f"{pin.name}=={pin.version}: no wheel in {folder}")
    for file in files:
        pin = next((p for p in pins if p.matches(file) and file.name.endswith(".whl")), None)
        digest = file_sha256(file)
        if digest is None:
            problems.append(f"{file.name}: not a regular file (a symlink, folder, FIFO or "
                            "device); expected a wheel")
        elif pin is None:
            problems.append(f"{file.name}: not in the list")
        elif digest != pin.sha256:
            problems.append(f"{file.name}: sha256 differs from the list's {pin.sha256[:12]} for "
                            f"{pin.name}=={pin.version}; pip could install it unchecked")
    return problems


def download(list_path: Path, dest: Path) -> list[Pin]:
    """Fetch the list into `dest` with pip, every hash required; then check the folder."""
    pins = read_pins(list_path)
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_command(list_path, dest, pip_command()), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise WheelDownloadFailed(f"pip download of {list_path} failed (exit {done.returncode}): "
                                  + " | ".join(done.stderr.strip().splitlines()[-3:]))
    problems = wheel_folder_problems(pins, dest)
    if problems:
        raise WheelDownloadFailed("\n".join(problems))
    return pins
