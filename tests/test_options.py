"""Each probe option is defined once (harness/common/options.py): its flag, the options object, the
settings hosts.toml's defaults merge into and the nox routing all come from that definition."""

from __future__ import annotations

from dataclasses import dataclass

from omniprobe.cli import build_parser
from omniprobe.cli.nox_args import ROUTES, option_actions, route_options, routing_table
from omniprobe.cli.options import options_from
from omniprobe.config.hosts import load_hosts
from omniprobe.harness.common import options
from omniprobe.harness.common.options import (
    COMMANDS,
    SECONDS,
    Option,
    ProbeOptions,
    Takes,
    option,
    settings_of,
)
from omniprobe.harness.offline.plan import OfflineSettings
from omniprobe.harness.serve.plan import ServeSettings

from .conftest import REPO

NEW = Option("--new-wait", "seconds a new option waits (default: {hosts_default})",
             bounds=SECONDS, hosts_default=("serve", "request_timeout_s"))


@dataclass(frozen=True)
class NewOptions(ProbeOptions):
    new_wait: float | None = option(NEW)


@dataclass(frozen=True)
class NewSettings:
    new_wait: float
    port: int


def test_a_new_option_reaches_the_parser_the_settings_and_the_routing(monkeypatch):
    monkeypatch.setitem(COMMANDS, "probe-serve", Takes(NewOptions, COMMANDS["probe-serve"].words))
    parser = build_parser.__wrapped__()  # built anew from the patched table, not the cached one
    serve = parser.parse_args(["probe-serve", "--new-wait", "7", "--fresh"])
    assert options_from(serve) == NewOptions(new_wait=7.0, fresh=True)
    help_ = option_actions(parser, ROUTES["probe-serve"])["--new-wait"].help
    assert help_ == "seconds a new option waits (default: [serve] request_timeout_s)"
    cfg = load_hosts(REPO / "hosts.toml")
    assert settings_of(NewSettings, options_from(serve), cfg) == NewSettings(7.0, cfg.serve.port)
    assert settings_of(NewSettings, NewOptions(), cfg).new_wait == cfg.serve.request_timeout_s
    run = ["probe-init", "probe-serve"]
    assert route_options(parser, "probe-serve", run, ["--new-wait", "7"]) == ["--new-wait", "7"]
    assert route_options(parser, "probe-init", run, ["--new-wait", "7"]) == []
    assert routing_table(parser)["--new-wait"] == ["probe-serve"]


def test_settings_take_the_command_line_over_hosts_toml():
    cfg = load_hosts(REPO / "hosts.toml")
    serve = cfg.serve
    merged = settings_of(ServeSettings, ProbeOptions(), cfg)
    assert (merged.port, merged.model, merged.ready_timeout_s, merged.request_timeout_s,
            merged.grace_s) == (serve.port, cfg.stack.model_repo, serve.ready_timeout_s,
                                serve.request_timeout_s, serve.stop_grace_s)
    given = settings_of(ServeSettings, ProbeOptions(
        port=9, model="m", ready_timeout_s=1, request_timeout_s=2, grace_s=0, sample_hz=5,
        idle_timeout_s=3, gpu_index=1, flag_sets=("f",)), cfg, flag_sets=(), fixtures=("x",))
    assert given == ServeSettings(port=9, model="m", ready_timeout_s=1, request_timeout_s=2,
                                  grace_s=0, sample_hz=5, idle_timeout_s=3, gpu_index=1,
                                  fixtures=("x",))  # flag sets: only those passed
    offline = settings_of(OfflineSettings, options.OfflineOptions(configurations=("k",), seeds=(3,)),
                          cfg, cap_mib=12)
    assert offline == OfflineSettings(model=cfg.stack.model_repo,
                                      ready_timeout_s=serve.ready_timeout_s,
                                      request_timeout_s=serve.request_timeout_s,
                                      grace_s=serve.stop_grace_s, configurations=("k",), seeds=(3,),
                                      cap_mib=12)


def test_kwarg_sets_gather_the_kwarg_sets_then_the_profiles():
    args = build_parser().parse_args(["probe-offline", "--profile", "p", "--kwarg-set", "k",
                                      "--seed", "4", "--caps", "16"])
    assert options_from(args) == options.OfflineOptions(configurations=("k", "p"), seeds=(4,),
                                                        caps_gib="16")
    baseline = build_parser().parse_args(["probe-baseline", "--profile", "p", "--build-env"])
    assert options_from(baseline) == options.BaselineOptions(configurations=("p",), build_env=True)
