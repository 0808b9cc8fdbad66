"""How an interpreter gets the engine package and nothing else: `python FOLDER ARGS` with the
folder `runner_folder()` makes, once a process, in the temporary directory. It holds this package
(a symbolic link to it) and a `__main__.py` that starts the runner; Python puts the folder first
on the path, so the runner imports this package from there and finds no omniprobe beside it,
whichever interpreter runs it: the vLLM-Omni probe env, the Diffusers env, or a GPU machine's own
Python with the wheels of wheels/h200.txt. The folder goes when the process that made it exits.

The harness fills `{runner}` in a host's offline_command with it (harness/offline/env.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def runner_folder() -> Path:
    """The folder a Python runs as the runner (made on first use, removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="omniprobe-engine-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.symlink(PACKAGE, folder / PACKAGE.name, target_is_directory=True)
    # The package's own `python -m` entry, so the two ways in start the runner alike.
    shutil.copyfile(PACKAGE / "__main__.py", folder / "__main__.py")
    return folder
