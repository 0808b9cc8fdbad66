"""`python -m omniprobe.sim serve MODEL --omni --port P [flags]`: the simulated server's CLI.

It takes the real server's flags, builds the capacity model's pipeline (allocating the weights,
which may OOM at init like the real one), and only then binds the port.

`python -m omniprobe.sim offline --hosts-file F --sim-host H <runner arguments>` runs the offline
runner's protocol over the same capacity model (see omniprobe.sim.offline).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from omniprobe.errors import InputError
from omniprobe.sim.capacity import CapacityError, load_sim_host
from omniprobe.sim.knobs import (
    BRIDGE_ENV,
    BRIDGES,
    DEPLOY_BRIDGES,
    DEPLOY_IGNORED_WARNING,
    EXTRAS_BRIDGE_ENV,
    DeployConfigError,
    deploy_extras,
    kv_dtype,
)
from omniprobe.sim.memory import MIB, Accounted, StateFile, Torch
from omniprobe.sim.model import Flags, Pipeline, UnsupportedFlags, reference_cost_mib, resident_mib
from omniprobe_engine.emulation_site.sitecustomize import EmulationError, cap_from_env

# The serving and offline modules are imported where they run: the env preflight starts this
# module once per flag set for `--check-args`, which needs neither.

TIME_SCALE_ENV = "OMNIPROBE_SIM_TIME_SCALE"


def _faults(specs: list[str]):
    from omniprobe.sim.http import Faults

    faults = Faults()
    for spec in specs:
        kind, _, number = spec.partition("@")
        if kind not in ("crash", "hang", "malformed", "fail") or not number.isdigit():
            raise SystemExit(f"--fault expects crash@N, hang@N, malformed@N or fail@N, "
                             f"got {spec!r}")
        getattr(faults, kind).add(int(number))
    return faults


def _model_options(p: argparse.ArgumentParser) -> None:
    """What selects and runs the capacity model, in serve and offline mode alike."""
    p.add_argument("--hosts-file", required=True, help="hosts.toml holding the capacity model")
    p.add_argument("--sim-host", required=True, help="the simulated host whose model to use")
    p.add_argument("--torch", action="store_true",
                   help="allocate the modelled memory on the CUDA device for real")
    p.add_argument("--torch-cap-gib", type=float,
                   help="per-process cap under --torch (default: none of its own; the card's "
                        "memory, or an emulated host's cap, bounds it)")
    p.add_argument("--time-scale", type=float,
                   default=float(os.environ.get(TIME_SCALE_ENV, "1")),
                   help=f"multiplies modelled times (0: instant; default ${TIME_SCALE_ENV} or 1)")
    p.add_argument("--fault", action="append", default=[],
                   help="test fault: crash@N, hang@N, malformed@N or fail@N (generation "
                        "raises) (N: request number)")


def build_offline_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m omniprobe.sim offline", allow_abbrev=False,
        description="the offline runner's protocol over the capacity model; the runner's own "
                    "arguments (--model, --kwargs/--kwargs-file, --requests, --results) follow")
    _model_options(parser)
    parser.add_argument("--extras-bridge", choices=BRIDGES,
                        default=os.environ.get(EXTRAS_BRIDGE_ENV, "honour"),
                        help="whether the simulated engine passes the `extras` kwarg to the model "
                             f"or drops it (default ${EXTRAS_BRIDGE_ENV} or honour)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    # Only -h here: `serve --help=all` is the serve parser's, as in vLLM.
    parser = argparse.ArgumentParser(prog="python -m omniprobe.sim", description=__doc__,
                                     add_help=False)
    parser.add_argument("-h", action="help", help="show this help message and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("offline", help="run the offline runner protocol over the capacity model "
                                   "(see `python -m omniprobe.sim offline --help`)")
    p = sub.add_parser("serve", help="serve the simulated model", add_help=False)
    p.add_argument("model")
    p.add_argument("-h", "--help", nargs="?", const="short", metavar="all",
                   help="show this help message and exit (--help=all: every option, as vLLM)")
    p.set_defaults(print_help=p.print_help)
    p.add_argument("--omni", action="store_true", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--served-model-name")
    p.add_argument("--enable-cpu-offload", action="store_true")
    p.add_argument("--enable-layerwise-offload", action="store_true")
    p.add_argument("--quantization")
    p.add_argument("--deploy-config")
    p.add_argument("--stage-init-timeout", type=float)
    p.add_argument("--init-timeout", type=float)
    p.add_argument("--log-stats", action="store_true")
    p.add_argument("--check-args", action="store_true",
                   help="parse and check the arguments against the capacity model, then exit 0 "
                        "without allocating or serving (the env's serve preflight)")
    p.add_argument("--deploy-bridge", choices=DEPLOY_BRIDGES,
                   default=os.environ.get(BRIDGE_ENV, "honour"),
                   help="whether the simulated config bridge passes the deploy config's stage "
                        "extras to the model, drops them, or ignores the whole config as "
                        "upstream does for a model without a registered pipeline config "
                        f"(default ${BRIDGE_ENV} or honour)")
    _model_options(p)
    return parser


def _memory(args, host):
    cap = host.capacity
    if args.torch:
        return Torch(int(args.torch_cap_gib * 1024**3) if args.torch_cap_gib else None)
    # An emulated host's cap (the sim-account mechanism) replaces the modelled card's memory.
    total = cap_from_env() or cap.vram_mib * MIB
    # The harness names the file to publish in through the variable the host's config names.
    state_path = os.environ.get(host.memory_file_env) if host.memory_file_env else None
    state = StateFile(state_path, total) if state_path else None
    return Accounted(total, cap.context_mib * MIB, state)


def _sim_host(args):
    """The sim host (which has a capacity model), or an error message."""
    try:
        return load_sim_host(args.hosts_file, args.sim_host), None
    except (InputError, CapacityError) as exc:
        return None, f"error: {exc}"


def _kv_from_deploy(args) -> str:
    """The deploy config's conditioning-KV dtype as the model sees it after the config bridge."""
    if not args.deploy_config:
        return "auto"
    if args.deploy_bridge == "ignore":
        print(f"WARNING: {DEPLOY_IGNORED_WARNING} {args.model}; --deploy-config "
              f"{args.deploy_config} is ignored and the default diffusion stage is built from "
              "CLI arguments", file=sys.stderr)
        return "auto"
    extras = deploy_extras(args.deploy_config)
    if args.deploy_bridge == "drop":
        print(f"INFO: deploy config {args.deploy_config}: stage extras {extras} parsed; the "
              "simulated config bridge drops them", file=sys.stderr)
        return "auto"
    return kv_dtype(extras, f"deploy config {args.deploy_config} stages[].engine_extras.extras")


def offline_main(argv: list[str]) -> int:
    args, runner_argv = build_offline_parser().parse_known_args(argv)
    host, error = _sim_host(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    print(f"INFO: simulated offline engine (omniprobe.sim) on {args.sim_host}", file=sys.stderr)
    from omniprobe.sim import offline

    return offline.main(runner_argv, host.capacity, _memory(args, host), args.time_scale,
                        _faults(args.fault), args.extras_bridge)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["offline"]:
        return offline_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.help:
        args.print_help()
        return 0
    host, error = _sim_host(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    cap = host.capacity
    try:
        kv = _kv_from_deploy(args)
    except (DeployConfigError, UnsupportedFlags) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flags = Flags(precision=args.quantization or "bf16", cpu_offload=args.enable_cpu_offload,
                  layerwise=args.enable_layerwise_offload, kv_cache_dtype=kv)
    if args.check_args:
        try:
            resident_mib(cap, flags)
            reference_cost_mib(cap, flags)
        except UnsupportedFlags as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"arguments accepted: {flags}")
        return 0
    print(f"INFO: simulated server (omniprobe.sim) for {args.model}: {flags}", file=sys.stderr)
    try:
        memory = _memory(args, host)
    except EmulationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        pipeline = Pipeline(cap, flags, memory, args.time_scale)
        pipeline.init_parameters()
    except UnsupportedFlags as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except memory.oom_error:
        traceback.print_exc()
        print("ERROR: Stage initialization failed; shutting down", file=sys.stderr, flush=True)
        return 1
    print(f"sim account: {json.dumps(memory.account().as_dict())}", file=sys.stderr, flush=True)
    from omniprobe.sim.http import SimService, serve

    service = SimService(pipeline, args.served_model_name or args.model, _faults(args.fault))
    serve(service, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
