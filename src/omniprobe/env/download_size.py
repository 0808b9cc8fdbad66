"""What an env build downloads, said before it starts (issue 52): the pins by name, and roughly
how much where omniprobe has measured an env of the same pins. No source states these sizes;
each is omniprobe's own estimate, given with its basis, and an env never measured says so."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.config.stack import InstallStep
from omniprobe.env.state import EnvName, env_label


@dataclass(frozen=True)
class SizeEstimate:
    gb: float | None  # None: never measured, so no figure is given
    basis: str


# PyPI's torch 2.11.0 is the CUDA 13.0 build (it requires the nvidia-*-cu13 wheels), so the
# tests-diffusers venv (pyproject's diffusers extra) holds what [diffusers_env] installs.
ESTIMATES: dict[EnvName, SizeEstimate] = {
    "diffusers": SizeEstimate(
        5.0, "omniprobe's estimate: the same pins installed in the tests-diffusers venv measured "
             "5.0 GB on disk (torch 1.1 GB, its CUDA libraries 2.7 GB, triton 0.6 GB; measured "
             "2026-12-05); the wheels are compressed, so the download is somewhat less"),
    "probe": SizeEstimate(
        None, "not measured as a whole: no probe env has been built where omniprobe could "
              "measure it; torch with its CUDA libraries alone came to some 4 GB on disk in the "
              "Diffusers env's measure, and vLLM's wheel is some 300 MB (noxfile, upstream)"),
}


def download_notice(which: EnvName, steps: list[InstallStep]) -> str:
    """One comment line: what the build downloads, and roughly how much, with the basis."""
    pins = ", ".join(f"{step.name} {step.pin}" for step in steps)
    estimate = ESTIMATES[which]
    size = (f"some {estimate.gb:.1f} GB on disk once installed" if estimate.gb is not None
            else "a size not measured")
    return (f"# the {env_label(which)} build downloads {pins} and their dependencies "
            f"(uv's cache keeps them for the next build): {size}; {estimate.basis}")
