"""The server's URLs, built by urllib from their parts (host, port, a path hosts.toml validated),
never pasted together as text: a path cannot turn into another host or scheme."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def base_url(host: str, port: int) -> str:
    return urlunsplit(("http", f"{host}:{port}", "", "", ""))


def url(base: str, path: str) -> str:
    """`path` on the server at `base`; only the path part of `base` changes."""
    if not path.startswith("/") or path.startswith("//"):
        raise ValueError(f"expected an absolute path such as '/health', got {path!r}")
    return urlsplit(base)._replace(path=path).geturl()


def host_port(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    return parts.hostname or "", parts.port or 80
