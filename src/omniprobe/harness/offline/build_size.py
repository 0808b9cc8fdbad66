"""A random build sized before it starts (issue 35 class 8): the runner counts each component's
parameters on the meta device, and a build that could not fit this machine's own RAM is refused
before any attempt exists. The machine's RAM, not an emulated host's cap: a kill at the cap is
that host's answer, and is measured."""

from __future__ import annotations

GIB = 1024**3
BYTES_PER_PARAMETER_AT_LEAST = 1  # int8, the smallest any profile stores a weight in


def machine_ram_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemTotal of this machine; None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def build_size_refusal(parameters: dict[str, int], ram_bytes: int | None,
                       folder: str) -> str | None:
    """Why the build of these parameter counts cannot fit the machine: even at one byte a
    parameter they hold more than its RAM. None: it may fit (or the RAM is unknown)."""
    if ram_bytes is None:
        return None
    total = sum(parameters.values())
    if total * BYTES_PER_PARAMETER_AT_LEAST <= ram_bytes:
        return None
    largest = max(parameters, key=parameters.get)
    return (f"the model configs of {folder} hold {total / 1e9:,.1f} B parameters ({largest}: "
            f"{parameters[largest] / 1e9:,.1f} B), at least {total / GIB:,.1f} GiB at one byte a "
            f"parameter, more than this machine's {ram_bytes / GIB:,.1f} GiB of RAM: the random "
            "build would fill the host until the kernel kills it; nothing was built")
