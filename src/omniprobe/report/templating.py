"""The Jinja environment the report's templates render in: strict, with the formatting filters."""

from __future__ import annotations

import jinja2

from omniprobe.config.hosts import HostsConfig
from omniprobe.config.project import Project
from omniprobe.report.filters import FILTERS, flags_text, serve_text


class CompiledTemplates(jinja2.BytecodeCache):
    """Compiled templates kept for the life of the process, found by template name: jinja checks
    each against its source's checksum and compiles anew when the source differs, so a project
    whose templates were edited (or another copy of them) never renders stale code. Compiling
    costs more than rendering; a process that renders twice (`report` then `report --check`,
    the tests) compiles once."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        return name

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_COMPILED = CompiledTemplates()


def environment(project: Project, hosts: HostsConfig) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(project.templates_dir),
        bytecode_cache=_COMPILED,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(FILTERS)
    env.globals["cfg"] = hosts
    env.globals["flags"] = lambda flag_set: flags_text(hosts, flag_set)
    env.globals["serve_text"] = lambda host_key: serve_text(hosts, host_key)
    return env
