"""How the simulated model reads the settings it models: offline `Omni(...)` kwargs, and the stage
extras of a deploy config on the serve path, which a simulated config bridge honours or drops.
Offline, the `extras` kwarg meets the same choice: upstream's default single-stage diffusion path
builds its own stage extras, so what `Omni(extras=...)` passes may never reach the model.
"""

from __future__ import annotations

from omniprobe.errors import InputError
from omniprobe.safe_io import MissingFile, load_json
from omniprobe.sim.model import Flags, UnsupportedFlags

# Where the serve path's bridge comes from unless --deploy-bridge says: honour or drop the extras.
BRIDGE_ENV = "OMNIPROBE_SIM_DEPLOY_BRIDGE"
BRIDGES = ("honour", "drop")
# Serve also has upstream's own way: no registered pipeline config resolves for the model, so the
# whole deploy config is ignored, with upstream's warning line in the log.
DEPLOY_BRIDGES = (*BRIDGES, "ignore")
DEPLOY_IGNORED_WARNING = "No registered PipelineConfig resolved for model"
# The offline engine's: honour or drop the `extras` kwarg, unless --extras-bridge says.
EXTRAS_BRIDGE_ENV = "OMNIPROBE_SIM_EXTRAS_BRIDGE"
KV_KEY = "prefix_kv_cache_dtype"
_KWARGS = {"enforce_eager", "enable_cpu_offload", "enable_layerwise_offload", "quantization",
           "quantization_config", "extras"}


def kv_dtype(extras: object, where: str) -> str:
    """prefix_kv_cache_dtype from an extras table; any other extra is not modelled."""
    if extras is None:
        return "auto"
    if not isinstance(extras, dict):
        raise UnsupportedFlags(f"{where} must be a table, got {extras!r}")
    unknown = sorted(set(extras) - {KV_KEY})
    if unknown:
        raise UnsupportedFlags(f"{where} key(s) {', '.join(unknown)} are not in the capacity "
                               f"model (modelled: {KV_KEY})")
    return str(extras.get(KV_KEY, "auto"))


def flags_from_kwargs(kwargs: dict, extras_bridge: str = "honour") -> Flags:
    """The capacity model's flags for Omni(...) kwargs; UnsupportedFlags names what it lacks.
    Under the "drop" bridge the extras are read (and checked) but never reach the model."""
    unknown = sorted(set(kwargs) - _KWARGS)
    if unknown:
        raise UnsupportedFlags(f"Omni(...) kwarg(s) {', '.join(unknown)} are not in the capacity "
                               f"model (modelled: {', '.join(sorted(_KWARGS))})")
    precision = kwargs.get("quantization") or "bf16"
    config = kwargs.get("quantization_config")
    if config is not None:
        # One precision for the whole model: per-component configs are not modelled.
        if not isinstance(config, dict) or set(config) != {"method"}:
            raise UnsupportedFlags(f"quantization_config {config!r} is not in the capacity model "
                                   "(modelled: {'method': PRECISION})")
        precision = config["method"]
    kv = kv_dtype(kwargs.get("extras"), "extras")
    return Flags(precision=precision, cpu_offload=bool(kwargs.get("enable_cpu_offload")),
                 layerwise=bool(kwargs.get("enable_layerwise_offload")),
                 kv_cache_dtype="auto" if extras_bridge == "drop" else kv)


class DeployConfigError(ValueError):
    pass


def deploy_extras(path: str) -> dict:
    """The stages' engine_extras.extras of a deploy config, merged in stage order.

    The sim has no YAML parser: its deploy configs are YAML in the JSON subset. The key shape is
    the one the seed report found vLLM-Omni's deploy parser reads: stages[].engine_extras.extras.
    """
    try:
        data = load_json(path)
    except MissingFile:
        raise DeployConfigError(f"deploy config {path}: file not found") from None
    except InputError as exc:
        found = "; ".join(f"{p.path}: {p.message}" if p.path else p.message for p in exc.problems)
        raise DeployConfigError(f"deploy config {path}: the sim reads only YAML written as JSON; "
                                f"{found}") from None
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, list) or not stages:
        raise DeployConfigError(f"deploy config {path}: expected a non-empty top-level 'stages' list")
    merged: dict = {}
    for i, stage in enumerate(stages):
        engine_extras = stage.get("engine_extras") if isinstance(stage, dict) else None
        extras = engine_extras.get("extras") if isinstance(engine_extras, dict) else None
        if not isinstance(extras, dict | None):
            raise DeployConfigError(f"deploy config {path}: stages[{i}].engine_extras.extras must "
                                    "be a table")
        merged.update(extras or {})
    return merged
