"""Meta's Muse Glimmer assistant, the drafter of transformers' own DFlash (`generate(..., speculation_type=
"dflash")`, model type `muse_glimmer_assistant`), read as what it is: a DFlash 1 draft under other names, with
its own config keys and its own default attention.

    names     encoder.fc  ↔  fc            encoder.output_norm_enc  ↔  hidden_norm
              (layers.{i}.…, norm: the same; no embedding, no lm_head: the target's, as in DFlash)
    config    model_type muse_glimmer_assistant; block_size, mask_token_id and target_layer_ids at the top level;
              RoPE in rope_parameters; transformers' defaults for what a folder leaves out (DEFAULTS); no
              vocab_size and no num_target_layers: both are the target's (config.py takes None for them)
    windows   a sliding_attention layer (every layer, by default) attends bidirectionally within W:
                  |q − k| ≤ W                       (transformers' bidirectional sliding window: inclusive)
              which is DFlash's symmetric window of W + 1 (attention.position_rule: |q − k| < W + 1);
              a full_attention layer attends every key, non-causally, as DFlash 1

Everything else (C = RMSNorm(W_fc · concat h), KV injection with QNorm / KNorm, the sliced-Q RoPE, the pre-norm
SwiGLU layers, the final norm, the block [x_0, mask, …]) is DFlash 1's, so a Muse folder loads as a
DFlashDraftModel (drafts/checkpoint.py) and a DFlash 1 draft whose attention Muse can say is written as one.
"""

from __future__ import annotations

from .config import ConfigError, DraftConfig, read_json
from .config_fields import rope_fields

ARCHITECTURE, MODEL_TYPE = "MuseGlimmerAssistantModel", "muse_glimmer_assistant"
NAMES = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}  # Muse → DFlash
# transformers 5.15's MuseGlimmerAssistantConfig, for the keys a folder may leave out
DEFAULTS = {
    "hidden_size": 6656,
    "intermediate_size": 19968,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "sliding_window": 2048,
    "block_size": 16,
    "mask_token_id": 201818,
    "target_layer_ids": [1, 13, 25, 37, 49],
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}
SLIDING, FULL = "sliding_attention", "full_attention"


def dflash_name(name: str) -> str:
    """A Muse state-dict name → the DFlash draft's."""
    return NAMES.get(name, name)


def muse_name(name: str) -> str:
    """A DFlash draft's state-dict name → Muse's."""
    return {v: k for k, v in NAMES.items()}.get(name, name)


def is_muse(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in (config.get("architectures") or [])


def draft_config(config: dict, vocab_size: int | None = None, num_target_layers: int | None = None) -> DraftConfig:
    """A Muse config.json (its defaults filled in) → the DraftConfig of the same draft. `vocab_size` and
    `num_target_layers`: the target's, where known (a Muse folder records neither)."""
    if not isinstance(config, dict):
        raise ConfigError(f"a config must be a JSON object, got {type(config).__name__}")
    d = {**DEFAULTS, **config}
    layers = d["num_hidden_layers"]
    types = d.get("layer_types") or [SLIDING] * layers  # Muse's default: every layer windowed
    window = d["sliding_window"]
    if SLIDING in types and not (isinstance(window, int) and not isinstance(window, bool) and window >= 0):
        raise ConfigError(f"a Muse Glimmer assistant's sliding_window must be a whole number ≥ 0, got {window!r}")
    fields = DraftConfig._fields_from_dict(
        {**d, "vocab_size": vocab_size if vocab_size is not None else 1, "layer_types": types, "sliding_window": None}
    )
    fields["vocab_size"] = vocab_size  # read above only to pass the shared reader's check
    return DraftConfig(
        **fields | {"sliding_window": window + 1 if SLIDING in types else None},  # |q − k| ≤ W: DFlash's W + 1
        block_size=d["block_size"],
        num_target_layers=num_target_layers,
        mask_token_id=d["mask_token_id"],
        target_layer_ids=list(d["target_layer_ids"]),
        is_causal=False,
    )


def muse_config(config: DraftConfig) -> dict:
    """The Muse config.json of a DFlash 1 draft, or a ConfigError naming what Muse cannot say (a causal or a
    rotating window, DFlash 2, a scaled embedding or output)."""
    sliding = SLIDING in config.layer_types
    cannot = [
        *(["a DFlash 2 draft (convolutions, a selector)"] if config.version != 1 else []),
        *(["a causal sliding window"] if sliding and config.is_causal is not False else []),
        *(["a rotating window"] if sliding and config.window_kind == "rotating" else []),
        *(["a window of 0"] if sliding and config.sliding_window == 0 else []),
        *(
            [f"{k} {getattr(config, k)}"]
            for k, v in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None))
            if getattr(config, k) != v
        ),
    ]
    if sliding and config.sliding_window is None:
        cannot.append("a sliding layer without a window")
    if cannot:
        raise ConfigError(f"a Muse Glimmer assistant cannot say this draft's {', '.join(map(str, cannot))}")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": rope_fields(config.rope_theta, config.rope_scaling)["rope_parameters"],
        "layer_types": list(config.layer_types),
        "sliding_window": config.sliding_window - 1 if sliding else DEFAULTS["sliding_window"],  # DFlash W + 1 → W
        "block_size": config.block_size,
        "mask_token_id": config.mask_token_id,
        "target_layer_ids": list(config.target_layer_ids),
        **({"dtype": config.dtype} if config.dtype else {}),
    }


class MuseGlimmerConfig:
    """The reader drafts/checkpoint.py hands a Muse folder's config.json to: `from_json(folder)` → DraftConfig."""

    @staticmethod
    def from_json(folder) -> DraftConfig:
        return draft_config(read_json(folder))
