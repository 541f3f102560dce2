"""Configurations of the target (Qwen3) and of the DFlash draft, read from and written to the
official `config.json` format, with every field the code uses validated.

Draft `config.json` (z-lab/Qwen3-8B-DFlash-b16): Qwen3 fields, plus top-level `block_size` and
`num_target_layers`, plus `dflash_config: {mask_token_id, target_layer_ids}`. RoPE settings come in
two spellings: a top-level `rope_theta` (+ `rope_scaling`) in released checkpoints, and
`rope_parameters: {rope_theta, rope_type, …}` as transformers 5 writes them. Both are read, and
written, by config_fields.py: plain, linear and yarn RoPE; other rope types are refused.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .config_fields import (
    ConfigError,
    bool_field,
    dict_field,
    float_field,
    int_field,
    normalise_scaling,
    read_rope,
    rope_fields,
)
from .layer_sampling import build_target_layer_ids


def read_json(path: str | Path) -> dict:
    """A folder's config.json (or that file) as parsed JSON; a FileNotFoundError or a ConfigError naming it."""
    path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)  # a folder or its config.json
    if not path.is_file():
        raise FileNotFoundError(f"no config.json at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


@dataclass
class Qwen3Config:
    """The fields of a Qwen3 decoder stack that this project reads (target or draft)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None  # None: plain RoPE; else normalised (config_fields.py), e.g. yarn's
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    layer_types: list[str] | None = None  # "full_attention" | "sliding_attention" per layer (None: all full)
    sliding_window: int | None = None
    dtype: str | None = None  # dtype the checkpoint was saved in, informative

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self._validate_vocab()
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            int_field({name: getattr(self, name)}, name)
        self.rope_scaling = normalise_scaling(self.rope_scaling, self.max_position_embeddings)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for GQA"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        bool_field(self.tie_word_embeddings, "tie_word_embeddings")
        if not isinstance(self.dtype, (str, type(None))):
            raise ConfigError(f"config field 'dtype' must be a name such as \"bfloat16\", got {self.dtype!r}")
        if self.layer_types is None:  # one spelling for "all full attention": configs compare equal
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if not isinstance(self.layer_types, list):
            raise ConfigError(f"config field 'layer_types' must be a list, got {self.layer_types!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = [t for t in self.layer_types if t not in ("full_attention", "sliding_attention")]
        if bad:
            raise ConfigError(f"unknown layer_types {bad}")
        if self.sliding_window is not None:  # None on a sliding layer: causal, no window (official)
            int_field({"sliding_window": self.sliding_window}, "sliding_window")

    def _validate_vocab(self) -> None:
        int_field({"vocab_size": self.vocab_size}, "vocab_size")

    def layer_type(self, i: int) -> str:
        return self.layer_types[i]

    @classmethod
    def _fields_from_dict(cls, d: dict) -> dict:
        if not isinstance(d, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(d).__name__}")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act '{act}' is not supported (Qwen3 uses 'silu')")
        if d.get("attention_bias", False):
            raise ConfigError("attention_bias=true is not supported (Qwen3 has no attention biases)")
        hidden, heads = int_field(d, "hidden_size"), int_field(d, "num_attention_heads")
        layer_types = d.get("layer_types")
        if layer_types is None and d.get("use_sliding_window"):
            raise ConfigError("use_sliding_window without layer_types is not supported")
        rope_theta, rope_scaling = read_rope(d, int_field(d, "max_position_embeddings", default=40960))
        return dict(
            vocab_size=int_field(d, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=int_field(d, "intermediate_size"),
            num_hidden_layers=int_field(d, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=int_field(d, "num_key_value_heads", default=heads),
            head_dim=int_field(d, "head_dim", default=hidden // heads),
            rms_norm_eps=float_field(d, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int_field(d, "max_position_embeddings", default=40960),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            layer_types=list(layer_types) if isinstance(layer_types, (list, tuple)) else layer_types,
            # transformers' rule: the window counts only when use_sliding_window (default: yes)
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window", True) else None,
            dtype=d.get("dtype", d.get("torch_dtype")),
        )

    @classmethod
    def from_dict(cls, d: dict) -> Qwen3Config:
        return cls(**cls._fields_from_dict(d))

    @classmethod
    def from_json(cls, path: str | Path):
        return cls.from_dict(read_json(path))

    def to_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("rope_theta", "rope_scaling")}
        rope = rope_fields(self.rope_theta, self.rope_scaling)  # rope_theta, rope_parameters (+ rope_scaling)
        d.update(
            model_type="qwen3",
            hidden_act="silu",
            attention_bias=False,
            rope_theta=rope.pop("rope_theta"),
            use_sliding_window=self.sliding_window is not None,
            **rope,
        )
        return d

    def save(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")


@dataclass
class TargetConfig(Qwen3Config):
    """A Qwen3 causal LM used as the target (architectures: Qwen3ForCausalLM)."""

    def validate(self) -> None:
        super().validate()
        if self.layer_types and "sliding_attention" in self.layer_types:
            raise ConfigError("sliding-window layers in the target are not implemented")

    def to_dict(self) -> dict:
        return {"architectures": ["Qwen3ForCausalLM"], **super().to_dict()}


# what a sliding_attention layer's window means: the three readings found in DFlash implementations
WINDOW_KINDS = ("causal", "symmetric", "rotating")
# DFlash 2's fields (a DFlash2DraftModel needs all four), and the scales both versions read (their defaults)
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DRAFT_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")  # a draft folder's `architectures`: DFlash 1, 2
SCALES = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}


@dataclass
class DraftConfig(Qwen3Config):
    """The DFlash draft: Qwen3 fields + block_size, num_target_layers, mask_token_id, target_layer_ids;
    version 2 (architectures: DFlash2DraftModel) adds the convolution's and the selector's sizes.

    vocab_size and num_target_layers may be None where a draft's format does not record them (a Muse Glimmer
    assistant's: muse_glimmer.py): they are its target's, checked when the two are paired (compat.py), and a
    DFlash folder cannot be written without them."""

    block_size: int = 16
    num_target_layers: int | None = 36
    mask_token_id: int = 0
    target_layer_ids: list[int] = field(default_factory=list)  # empty: build_target_layer_ids
    is_causal: bool | None = None  # None: causal exactly on sliding-window layers (official rule)
    # diff with official: sliding_window_kind is this project's key (the official code reads is_causal alone); the
    # conformance kit's bundles declare with it the readings of a window that ports use (attention.py)
    sliding_window_kind: str | None = None  # None: "symmetric" when is_causal is false, else "causal"
    version: int = 1  # 1: DFlashDraftModel, 2: DFlash2DraftModel
    conv_kernel_size: int | None = None  # J, the convolution's taps        (DFlash 2)
    conv_group_size: int | None = None  # d / G, channels sharing a dynamic tap
    selector_rank: int | None = None  # r, the codebooks' rank
    selector_top_k: int | None = None  # M candidates per proposal position
    input_embedding_scale: float = 1.0  # the block's embedding × this
    output_multiplier: float = 1.0  # the draft logits × this, then tanh-capped if a softcap is set
    final_logit_softcapping: float | None = None

    def validate(self) -> None:
        super().validate()
        int_field({"block_size": self.block_size}, "block_size")
        depth = self.num_target_layers
        if depth is not None:
            int_field({"num_target_layers": depth}, "num_target_layers")
        bool_field(self.is_causal, "is_causal", allow_none=True)
        if not isinstance(self.target_layer_ids, list):
            raise ConfigError(f"config field 'target_layer_ids' must be a list of ids, got {self.target_layer_ids!r}")
        if not self.target_layer_ids and depth is None:
            raise ConfigError(
                "a draft that does not record its target's depth (num_target_layers) needs target_layer_ids"
            )
        if not self.target_layer_ids:
            ids = build_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
            if not all(0 <= i < self.num_target_layers for i in ids):
                raise ConfigError(
                    f"build_target_layer_ids({self.num_target_layers}, {self.num_hidden_layers}) "
                    f"gives {ids}, outside the target's layers 0..{self.num_target_layers - 1}: "
                    "set dflash_config.target_layer_ids explicitly"
                )
            self.target_layer_ids = ids
        for i in self.target_layer_ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < (depth if depth is not None else i + 1):
                raise ConfigError(
                    f"target_layer_ids {self.target_layer_ids}: each id must be an integer in "
                    + (f"0..{depth - 1} (num_target_layers={depth})" if depth is not None else "0, 1, …")
                )
        kind = self.sliding_window_kind
        if kind is not None and kind not in WINDOW_KINDS:
            raise ConfigError(f"dflash_config.sliding_window_kind {kind!r} is not one of {list(WINDOW_KINDS)}")
        if (kind, self.is_causal) in (("causal", False), ("symmetric", True)):
            raise ConfigError(f"dflash_config.sliding_window_kind {kind!r} contradicts is_causal={self.is_causal}")
        m, vocab = self.mask_token_id, self.vocab_size
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < (vocab if vocab is not None else m + 1):
            raise ConfigError(f"mask_token_id {m!r} is outside the vocabulary 0..{(vocab or 0) - 1}")
        self._validate_version()

    def _validate_vocab(self) -> None:
        if self.vocab_size is not None:  # None: the target's (a Muse Glimmer assistant records none)
            super()._validate_vocab()

    def _validate_version(self) -> None:
        given = [k for k in DFLASH2_FIELDS if getattr(self, k) is not None]
        if self.version not in (1, 2) or (self.version == 1 and given):
            raise ConfigError(
                f"a DFlash {self.version} draft cannot set {given or 'version'}: DFlash 2's fields "
                'need architectures ["DFlash2DraftModel"]'
            )
        for key in DFLASH2_FIELDS if self.version == 2 else ():
            int_field({f"dflash_config.{key}": getattr(self, key)}, f"dflash_config.{key}")
        if self.version == 2 and self.vocab_size is None:
            raise ConfigError("a DFlash 2 draft needs vocab_size: its selector's codebooks have a row per token")
        if self.version == 2 and self.hidden_size % self.conv_group_size:
            raise ConfigError(
                f"dflash_config.conv_group_size {self.conv_group_size} does not divide hidden_size {self.hidden_size}"
            )
        if self.version == 2 and self.selector_top_k > self.vocab_size:
            raise ConfigError(
                f"dflash_config.selector_top_k {self.selector_top_k} exceeds the vocabulary ({self.vocab_size})"
            )
        for key in SCALES:  # positive numbers (no softcap: None)
            if getattr(self, key) is not None:
                float_field({key: getattr(self, key)}, key, 1.0)

    @property
    def window_kind(self) -> str:
        """What a sliding_attention layer's window means (attention.position_rule): the explicit
        dflash_config.sliding_window_kind, else the official rule ("symmetric" iff is_causal is false)."""
        return self.sliding_window_kind or ("symmetric" if self.is_causal is False else "causal")

    @classmethod
    def from_dict(cls, d: dict) -> DraftConfig:
        fields = cls._fields_from_dict(d)
        dflash = dict_field(d, "dflash_config")

        def pick(key, default=dataclasses.MISSING):  # dflash_config wins over top level, as officially
            return dflash[key] if key in dflash else (d[key] if key in d else default)

        mask = pick("mask_token_id")
        if mask is dataclasses.MISSING:
            raise ConfigError("draft config has no dflash_config.mask_token_id")
        return cls(
            **fields,
            block_size=int_field({"block_size": pick("block_size", 16)}, "block_size"),
            num_target_layers=int_field(d, "num_target_layers"),
            mask_token_id=mask,
            target_layer_ids=pick("target_layer_ids", None) or [],
            is_causal=d.get("is_causal"),
            sliding_window_kind=pick("sliding_window_kind", None),
            version=2 if "DFlash2DraftModel" in (d.get("architectures") or []) else 1,
            **{k: pick(k, None) for k in DFLASH2_FIELDS},
            **{k: pick(k, v) for k, v in SCALES.items()},
        )

    def to_dict(self) -> dict:
        unsaid = [k for k in ("vocab_size", "num_target_layers") if getattr(self, k) is None]
        if unsaid:
            raise ConfigError(
                f"a DFlash folder records {' and '.join(unsaid)}, which this draft's format did not: set them "
                "(its target's) before writing it in the DFlash format"
            )
        d = {"architectures": ["DFlash2DraftModel" if self.version == 2 else "DFlashDraftModel"], **super().to_dict()}
        for key in (
            "mask_token_id",
            "target_layer_ids",
            "is_causal",
            "sliding_window_kind",
            "version",
            *DFLASH2_FIELDS,
            *SCALES,
        ):
            d.pop(key)
        if self.is_causal is not None:
            d["is_causal"] = self.is_causal
        d["dflash_config"] = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        if self.sliding_window_kind is not None:  # this project's key: the official code reads no such field
            d["dflash_config"]["sliding_window_kind"] = self.sliding_window_kind
        d["dflash_config"].update({k: getattr(self, k) for k in DFLASH2_FIELDS if self.version == 2})
        d["dflash_config"].update({k: getattr(self, k) for k, v in SCALES.items() if getattr(self, k) != v})
        return d
