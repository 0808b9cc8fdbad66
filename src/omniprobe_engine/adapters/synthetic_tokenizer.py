"""A tokenizer with no downloaded vocabulary: word-level, the family's special tokens at their
real ids and ordinary words below them, so the text encoder's embedding sees ids of the real
range. Token counts are a synthetic tokenizer's, not the real one's."""

from __future__ import annotations


def synthetic_tokenizer(special_tokens: dict[str, int], *, pad: str, eos: str,
                        unknown_id: int | None = None, chat_template: str | None = None):
    """`PreTrainedTokenizerFast` over ids 0..min(special ids)-1 ("w<i>") plus `special_tokens`,
    its unknown token at `unknown_id` (default: just above the highest special id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(min(special_tokens.values()))}
    vocab.update(special_tokens)
    vocab["<unk>"] = max(special_tokens.values()) + 1 if unknown_id is None else unknown_id
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token=pad,
                                        eos_token=eos)
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
