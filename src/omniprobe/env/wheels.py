"""A pinned wheel list for a machine that reaches no registry (wheels/h200.txt): download it where
a registry is reachable, every hash checked, and check a folder of wheels against it there.

A list line is pip's requirements form, one pin and its hash: `name==version --hash=sha256:HEX`.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
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


def download_command(list_path: Path, dest: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--require-hashes", *TARGET, "--dest", str(dest), "-r", str(list_path)]


def wheel_folder_problems(pins: list[Pin], folder: Path) -> list[str]:
    """What is wrong with a folder of wheels against the list: each pin missing or with another
    hash, and each wheel the list does not pin (two versions of one package stop pip)."""
    wheels = sorted(folder.glob("*.whl"))
    problems = []
    for pin in pins:
        found = [w for w in wheels if pin.matches(w)]
        if not found:
            problems.append(f"{pin.name}=={pin.version}: no wheel in {folder}")
        elif hashlib.sha256(found[0].read_bytes()).hexdigest() != pin.sha256:
            problems.append(f"{found[0].name}: sha256 differs from the list's {pin.sha256[:12]}")
    problems += [f"{w.name}: not in the list" for w in wheels
                 if not any(p.matches(w) for p in pins)]
    return problems


def download(list_path: Path, dest: Path) -> list[Pin]:
    """Fetch the list into `dest` with pip, every hash required; then check the folder."""
    pins = read_pins(list_path)
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_command(list_path, dest), capture_output=True, text=True)
    if done.returncode != 0:
        raise WheelDownloadFailed(f"pip download of {list_path} failed (exit {done.returncode}): "
                                  + " | ".join(done.stderr.strip().splitlines()[-3:]))
    problems = wheel_folder_problems(pins, dest)
    if problems:
        raise WheelDownloadFailed("\n".join(problems))
    return pins
