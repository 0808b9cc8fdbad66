"""Where a server's processes listen, read from Linux /proc: its process group's and its
descendants' socket inodes (/proc/<pid>/fd) matched with the listening TCP sockets of
/proc/net/tcp and tcp6. The harness tells the server to bind 127.0.0.1; this is what it did."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from omniprobe.harness.common.sampler import descends_from

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port} (pid {self.pid})"


def _address(hex_address: str) -> str:
    """An address as /proc/net/tcp writes it: 32-bit words in host byte order (little-endian)."""
    raw = bytes.fromhex(hex_address)
    data = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(data))


def listening_sockets(proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket in this network namespace."""
    found: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                address, port = fields[1].split(":")
                found[int(fields[9])] = (_address(address), int(port, 16))
    return found


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def tree_pids(root: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of the server: its group (the supervisor leads it) and its descendants."""
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if _group(pid) == root or descends_from(pid, root):
                pids.append(pid)
    return pids


def listeners(root: int, proc: Path = Path("/proc")) -> list[Listener]:
    """Every TCP socket the server's processes listen on."""
    sockets = listening_sockets(proc)
    found = []
    for pid in tree_pids(root, proc):
        try:
            fds = list((proc / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in sockets:
                    found.append(Listener(*sockets[inode], pid))
    return sorted(set(found), key=lambda item: (item.port, item.address, item.pid))
