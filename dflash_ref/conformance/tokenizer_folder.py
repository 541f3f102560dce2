"""A real, minimal tokenizer folder beside a tiny bundle's target: a port whose loader insists on
`AutoTokenizer.from_pretrained(target_dir)` loads it as it would a released model's, no bypass needed.

One word-level vocabulary over the bundle's token texts (token i is `tokens[i]`, words split at whitespace),
written as the two files transformers reads (`tokenizer.json`, the `tokenizers` library's format, and
`tokenizer_config.json`) with the standard library's json alone: the kit's readers need numpy only. The mask
token and the stop tokens are special tokens; the prompts stay ids, so nothing in a bundle depends on
how text is split.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_tokenizer_folder(folder: Path, tokens: list[str], mask_token_id: int, eos_token_ids: list[int]) -> None:
    """tokenizer.json + tokenizer_config.json into `folder` (the target's): ids are positions in `tokens`."""
    if len(set(tokens)) != len(tokens) or any(not t or any(c.isspace() for c in t) for t in tokens):
        raise ValueError("a word-level vocabulary needs distinct token texts without whitespace")
    special = sorted({mask_token_id, *eos_token_ids})
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in special
        ],  # fmt: skip
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        # a text not in the vocabulary reads as the mask token: no prompt of a bundle is ever text
        "model": {
            "type": "WordLevel",
            "vocab": {t: i for i, t in enumerate(tokens)},
            "unk_token": tokens[mask_token_id],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "mask_token": tokens[mask_token_id],
        "unk_token": tokens[mask_token_id],
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    if eos_token_ids:
        config["eos_token"] = tokens[eos_token_ids[0]]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1, ensure_ascii=False) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")
