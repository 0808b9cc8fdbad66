"""FLUX.2 [klein] (`Flux2KleinPipeline`): a Qwen3 text encoder over a synthetic tokenizer with
Qwen3's special tokens at their real ids, and the call's guidance and text-encoder layers. It
takes reference images as a list (`image=`) and keeps no cache between its steps to record.

Its 9B KV release (`Flux2KleinKVPipeline`) takes the same components and keeps the reference
tokens' K and V from step 0 for every later step: a conditioning cache it always keeps with
references, frees itself before the decode, and runs without guidance."""

from __future__ import annotations

from omniprobe_engine.kv_host import HOST_PLACEMENTS, cache_slabs, host_placed, layer_figures

from .base import DiffusersAdapter
from .synthetic_tokenizer import synthetic_tokenizer

# Qwen3's special tokens at their real ids: the pipeline's chat template uses these.
SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                  "<think>": 151667, "</think>": 151668}
# The pipeline calls tokenizer.apply_chat_template(..., add_generation_prompt=True,
# enable_thinking=False), as Qwen3's template takes them.
_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>"
                  "\n\n{% endif %}{% endif %}")


def text_encoder_layers(layers: int) -> tuple[int, int, int]:
    """The hidden states the prompt embedding stacks: the pipeline's default (9, 18, 27) is a
    quarter, half and three quarters of its Qwen3 encoder's 36 layers; a smaller encoder takes
    the same fractions."""
    return layers // 4, layers // 2, 3 * layers // 4


class Flux2KleinAdapter(DiffusersAdapter):
    """No conditioning KV cache and no condition size to set (the base's defaults): a profile
    asking for either is refused, and a request records nothing beyond the engine's figures."""

    pipelines = ("Flux2KleinPipeline",)
    components = ("text_encoder", "tokenizer", "transformer", "vae")
    own_condition_sizing = "itself (up to 1024² pixels)"

    def unweighted(self, name: str, class_name: str, config: dict):
        if name != "tokenizer":
            raise ValueError(f"component {name!r} ({class_name}): {self.pipelines[0]}'s adapter "
                             "makes only its tokenizer")
        return synthetic_tokenizer(SPECIAL_TOKENS, pad="<|endoftext|>", eos="<|im_end|>",
                                   chat_template=_CHAT_TEMPLATE)

    def call_arguments(self, pipe, profile: dict, request: dict, sizing: dict) -> dict:
        # sizing goes unused: the pipeline sizes its condition images itself
        # Its guidance_scale is classifier-free guidance against an empty prompt, as true_cfg_scale is.
        return {"guidance_scale": request["true_cfg_scale"],
                "text_encoder_out_layers": text_encoder_layers(
                    pipe.text_encoder.config.num_hidden_layers)}


class Flux2KleinKVAdapter(Flux2KleinAdapter):
    """klein's components, tokenizer and text-encoder layers; a conditioning cache always kept
    with references (use_kv_cache = false is refused), freed by the pipeline before its decode
    (release_kv_before_decode is refused), and no guidance (a true_cfg_scale but 1.0 is
    refused). Its cache placed and counted as Qwen-Image-2.1's is."""

    pipelines = ("Flux2KleinKVPipeline",)
    keeps_conditioning_cache = True
    cache_optional = False
    frees_cache_before_decode = True
    takes_guidance = False

    def call_arguments(self, pipe, profile: dict, request: dict, sizing: dict) -> dict:
        return {"text_encoder_out_layers": text_encoder_layers(
            pipe.text_encoder.config.num_hidden_layers)}

    def recorder(self, pipe, kv_placement: str = "gpu") -> ReferenceKvRecorder:
        return ReferenceKvRecorder(kv_placement)


class ReferenceKvRecorder:
    """Counts the reference tokens' KV cache the transformer makes at step 0 (diffusers'
    transformer_flux2.Flux2KVCache, one per call): the module's class is replaced by a subclass
    that counts a cache as the pipeline clears it (before the decode), and keeps one not cleared
    (a failed request) until `take`. With a host placement, its layer caches keep K and V in
    host memory (kv_host.py). The cache holds reference tokens only: no prompt text among them."""

    NAMES = ("k_ref", "v_ref")  # Flux2KVLayerCache's K and V

    def __init__(self, kv_placement: str = "gpu"):
        import diffusers.models.transformers.transformer_flux2 as module

        # The module's own classes, kept on it the first time (as Qwen's recorder keeps its).
        base = vars(module).setdefault("_omniprobe_kv_cache", module.Flux2KVCache)
        layer_base = vars(module).setdefault("_omniprobe_kv_layer", module.Flux2KVLayerCache)
        memory = HOST_PLACEMENTS.get(kv_placement)
        layer = (host_placed(layer_base, pinned=memory.pinned, names=self.NAMES)
                 if memory is not None else None)
        self.made: list = []
        self.counted: list[dict] = []
        recorder = self

        class Recorded(base):
            def __init__(self, num_double_layers: int, num_single_layers: int):
                super().__init__(num_double_layers, num_single_layers)
                if layer is not None:
                    slabs = cache_slabs(memory, num_double_layers + num_single_layers)
                    self.double_block_caches = [layer(slabs) for _ in range(num_double_layers)]
                    self.single_block_caches = [layer(slabs) for _ in range(num_single_layers)]
                recorder.made.append(self)

            def clear(self):
                recorder.counted.append(recorder.figures(self))
                recorder.made.remove(self)
                super().clear()

        module.Flux2KVCache = Recorded

    def figures(self, cache) -> dict:
        figures = layer_figures([*cache.double_block_caches, *cache.single_block_caches],
                                self.NAMES)
        if figures["kv_cache_layers"]:
            figures |= {"prefix_tokens": cache.num_ref_tokens, "prompt_text_tokens": 0}
        return figures

    def take(self) -> dict:
        """The call's cache as counted when the pipeline cleared it, or as a failed request left
        it; empty when the call made none (no reference images). The caches are let go."""
        counted = self.counted + [self.figures(cache) for cache in self.made]
        self.counted, self.made[:] = [], []
        return counted[0] if counted else {}
