"""The configuration of a Qwen3.5 / 3.6 hybrid target (Gated DeltaNet + gated attention), validated.

The fields are those of transformers' `Qwen3_5TextConfig` that the own hybrid target reads
(`target/qwen3_5.py`); `HybridConfig.from_hf(config)` takes them off a transformers config (or a
plain dict), so a transformers state dict loads into the own target unchanged; `from_json(folder)` reads
a folder's config.json. A multimodal config (Qwen3_5ForConditionalGeneration, as Qwen3.5 is released) is
read through its `text_config`, the text model's fields, with the top level's tie_word_embeddings and
dtype where the text_config lacks them.

    layer_types[l] ∈ {"linear_attention", "full_attention"}       one per layer
    full attention: H_q = num_attention_heads, H_kv = num_key_value_heads, d_h = head_dim,
                    RoPE on the first d_rot = int(d_h · partial_rotary_factor) channels
    Gated DeltaNet: H_k = linear_num_key_heads, H_v = linear_num_value_heads (a multiple of H_k),
                    d_k = linear_key_head_dim, d_v = linear_value_head_dim, conv kernel K = linear_conv_kernel_dim
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..config_fields import ConfigError

LAYER_TYPES = ("linear_attention", "full_attention")


def text_fields(config: dict) -> dict:
    """A config dict's text-model fields: the dict itself, or a multimodal config's text_config (the top
    level's tie_word_embeddings / dtype filled in where the text_config has none)."""
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise ConfigError(f"text_config must be a JSON object of the text model's fields, got {text!r}")
    inherited = {k: config[k] for k in ("tie_word_embeddings", "dtype", "torch_dtype") if k in config and k not in text}
    return {**inherited, **text}


@dataclass
class HybridConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: list[str] = field(default_factory=list)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    dtype: str | None = None  # dtype the checkpoint was saved in, informative

    def __post_init__(self) -> None:
        self.validate()

    @property
    def rotary_dim(self) -> int:
        """d_rot: how many channels of each attention head RoPE turns (the rest pass unchanged)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def validate(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"config field {name!r} must be an integer ≥ 1, got {value!r}")
        if not self.layer_types:  # transformers' default: every 4th layer full attention
            self.layer_types = [
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}"
            )
        unknown = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if unknown:
            raise ConfigError(
                f"unknown layer type(s) {unknown} in layer_types; this hybrid target implements {list(LAYER_TYPES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for GQA"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} × head_dim {self.head_dim} "
                f"= {self.rotary_dim} rotary channels: must be even and ≥ 2"
            )
        if not isinstance(self.dtype, (str, type(None))):
            raise ConfigError(f"config field 'dtype' must be a name such as \"bfloat16\", got {self.dtype!r}")
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not implemented (Qwen3.5 uses 'silu')")
        self.rms_norm_eps, self.rope_theta = float(self.rms_norm_eps), float(self.rope_theta)

    @classmethod
    def from_hf(cls, config) -> HybridConfig:
        """From a transformers Qwen3_5TextConfig or Qwen3_5Config (or their dicts); RoPE read from either
        spelling, rope types other than plain ("default") refused."""
        c = text_fields(config if isinstance(config, dict) else config.to_dict())
        rope = dict(c.get("rope_parameters") or {})
        legacy = c.get("rope_scaling") or {}
        kind = rope.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
        if kind != "default":
            raise ConfigError(f"rope type {kind!r} is not implemented by the hybrid target (plain RoPE only)")
        # text-only positions are the same in M-RoPE's three sections, so interleaved M-RoPE is plain RoPE
        fields = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "partial_rotary_factor"}
        kwargs = {k: c[k] for k in fields if c.get(k) is not None}
        kwargs["rope_theta"] = rope.get("rope_theta", c.get("rope_theta", 10_000.0))
        kwargs["partial_rotary_factor"] = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        kwargs["dtype"] = c.get("dtype", c.get("torch_dtype"))
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
            )
            if k not in kwargs
        ]
        if missing:
            raise ConfigError(f"the config lacks {missing}, needed by the hybrid target")
        kwargs["layer_types"] = list(kwargs.get("layer_types") or [])
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> HybridConfig:
        """A folder's config.json (or that file), text model or multimodal."""
        path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path} is not a JSON object")
        return cls.from_hf(d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
