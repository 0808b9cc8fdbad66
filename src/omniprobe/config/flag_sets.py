"""hosts.toml's run matrices: the [serve] invocation, the named flag sets and deploy configs, and
the offline engine-kwarg sets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from omniprobe.config.command_rules import (
    SERVE_PLACEHOLDERS,
    ServerPath,
    deliberate_loader_env,
    not_a_shell,
    not_the_harness_options,
    placeholder_problems,
)
from omniprobe.config.hosts_common import HostsTable
from omniprobe.config.inside_path import InsidePath
from omniprobe.limits import MAX_WAIT_S


class ArgsCheck(HostsTable):
    """How the env preflight sees that the serve command's parser accepts a flag set's arguments
    without starting a server."""

    mode: Literal["help", "parse"] = Field(
        description="help: the command with `args` appended prints its help and exits 0, and "
                    "every option the probe passes must be listed in it; parse: the flag set's "
                    "full command with `args` appended parses and exits 0 only if it accepts it.")
    args: list[str] = Field(min_length=1, description="Appended to the serve command.")


class Serve(HostsTable):
    """How the server is started; {model} is replaced by the snapshot path or repo id."""

    command: list[str] = Field(min_length=1)
    # vLLM-Omni's serve help names it: "Use `--help=all` to show all available flags at once".
    args_check: ArgsCheck = ArgsCheck(mode="help", args=["--help=all"])
    bind_host: Literal["127.0.0.1"] = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    enforce_eager: bool
    served_model_name: str
    health_path: ServerPath = "/health"
    ready_path: ServerPath | None = Field(
        default=None, description="Optional readiness endpoint of newer builds (e.g. /ready)."
    )
    ready_timeout_s: float = Field(default=1200, gt=0, le=MAX_WAIT_S,
                                   description="Longer init: a timeout.")
    request_timeout_s: float = Field(default=900, gt=0, le=MAX_WAIT_S)
    stop_grace_s: float = Field(default=15, ge=0, le=3600, description="SIGTERM to SIGKILL.")

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, command: list[str]) -> list[str]:
        return not_the_harness_options(not_a_shell(placeholder_problems(
            command, SERVE_PLACEHOLDERS)), "a flag set's args add the rest")


class DeployConfig(HostsTable):
    """A deploy YAML a flag set passes with --deploy-config."""

    path: InsidePath = Field(pattern=r"^deploy/",
                             description="Path under deploy/, relative to hosts.toml.")
    content_known: bool = Field(
        description="False when the source names the file but does not give its content."
    )
    description: str
    knob: str | None = Field(
        default=None, description="The setting it changes, e.g. 'extras.prefix_kv_cache_dtype': "
                                  "what a propagation check of it names.")


class FlagSet(HostsTable):
    """One row of a run matrix: extra server arguments, environment and deploy configs."""

    description: str
    args: list[str] = []
    env: dict[str, str] = {}
    deliberate_env: list[str] = Field(
        default=[], description="Variables of env that change what code the server loads "
                                "(LD_PRELOAD, PYTHONPATH, ...), set on purpose.")
    deploy_config: str | None = Field(
        default=None, description="Name of a [deploy_configs] entry passed as --deploy-config."
    )

    @field_validator("args")
    @classmethod
    def _no_harness_option(cls, args: list[str]) -> list[str]:
        return not_the_harness_options(args, "deploy_config names a deploy config")

    @model_validator(mode="after")
    def _loader_env_deliberate(self) -> FlagSet:
        deliberate_loader_env(self.env, self.deliberate_env)
        return self


class OfflineKwargSet(HostsTable):
    """Keyword arguments for an offline `Omni(...)` engine, plus environment."""

    description: str
    kwargs: dict | None = Field(
        default=None,
        description="Omni(...) kwargs; absent when the source does not state them (not runnable).",
    )
    env: dict[str, str] = {}
    deliberate_env: list[str] = Field(
        default=[], description="Variables of env that change what code the runner loads "
                                "(LD_PRELOAD, PYTHONPATH, ...), set on purpose.")

    @model_validator(mode="after")
    def _loader_env_deliberate(self) -> OfflineKwargSet:
        deliberate_loader_env(self.env, self.deliberate_env)
        return self
