"""FLUX.2 [klein] (`Flux2KleinPipeline`): a Qwen3 text encoder over a synthetic tokenizer with
Qwen3's special tokens at their real ids, and the call's guidance and text-encoder layers. It
takes reference images as a list (`image=`) and keeps no cache between its steps to record."""

from __future__ import annotations

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
            raise ValueError(f"component {name!r} ({class_name}): Flux2KleinPipeline's adapter "
                             "makes only its tokenizer")
        return synthetic_tokenizer(SPECIAL_TOKENS, pad="<|endoftext|>", eos="<|im_end|>",
                                   chat_template=_CHAT_TEMPLATE)

    def call_arguments(self, pipe, profile: dict, request: dict, sizing: dict) -> dict:
        # sizing goes unused: the pipeline sizes its condition images itself
        # Its guidance_scale is classifier-free guidance against an empty prompt, as true_cfg_scale is.
        return {"guidance_scale": request["true_cfg_scale"],
                "text_encoder_out_layers": text_encoder_layers(
                    pipe.text_encoder.config.num_hidden_layers)}
