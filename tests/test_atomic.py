"""Atomic writes: the rename is the commit point, and a write that fails before it leaves the old
file whole and no scratch file behind. A plain write fails these tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omniprobe.atomic import write_bytes_atomic, write_text_atomic


def test_the_rename_is_the_commit_point(tmp_path, monkeypatch):
    path = tmp_path / "runs.json"
    path.write_bytes(b"old")
    renames = []
    rename = os.replace

    def watched(src, dst):
        # Everything new is on disk beside the target, and a reader still sees the old file.
        renames.append((Path(src).parent, Path(src).read_bytes(), Path(dst).read_bytes()))
        rename(src, dst)

    monkeypatch.setattr(os, "replace", watched)
    write_text_atomic(path, "new ✓")
    assert renames == [(tmp_path, "new ✓".encode(), b"old")]
    assert path.read_bytes() == "new ✓".encode()
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("step", ["fsync", "replace"])
@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     KeyboardInterrupt()])
def test_a_write_stopped_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch, step,
                                                               failure):
    path = tmp_path / "requests.json"
    path.write_bytes(b"old")

    def stop(*args):
        raise failure

    monkeypatch.setattr(os, step, stop)
    with pytest.raises(type(failure)):
        write_bytes_atomic(path, b"new" * 100_000)
    assert path.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [path]


def test_a_new_file_and_its_folder_are_made(tmp_path):
    path = tmp_path / "attempt" / "runs.json"
    assert write_bytes_atomic(path, b"[]") == path
    assert path.read_bytes() == b"[]" and list(path.parent.iterdir()) == [path]
