"""An upstream source opened for reading: a wheel, an unpacked tree or a git clone of vLLM-Omni
(`vllm_omni`), or of vLLM (`vllm`), whose serve parser vLLM-Omni's starts from.

Nothing of it is imported or executed (CI has neither vllm nor torch): files are read as text and
parsed with `ast`. Paths are relative to the folder that holds the `vllm_omni` package, as
upstream's tracebacks and the seed report cite them (`vllm_omni/diffusion/models/utils.py`).
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from omniprobe.errors import InputError, Problem

PACKAGE = "vllm_omni"
# Text files read from a source; binaries and caches are never needed.
_TEXT_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".json", ".toml")
_GIT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Identity:
    """Which upstream was read: its version, and the commit or the wheel's digest."""

    kind: str  # "wheel" | "tree" | "git"
    path: str
    version: str | None
    commit: str | None = None
    sha256: str | None = None
    package: str = PACKAGE  # the import package read: vllm_omni or vllm


@dataclass
class Source:
    """The text files of one upstream source, by path relative to the package's parent folder."""

    identity: Identity
    files: dict[str, str]
    _trees: dict[str, ast.Module | None] = field(default_factory=dict, repr=False)

    def text(self, path: str) -> str | None:
        return self.files.get(path)

    def lines(self, path: str) -> list[str]:
        text = self.files.get(path)
        return [] if text is None else text.splitlines()

    def tree(self, path: str) -> ast.Module | None:
        """The file's AST; None when absent or not valid Python for this interpreter."""
        if path not in self._trees:
            text = self.files.get(path)
            try:
                self._trees[path] = None if text is None else ast.parse(text, filename=path)
            except SyntaxError:
                self._trees[path] = None
        return self._trees[path]

    @cached_property
    def python_files(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py"))

    def under(self, prefix: str) -> list[str]:
        return [p for p in self.python_files if p.startswith(prefix)]

    def resolve(self, cited: str) -> list[str]:
        """Files a citation's path can mean: exact, a path suffix, or `a/.../b` with a gap."""
        cited = cited.strip().lstrip("./")
        if cited in self.files:
            return [cited]
        if "/.../" in cited:
            head, tail = cited.split("/.../", 1)
            return sorted(p for p in self.files
                          if p.endswith("/" + tail) and f"/{head}/" in "/" + p)
        return sorted(p for p in self.files if p.endswith("/" + cited))


def _version_of(files: dict[str, str], package: str) -> tuple[str | None, str | None]:
    """`__version__` and `__commit_id__` as `<package>/_version.py` assigns them."""
    text = files.get(f"{package}/_version.py")
    if text is None:
        return None, None
    found: dict[str, str | None] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    version = found.get("__version__")
    commit = found.get("__commit_id__")
    return (version if isinstance(version, str) else None,
            commit if isinstance(commit, str) else None)


def _read_wheel(path: Path, package: str) -> dict[str, str]:
    files = {}
    try:
        with zipfile.ZipFile(path) as wheel:
            for name in wheel.namelist():
                if name.startswith(package + "/") and name.endswith(_TEXT_SUFFIXES):
                    files[name] = wheel.read(name).decode("utf-8", "replace")
    except zipfile.BadZipFile as exc:
        raise InputError([Problem(str(path), "", f"not a wheel (zip) file: {exc}")]) from None
    return files


def _package_root(path: Path, package: str) -> Path | None:
    """The folder that holds the package: the path itself, its parent, or a clone's root."""
    for candidate in (path, path.parent):
        if (candidate / package / "__init__.py").is_file():
            return candidate
    return None


def _read_tree(root: Path, package: str) -> dict[str, str]:
    files = {}
    for file in sorted((root / package).rglob("*")):
        if file.suffix in _TEXT_SUFFIXES and file.is_file() and "__pycache__" not in file.parts:
            files[file.relative_to(root).as_posix()] = file.read_text("utf-8", "replace")
    return files


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else None


def tree_digest(files: dict[str, str]) -> str:
    """A digest of every text file's path and content: identifies an unpacked tree."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()


def open_source(path: Path, package: str = PACKAGE) -> Source:
    """Open a wheel (.whl), an unpacked tree or a git clone of `package`; InputError naming the
    path if not."""
    if path.is_file() and path.suffix == ".whl":
        files = _read_wheel(path, package)
        kind, sha = "wheel", _file_sha256(path)
        commit = None
    elif path.is_dir():
        root = _package_root(path, package)
        if root is None:
            raise InputError([Problem(str(path), "", f"no {package}/ package here or in its "
                                      "parent; expected an unpacked wheel, a source tree or a "
                                      "clone")])
        files = _read_tree(root, package)
        commit = _git_commit(root)
        kind, sha = ("git", None) if commit else ("tree", tree_digest(files))
    else:
        raise InputError([Problem(str(path), "", "not found, or neither a .whl nor a folder")])
    if not any(name.endswith(".py") for name in files):
        raise InputError([Problem(str(path), "", f"holds no {package}/*.py files")])
    version, built_commit = _version_of(files, package)
    return Source(Identity(kind=kind, path=str(path), version=version,
                           commit=commit or built_commit, sha256=sha, package=package), files)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # vLLM's wheel is some 300 MB: read it in pieces
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
