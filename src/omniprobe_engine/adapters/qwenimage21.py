"""Qwen-Image-2.1 (`QwenImage21Pipeline`): Qwen3-VL's processor over a synthetic tokenizer with
Qwen's special tokens at their real ids, the call's `use_kv_cache` and `output_resolution`, and
the recorder of the conditioning KV caches the pipeline makes per call."""

from __future__ import annotations

from omniprobe_engine.knobs import setting
from omniprobe_engine.kv_host import (
    HOST_PLACEMENTS,
    HostMemory,
    cache_slabs,
    host_placed,
    layer_figures,
)

from .base import DiffusersAdapter
from .synthetic_tokenizer import synthetic_tokenizer

# Qwen2/Qwen3 tokenizer's special tokens at their real ids (shared/diffusers-facts.md).
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
_UNKNOWN_ID = 151700
# The pipeline calls processor.apply_chat_template on a system message.
_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                  "{{ c['text'] }}{% endfor %}<|im_end|>\n{% endfor %}")


class QwenImage21Adapter(DiffusersAdapter):
    """Every profile setting is this pipeline's: it keeps a conditioning KV cache and takes a
    condition size."""

    pipelines = ("QwenImage21Pipeline",)
    components = ("processor", "text_encoder", "transformer", "vae")
    keeps_conditioning_cache = True
    takes_output_resolution = True

    def unweighted(self, name: str, class_name: str, config: dict):
        """Qwen3-VL's processor from transformers' classes: `config` holds the image processor's
        settings (its size limits must admit the pipeline's condition images)."""
        if name != "processor":
            raise ValueError(f"component {name!r} ({class_name}): QwenImage21Pipeline's adapter "
                             "makes only its processor")
        from transformers import Qwen3VLProcessor
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        image = Qwen2VLImageProcessor(**config["image_processor"])
        video = Qwen3VLVideoProcessor(**config["video_processor"])
        tokenizer = synthetic_tokenizer(SPECIAL_TOKENS, pad="<|endoftext|>", eos="<|im_end|>",
                                        unknown_id=_UNKNOWN_ID)
        return Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                                chat_template=_CHAT_TEMPLATE)

    def recover(self, pipe) -> None:
        """The VAE's feature cache: AutoencoderKLQwenImage21._decode clears it at its start and
        its end, not in a finally, so a decode that raised leaves its activations on the GPU
        until the next encode or decode (diffusers 0.42.1); clear_cache releases them."""
        clear = getattr(pipe.vae, "clear_cache", None)
        if clear is not None:
            clear()

    def call_arguments(self, pipe, profile: dict, request: dict, sizing: dict) -> dict:
        return {"true_cfg_scale": request["true_cfg_scale"],
                "use_kv_cache": setting(profile, "use_kv_cache"), **sizing}

    def recorder(self, pipe, kv_placement: str = "gpu") -> KvCacheRecorder:
        return KvCacheRecorder(pipe, kv_placement)


def _placed_in_host(base: type, memory: HostMemory) -> type:
    """The pipeline's cache class, its layer caches those of kv_host.host_placed; packed, each
    cache's layers share one Slabs, sized for every layer's K and V."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVLayerCache

    layer = host_placed(QwenImage21KVLayerCache, pinned=memory.pinned)

    class InHost(base):
        def __init__(self, num_layers: int):
            super().__init__(num_layers)
            slabs = cache_slabs(memory, num_layers)
            self.layer_caches = [layer(slabs) for _ in range(num_layers)]

    return InHost


class KvCacheRecorder:
    """Counts the pipeline's conditioning KV caches: the pipeline makes them per call, so the
    module's class is replaced by a subclass that keeps each one it makes until `take`. With a
    host placement, that subclass's layer caches keep K and V in host memory (kv_host.py)."""

    def __init__(self, pipe, kv_placement: str = "gpu"):
        import diffusers.pipelines.qwenimage21.pipeline_qwenimage21 as pipeline_module

        # The pipeline's own class, kept on its module the first time: a second engine in one
        # process (the tests build several) must not subclass the first one's recorder.
        base = vars(pipeline_module).setdefault("_omniprobe_kv_cache",
                                                pipeline_module.QwenImage21KVCache)
        if kv_placement in HOST_PLACEMENTS:
            base = _placed_in_host(base, HOST_PLACEMENTS[kv_placement])
        made: list = []

        class Recorded(base):
            def __init__(self, num_layers: int):
                super().__init__(num_layers)
                made.append(self)

        pipeline_module.QwenImage21KVCache = Recorded
        self.made = made
        self.kept: dict | None = None  # what release counted, for take
        # The prompt's own text tokens, counted as the pipeline encodes it: each fixture has its
        # own prompt, so the references' share of the prefix is the prefix less these.
        self.text_tokens: list[int] = []
        encode = pipe.encode_prompt

        def counted(*args, **kwargs):
            embeds, mask, image_pads = encode(*args, **kwargs)
            tokens = int(mask[0].sum()) if mask is not None else embeds.shape[1]
            self.text_tokens.append(tokens - (int(image_pads[0].sum()) if image_pads is not None
                                              else 0))
            return embeds, mask, image_pads

        pipe.encode_prompt = counted

    def release(self) -> None:
        """After the last denoising step (release_kv_before_decode): count the caches as take
        would, keep the figures for take, and free every layer's K and V before the decode (the
        pipeline still holds the cache objects, now empty)."""
        caches = list(self.made)
        self.kept = self.take()
        for cache in caches:
            for layer in cache.layer_caches:
                layer.k = layer.v = None

    def take(self) -> dict:
        """The call's conditional cache: bytes of its K and V tensors over the layers it filled,
        those layers of how many, the prefix tokens and the prompt's text tokens among them; empty
        when it made none (the cache off); what release counted, where it ran.
        A request that failed during prefill filled only some layers. The caches are released."""
        if self.kept is not None:
            kept, self.kept = self.kept, None
            return kept
        caches, self.made[:] = list(self.made), []
        # The first encoding is the prompt's; a negative prompt's would follow it.
        text, self.text_tokens[:] = self.text_tokens[:1], []
        if not caches:
            return {}
        layers = caches[0].layer_caches
        figures = layer_figures(layers)
        if not figures["kv_cache_layers"]:
            return figures
        first = next(layer for layer in layers if layer.k is not None)
        return {**figures, "prefix_tokens": int(first.k.shape[1]),
                "prompt_text_tokens": text[0] if text else None}

