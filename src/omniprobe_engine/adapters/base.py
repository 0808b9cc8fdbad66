"""What every Diffusers adapter holds: the pipelines it serves, the scheduler they are built with,
what its pipeline can do (the capabilities the profile's settings ask), and each model-specific
behaviour with a default that a family overrides only where its pipeline differs. A refusal falls
out of the capabilities, so a family states what its pipeline has rather than how to refuse."""

from __future__ import annotations

from omniprobe_engine.knobs import OFFLOADS, setting


class NothingRecorded:
    """The pipeline keeps no cache between its steps: a request adds nothing to record."""

    def take(self) -> dict:
        return {}

    def release(self) -> None:
        """Nothing is kept between steps: nothing to release."""


class DiffusersAdapter:
    """One model family's part of the Diffusers engine. The defaults are a pipeline that needs
    nothing beyond its committed configs and keeps nothing between its steps."""

    pipelines: tuple[str, ...] = ()  # the diffusers pipeline classes it serves, by name
    # The components its pipelines take beside the scheduler, by keyword: a model folder's
    # manifest names exactly these (a test holds them to the pipelines' own signatures).
    components: tuple[str, ...] = ()
    scheduler = "FlowMatchEulerDiscreteScheduler"  # the diffusers scheduler class it is built with
    keeps_conditioning_cache = False  # a conditioning KV cache that `use_kv_cache` turns on
    cache_optional = True  # with a cache: use_kv_cache = false runs without it
    frees_cache_before_decode = False  # with a cache: the pipeline frees it before decoding
    takes_guidance = True  # a classifier-free guidance scale (true_cfg_scale) to set
    takes_output_resolution = False  # a condition size that `output_resolution` sets
    own_condition_sizing = "itself"  # how it sizes condition images when it takes no size
    placements: tuple[str, ...] = OFFLOADS  # the offload placements the pipeline allows

    def unweighted(self, name: str, class_name: str, config: dict):
        """A component without weights (a tokenizer, a processor), made from its committed
        `config`; a family without any has nothing to make."""
        raise ValueError(f"component {name!r} ({class_name}): {type(self).__name__} makes no "
                         "component without weights")

    def refusal(self, profile: dict) -> str | None:
        """Why the pipeline cannot run `profile`: a setting it has no counterpart of."""
        pipeline = setting(profile, "pipeline")
        if setting(profile, "use_kv_cache") and not self.keeps_conditioning_cache:
            # Name what the profile asks of the cache too: a placement or a release is refused
            # with it.
            asked = [f"kv_placement = {setting(profile, 'kv_placement')!r}"
                     ] if setting(profile, "kv_placement") != "gpu" else []
            asked += ["release_kv_before_decode = true"
                      ] if setting(profile, "release_kv_before_decode") else []
            return (f"use_kv_cache = true{''.join(f', {a}' for a in asked)}: {pipeline} has no "
                    "conditioning KV cache")
        if self.keeps_conditioning_cache and not self.cache_optional and not setting(
                profile, "use_kv_cache"):
            return f"use_kv_cache = false: {pipeline} always keeps its conditioning KV cache"
        if self.frees_cache_before_decode and setting(profile, "release_kv_before_decode"):
            return (f"release_kv_before_decode = true: {pipeline} frees its conditioning cache "
                    "before the decode itself")
        guidance = setting(profile, "true_cfg_scale")
        if guidance not in (None, 1.0) and not self.takes_guidance:
            return f"true_cfg_scale = {guidance}: {pipeline} runs no classifier-free guidance"
        if setting(profile, "output_resolution") is not None and not self.takes_output_resolution:
            return (f"output_resolution: {pipeline} sizes condition images "
                    f"{self.own_condition_sizing}, it takes no output_resolution")
        offload = setting(profile, "offload")
        if offload not in self.placements:
            return f"offload {offload!r}: {pipeline} allows only {', '.join(self.placements)}"
        return None

    def call_arguments(self, pipe, profile: dict, request: dict, sizing: dict) -> dict:
        """The call's model-specific arguments beside the engine's common ones; `sizing` holds the
        condition size hosts.toml resolved ({} leaves the pipeline's own default)."""
        return {}

    def recorder(self, pipe, kv_placement: str = "gpu"):
        """An object whose take() returns what a request measured beyond the engine's figures;
        where the pipeline keeps a conditioning cache, placed as `kv_placement` says."""
        return NothingRecorded()

    def recover(self, pipe) -> None:
        """What a failed request leaves in the pipeline that the engine's general recovery does not
        undo (called first, so the engine's own steps release what it lets go)."""
