"""Wall time of a no-op `omniprobe env build` (target: under 5 s).

Builds the test world's environment once (tiny PyPI pins plus two local git repositories; needs
the PyPI index), then times re-runs with nothing changed: in-process, and as the command line
a nox session calls (`omniprobe env build --host testhost`: interpreter start-up and imports
included). The GPU is the scaffold's fake NVML, so no GPU is needed.

    python benchmarks/bench_env_noop.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from env_scaffold import FakeNvml, make_world  # noqa: E402
from omniprobe.env.build import build_env  # noqa: E402

HOST = "testhost"
TESTS = Path(__file__).resolve().parents[1] / "tests"
# The command line with pynvml swapped for the scaffold's fake GPU before the CLI runs.
CLI_WITH_FAKE_GPU = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
                     "from env_scaffold import FakeNvml; from omniprobe import cli; "
                     "from omniprobe.env import nvml_facts; "
                     "nvml_facts.load_nvml = FakeNvml; sys.exit(cli.main(sys.argv[1:]))")


def _stats(label: str, times: list[float]) -> None:
    print(f"{label}: median {statistics.median(times):.3f} s, min {min(times):.3f} s, "
          f"max {max(times):.3f} s over {len(times)} runs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-env-") as tmp:
        world = make_world(Path(tmp))
        os.environ.update(world.env_vars)
        start = time.perf_counter()
        built = build_env(HOST, project=world.project, nvml=FakeNvml(), echo=lambda line: None)
        print(f"first build (uv cache warm or not): {time.perf_counter() - start:.2f} s, "
              f"checks ok: {built.verification.ok}")

        in_process = []
        for _ in range(args.runs):
            start = time.perf_counter()
            result = build_env(HOST, project=world.project, nvml=FakeNvml(),
                               echo=lambda line: None)
            in_process.append(time.perf_counter() - start)
            assert result.action == "verified", result.action
        _stats("no-op re-run, in process", in_process)

        command = [sys.executable, "-c", CLI_WITH_FAKE_GPU, "env", "build", "--host", HOST]
        cli = []
        for _ in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True)
            cli.append(time.perf_counter() - start)
            assert proc.returncode == 0 and "(verified)" in proc.stdout, proc.stdout + proc.stderr
        _stats(f"no-op re-run, `omniprobe env build --host {HOST}`", cli)
        worst = max(cli)
        print(f"target < 5 s: {'met' if worst < 5 else 'MISSED'} (worst {worst:.3f} s)")
        return 0 if worst < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
