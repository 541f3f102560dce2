"""RoPE scaling (linear, yarn): read from both config spellings with transformers' defaults, validated
with field-naming errors, written back in both spellings, and equal to transformers' rotary
embeddings (the cos/sin tables at positions far past 4096, a whole Qwen3 target's logits, and a
draft against the official `dflash` package's)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch
from conftest import assert_close, draft_config, official_twins, randomize_, target_config

from dflash_ref import Qwen3Target
from dflash_ref.config import ConfigError, DraftConfig, TargetConfig
from dflash_ref.config_fields import normalise_scaling
from dflash_ref.dflash2 import make_draft
from dflash_ref.rope import RotaryEmbedding
from dflash_ref.rope_scaling import linear_inv_freq, plain_inv_freq, yarn_attention_factor, yarn_inv_freq

pytestmark = pytest.mark.usefixtures("one_thread_module")

TABLE_ATOL = 1e-6
# positions far beyond 4096 (and beyond every max_position_embeddings below): where a scaled RoPE matters
POSITIONS = torch.tensor(
    [
        [0, 1, 7, 100, 1000, 2047, 2048, 4095, 4096, 4097, 5000, 8191, 8192, 12345, 16383, 32768, 65535, 131071],
        [
            3,
            4096,
            4100,
            6000,
            9000,
            10_000,
            20_000,
            40_960,
            50_000,
            70_000,
            99_999,
            100_000,
            120_000,
            150_000,
            180_000,
            199_999,
            200_000,
            262_143,
        ],
    ]
)

SCALINGS = {  # id → the rope_scaling object as a config.json could hold it ("type" or "rope_type" added below)
    "linear-2": {"factor": 2.0, "kind": "linear"},
    "linear-0.5": {"factor": 0.5, "kind": "linear"},
    "linear-8-int": {"factor": 8, "kind": "linear"},
    "yarn-1": {"factor": 1.0, "kind": "yarn"},
    "yarn-4-defaults": {"factor": 4.0, "kind": "yarn"},
    "yarn-4-qwen": {"factor": 4.0, "original_max_position_embeddings": 2048, "kind": "yarn"},
    "yarn-8-betas": {
        "factor": 8,
        "original_max_position_embeddings": 1024,
        "beta_fast": 16,
        "beta_slow": 2,
        "kind": "yarn",
    },
    "yarn-40-no-truncate": {
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
        "kind": "yarn",
    },
    "yarn-16-mscale": {
        "factor": 16.0,
        "original_max_position_embeddings": 512,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "kind": "yarn",
    },
    "yarn-32-deepseek": {
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "kind": "yarn",
    },
    "yarn-4-mscale-alone": {"factor": 4.0, "original_max_position_embeddings": 2048, "mscale": 0.5, "kind": "yarn"},
    "yarn-2-attention-factor": {
        "factor": 2.0,
        "original_max_position_embeddings": 4096,
        "attention_factor": 0.8,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "kind": "yarn",
    },
    "yarn-null-factor": {"factor": None, "original_max_position_embeddings": 2048, "kind": "yarn"},
}
SPELLINGS = ["rope_scaling+type", "rope_scaling+rope_type", "rope_parameters", "both"]
SHAPES = [(16, 10000.0), (64, 500000.0), (128, 1e6)]  # (head_dim, rope_theta)


def qwen3_dict(
    spec: dict | None,
    spelling: str = "rope_scaling+type",
    head_dim: int = 16,
    rope_theta: float = 10000.0,
    max_position_embeddings: int = 8192,
    **extra,
) -> dict:
    """A Qwen3 config.json with `spec` in the given spelling."""
    d = dict(
        vocab_size=12,
        hidden_size=4 * head_dim,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        **extra,
    )
    spec = copy.deepcopy(spec or {})
    kind = spec.pop("kind", "default")
    legacy = {"type": kind, **spec} if spelling == "rope_scaling+type" else {"rope_type": kind, **spec}
    if spelling.startswith("rope_scaling"):
        d.update(rope_theta=rope_theta, rope_scaling=legacy)
    elif spelling == "rope_parameters":  # as transformers 5 writes it: the base inside, nothing at the top
        d.update(rope_parameters={"rope_theta": rope_theta, "rope_type": kind, **spec})
    else:
        d.update(rope_theta=rope_theta, rope_scaling=legacy, rope_parameters={"rope_theta": rope_theta, **legacy})
    return d


def hf_tables(d: dict, positions: torch.Tensor):
    """transformers' Qwen3RotaryEmbedding built from the config.json `d` → (cos, sin, attention_scaling)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    hf = Qwen3RotaryEmbedding(transformers.Qwen3Config(**copy.deepcopy(d)))  # it edits the dicts it is given
    cos, sin = hf(torch.zeros(1), positions)
    return cos, sin, hf.attention_scaling


def our_tables(config, positions: torch.Tensor, dtype=torch.float32):
    rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
    return (*rope(positions, dtype), rope.attention_scaling)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# --------------------------------------------------------------------------- tables vs transformers


@pytest.mark.parametrize("head_dim,theta", SHAPES)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("name", list(SCALINGS))
def test_tables_match_transformers(name, spelling, head_dim, theta):
    d = qwen3_dict(SCALINGS[name], spelling, head_dim, theta)
    config = TargetConfig.from_dict(copy.deepcopy(d))
    assert config.rope_scaling["rope_type"] == SCALINGS[name]["kind"] and config.rope_theta == theta
    cos, sin, m = our_tables(config, POSITIONS)
    cos_hf, sin_hf, m_hf = hf_tables(d, POSITIONS)
    assert m == m_hf
    assert max_diff(cos, cos_hf) <= TABLE_ATOL and max_diff(sin, sin_hf) <= TABLE_ATOL
    # transformers reads our to_dict (both spellings written) the same way
    cos_2, sin_2, m_2 = hf_tables(config.to_dict(), POSITIONS)
    assert m_2 == m and max_diff(cos, cos_2) <= TABLE_ATOL and max_diff(sin, sin_2) <= TABLE_ATOL


def test_tables_in_bfloat16_are_the_float32_ones_rounded():
    config = TargetConfig.from_dict(qwen3_dict(SCALINGS["yarn-4-qwen"]))
    cos32, sin32, _ = our_tables(config, POSITIONS)
    cos16, sin16, _ = our_tables(config, POSITIONS, torch.bfloat16)
    assert cos16.dtype == torch.bfloat16 and torch.equal(cos16, cos32.to(torch.bfloat16))
    assert torch.equal(sin16, sin32.to(torch.bfloat16))


def test_a_top_level_original_max_position_embeddings_wins_as_in_transformers():
    d = qwen3_dict(SCALINGS["yarn-4-defaults"], original_max_position_embeddings=1024)
    config = TargetConfig.from_dict(copy.deepcopy(d))
    assert config.rope_scaling["original_max_position_embeddings"] == 1024
    cos, sin, _ = our_tables(config, POSITIONS)
    cos_hf, sin_hf, _ = hf_tables(d, POSITIONS)
    assert max_diff(cos, cos_hf) <= TABLE_ATOL and max_diff(sin, sin_hf) <= TABLE_ATOL
    # the same number inside and at the top is fine; different numbers are refused (below)
    d = qwen3_dict(SCALINGS["yarn-4-qwen"], original_max_position_embeddings=2048)
    assert (
        TargetConfig.from_dict(d).rope_scaling
        == TargetConfig.from_dict(qwen3_dict(SCALINGS["yarn-4-qwen"])).rope_scaling
    )


# --------------------------------------------------------------------------- the equations, by hand


def test_linear_divides_every_frequency():
    assert torch.equal(linear_inv_freq(16, 1e4, 4.0), plain_inv_freq(16, 1e4) / 4.0)
    rope = RotaryEmbedding(16, 1e4, {"rope_type": "linear", "factor": 4.0})
    plain = RotaryEmbedding(16, 1e4)
    # position p under linear scaling s is plain RoPE at p / s
    for a, b in zip(
        rope(torch.tensor([[0, 4, 400]]), torch.float64), plain(torch.tensor([[0, 1, 100]]), torch.float64)
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert rope.attention_scaling == 1.0


def test_yarn_keeps_fast_dimensions_and_squeezes_slow_ones():
    p = normalise_scaling({"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048}, 16384)
    theta, squeezed, yarn = plain_inv_freq(64, 1e4), plain_inv_freq(64, 1e4) / 8.0, yarn_inv_freq(64, 1e4, p)
    # boundaries: i = d_h · ln(L₀ / (2π β)) / (2 ln base) for β = 32 (floored) and β = 1 (ceiled)
    lo = math.floor(64 * math.log(2048 / (32 * 2 * math.pi)) / (2 * math.log(1e4)))
    hi = math.ceil(64 * math.log(2048 / (1 * 2 * math.pi)) / (2 * math.log(1e4)))
    assert (lo, hi) == (8, 21)
    torch.testing.assert_close(yarn[: lo + 1], theta[: lo + 1], rtol=1e-6, atol=0)  # extrapolated: kept
    torch.testing.assert_close(yarn[hi:], squeezed[hi:], rtol=1e-6, atol=0)  # interpolated: θ / s
    middle = (yarn[lo + 1 : hi] - squeezed[lo + 1 : hi]) / (theta[lo + 1 : hi] - squeezed[lo + 1 : hi])
    ramp = (torch.arange(lo + 1, hi) - lo) / (hi - lo)
    torch.testing.assert_close(middle, 1 - ramp, rtol=0, atol=1e-4)  # a linear blend between
    # factor 1: plain RoPE, m = 1
    one = normalise_scaling({"type": "yarn", "factor": 1}, 4096)
    torch.testing.assert_close(yarn_inv_freq(64, 1e4, one), plain_inv_freq(64, 1e4), rtol=1e-6, atol=0)
    assert yarn_attention_factor(one) == 1.0


def test_yarn_attention_factor_rules():
    p = normalise_scaling({"type": "yarn", "factor": 4.0}, 4096)
    assert yarn_attention_factor(p) == pytest.approx(0.1 * math.log(4.0) + 1)
    assert yarn_attention_factor({**p, "attention_factor": 1.5, "mscale": 1.0, "mscale_all_dim": 2.0}) == 1.5
    mscale = {**p, "mscale": 0.707, "mscale_all_dim": 1.0}
    assert yarn_attention_factor(mscale) == pytest.approx((0.0707 * math.log(4) + 1) / (0.1 * math.log(4) + 1))
    assert yarn_attention_factor({**p, "mscale": 0.707}) == yarn_attention_factor(p)  # needs both
    assert yarn_attention_factor({**p, "mscale": 0.0, "mscale_all_dim": 1.0}) == yarn_attention_factor(p)
    # m multiplies both tables: cos² + sin² = m²
    rope = RotaryEmbedding(8, 1e4, p)
    cos, sin = rope(torch.arange(50)[None], torch.float64)
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, rope.attention_scaling**2), rtol=1e-6, atol=1e-6)
    assert "rope_type=yarn, factor=4.0" in repr(rope) and list(rope.state_dict()) == []


def test_rotary_embedding_refuses_unnormalised_or_unknown_scaling():
    with pytest.raises(ValueError, match="pass it through config_fields.normalise_scaling"):
        RotaryEmbedding(8, 1e4, {"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="rope type 'dynamic' is not implemented"):
        RotaryEmbedding(8, 1e4, {"rope_type": "dynamic", "factor": 4.0})
    assert RotaryEmbedding(8, 1e4, None).rope_type == "default"


# --------------------------------------------------------------------------- reading, normalising, writing


def test_defaults_are_filled_in_and_spellings_compare_equal():
    expected = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
    }
    configs = [TargetConfig.from_dict(qwen3_dict(SCALINGS["yarn-4-defaults"], spelling)) for spelling in SPELLINGS]
    configs.append(TargetConfig.from_dict(qwen3_dict({**expected, "kind": "yarn", "beta_fast": None})))
    for c in configs:
        assert c.rope_scaling == expected and c == configs[0]
    direct = target_config(max_position_embeddings=8192, rope_scaling={"type": "yarn", "factor": 4})
    assert direct.rope_scaling == expected
    # a null factor is max_position_embeddings / original_max_position_embeddings
    assert TargetConfig.from_dict(qwen3_dict(SCALINGS["yarn-null-factor"])).rope_scaling["factor"] == 4.0
    assert TargetConfig.from_dict(qwen3_dict(SCALINGS["linear-8-int"])).rope_scaling == {
        "rope_type": "linear",
        "factor": 8.0,
    }
    # optional keys only where given
    assert TargetConfig.from_dict(qwen3_dict(SCALINGS["yarn-16-mscale"])).rope_scaling == {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 512,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    }


@pytest.mark.parametrize("spec", [None, {"type": "default"}, {"rope_type": "default", "factor": 2.0}])
def test_plain_rope_is_unchanged(spec):
    d = qwen3_dict(None, "rope_scaling+type")
    d["rope_scaling"] = spec
    config = TargetConfig.from_dict(d)
    assert config.rope_scaling is None and config == TargetConfig.from_dict({**d, "rope_scaling": None})
    out = config.to_dict()
    assert "rope_scaling" not in out  # what plain configs wrote before scaling existed
    assert out["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    # plain via rope_parameters: the same config
    assert TargetConfig.from_dict(qwen3_dict(None, "rope_parameters")) == config


@pytest.mark.parametrize("name", list(SCALINGS))
def test_round_trip(name, tmp_path):
    target = TargetConfig.from_dict(qwen3_dict(SCALINGS[name], head_dim=8))
    draft = draft_config(
        target,
        rope_scaling=target.rope_scaling,
        rope_theta=target.rope_theta,
        max_position_embeddings=target.max_position_embeddings,
        target_layer_ids=[0],
    )
    for config in (target, draft):
        d = config.to_dict()
        assert d["rope_theta"] == config.rope_theta
        assert d["rope_scaling"] == config.rope_scaling and d["rope_scaling"] is not config.rope_scaling
        assert d["rope_parameters"] == {"rope_theta": config.rope_theta, **config.rope_scaling}
        again = type(config).from_dict(json.loads(json.dumps(d)))
        assert again == config and again.to_dict() == d
        for spelling in ("rope_scaling", "rope_parameters"):  # each spelling alone says it all
            alone = {k: v for k, v in d.items() if k != spelling}
            assert type(config).from_dict(copy.deepcopy(alone)) == config
    config.save(tmp_path)
    assert DraftConfig.from_json(tmp_path) == draft


def test_validate_normalises_a_directly_given_scaling_and_is_idempotent():
    c = target_config(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 2})
    assert c.rope_scaling["original_max_position_embeddings"] == 4096
    before = dict(c.rope_scaling)
    c.validate()
    assert c.rope_scaling == before
    with pytest.raises(ConfigError, match="'rope_scaling.factor' must be a number ≥ 1"):
        target_config(rope_scaling={"rope_type": "yarn", "factor": 0.5})
    with pytest.raises(ConfigError, match="'rope_scaling' must be a JSON object"):
        draft_config(rope_scaling="yarn")


YARN = {"type": "yarn", "factor": 4.0}
BAD = [  # (changes to a plain Qwen3 config.json, the message)
    (dict(rope_scaling={"type": "yarn"}), r"'rope_scaling\.factor' is missing"),
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), r"'rope_parameters\.factor' is missing"),
    (dict(rope_scaling={"type": "linear", "factor": 0}), r"'rope_scaling\.factor' must be a number > 0, got 0"),
    (dict(rope_scaling={"type": "linear", "factor": -2.0}), r"'rope_scaling\.factor' must be a number > 0"),
    (dict(rope_scaling={"type": "linear", "factor": "2"}), r"'rope_scaling\.factor' must be a number > 0"),
    (dict(rope_scaling={"type": "linear", "factor": True}), r"'rope_scaling\.factor' must be a number > 0"),
    (dict(rope_scaling={"type": "linear", "factor": None}), r"'rope_scaling\.factor' must be a number > 0"),
    (dict(rope_scaling={"type": "yarn", "factor": 0.5}), r"'rope_scaling\.factor' must be a number ≥ 1, got 0\.5"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": "4"}), r"'rope_parameters\.factor' must be a number ≥ 1"),
    (
        dict(rope_scaling={"type": "yarn", "factor": None, "original_max_position_embeddings": 16384}),
        r"'rope_scaling\.factor' must be a number ≥ 1, got 0\.5",
    ),  # max_position_embeddings 8192 / 16384
    (
        dict(rope_scaling={**YARN, "low_freq_factor": 1.0}),
        r"'rope_scaling' has keys \['low_freq_factor'\] that "
        "yarn RoPE does not read",
    ),
    (dict(rope_scaling={**YARN, "partial_rotary_factor": 0.5}), r"has keys \['partial_rotary_factor'\]"),
    (
        dict(rope_scaling={"type": "linear", "factor": 2.0, "original_max_position_embeddings": 2048}),
        r"'rope_scaling' has keys \['original_max_position_embeddings'\] that linear RoPE does not read",
    ),
    (dict(rope_scaling={**YARN, "beta_fast": 0}), r"'rope_scaling\.beta_fast' must be a number > 0"),
    (dict(rope_scaling={**YARN, "beta_slow": -1}), r"'rope_scaling\.beta_slow' must be a number > 0"),
    (dict(rope_scaling={**YARN, "beta_fast": "32"}), r"'rope_scaling\.beta_fast' must be a number"),
    (
        dict(rope_scaling={**YARN, "beta_fast": 1, "beta_slow": 2}),
        r"'rope_scaling\.beta_fast' \(1\) must be ≥ "
        r"beta_slow \(2\)",
    ),
    (dict(rope_scaling={**YARN, "mscale": -1}), r"'rope_scaling\.mscale' must be a number ≥ 0"),
    (dict(rope_scaling={**YARN, "mscale_all_dim": "1"}), r"'rope_scaling\.mscale_all_dim' must be a number ≥ 0"),
    (dict(rope_scaling={**YARN, "attention_factor": 0}), r"'rope_scaling\.attention_factor' must be a number > 0"),
    (dict(rope_scaling={**YARN, "truncate": "yes"}), r"'rope_scaling\.truncate' must be true or false"),
    (dict(rope_scaling={**YARN, "truncate": None}), r"'rope_scaling\.truncate' must be true or false"),
    (
        dict(rope_scaling={**YARN, "original_max_position_embeddings": 0}),
        r"'rope_scaling\.original_max_position_embeddings' must be an integer ≥ 1",
    ),
    (
        dict(rope_scaling={**YARN, "original_max_position_embeddings": 2048.0}),
        r"'rope_scaling\.original_max_position_embeddings' must be an integer ≥ 1",
    ),
    (
        dict(rope_scaling={"type": "dynamic", "factor": 2.0}),
        r"'rope_scaling' asks for rope type 'dynamic'; "
        r"implemented are 'default' \(plain RoPE\), 'linear' and 'yarn'",
    ),
    (
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_theta": 5e5,
            }
        ),
        r"'rope_parameters' asks for rope type 'llama3'",
    ),
    (
        dict(rope_scaling={"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}),
        r"'rope_scaling' asks for rope type 'longrope'",
    ),
    (
        dict(rope_scaling={"type": "yarn", "rope_type": "linear", "factor": 2.0}),
        r"'rope_scaling' names two rope types: rope_type='linear', type='yarn'",
    ),
    (
        dict(rope_scaling=YARN, rope_parameters={"rope_type": "yarn", "factor": 8.0}),
        r"'rope_scaling' and 'rope_parameters' disagree",
    ),
    (
        dict(rope_scaling=YARN, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}),
        r"'rope_scaling' and 'rope_parameters' disagree: rope_theta 10000 .* against rope_theta 1e\+06",
    ),
    (
        dict(rope_scaling=YARN, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        r"'rope_scaling' and 'rope_parameters' disagree",
    ),
    (
        dict(rope_scaling={**YARN, "original_max_position_embeddings": 2048}, original_max_position_embeddings=4096),
        r"'rope_scaling\.original_max_position_embeddings' \(2048\) disagrees with the top-level",
    ),
    (dict(rope_parameters="yarn"), r"'rope_parameters' must be a JSON object"),
    (dict(rope_scaling=[4.0]), r"'rope_scaling' must be a JSON object"),
    (
        dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": "1e6"}),
        r"'rope_parameters\.rope_theta' must be a number > 0",
    ),
]


@pytest.mark.parametrize("changes,match", BAD)
def test_bad_rope_settings_are_refused_naming_the_field(changes, match):
    d = {**qwen3_dict(None, "rope_scaling+type"), "rope_scaling": None, **copy.deepcopy(changes)}
    with pytest.raises(ConfigError, match=match):
        TargetConfig.from_dict(copy.deepcopy(d))
    draft = {**d, "num_target_layers": 2, "dflash_config": {"mask_token_id": 1}}
    with pytest.raises(ConfigError, match=match):
        DraftConfig.from_dict(draft)


# --------------------------------------------------------------------------- whole models

MODEL_MAX_POSITIONS = 65536
MODEL_SCALINGS = [
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    {
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 512,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "truncate": False,
    },
    {"type": "linear", "factor": 4.0},
]


def scaled_target(spec: dict, seed: int = 0, rope_theta: float = 10000.0, tie: bool = False) -> Qwen3Target:
    config = target_config(
        head_dim=16,
        num_hidden_layers=3,
        max_position_embeddings=MODEL_MAX_POSITIONS,
        rope_theta=rope_theta,
        tie_word_embeddings=tie,
        rope_scaling=dict(spec),
    )
    return randomize_(Qwen3Target(config), seed)


@pytest.mark.parametrize("seed", range(len(MODEL_SCALINGS)))
def test_scaled_target_matches_transformers(seed):
    transformers = pytest.importorskip("transformers")
    target = scaled_target(MODEL_SCALINGS[seed], seed, rope_theta=(10000.0, 1e6)[seed % 2], tie=bool(seed % 2))
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**target.config.to_dict())).eval()
    hf.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.config.vocab_size, (2, 9), generator=g)
    with torch.no_grad():
        for start in (0, 4090, 6000, 30_000):  # through and far past 4096
            pos = (start + torch.arange(9))[None].expand(2, -1)
            ours, theirs = (
                target(ids, pos, output_hidden_states=True),
                hf(ids, position_ids=pos, output_hidden_states=True),
            )
            assert_close(ours.logits, theirs.logits)
            for a, b in zip(ours.hidden_states, theirs.hidden_states):
                assert_close(a, b)
        # with a KV cache: prefill, then one token
        cache, hf_cache = target.make_cache(), transformers.DynamicCache(config=hf.config)
        assert_close(
            target(ids, past_key_values=cache).logits, hf(ids, past_key_values=hf_cache, use_cache=True).logits
        )
        new = ids[:, :1]
        assert_close(
            target(new, past_key_values=cache).logits, hf(new, past_key_values=hf_cache, use_cache=True).logits
        )
        # not vacuous: the scaling changes the logits
        plain = randomize_(Qwen3Target(dataclasses.replace(target.config, rope_scaling=None)), seed)
        pos = (6000 + torch.arange(9))[None].expand(2, -1)
        assert (plain(ids, pos).logits - target(ids, pos).logits).abs().max() > 1e-3


@pytest.mark.parametrize("seed", range(len(MODEL_SCALINGS)))
def test_scaled_draft_matches_official(seed):
    pytest.importorskip("dflash.model")
    spec = MODEL_SCALINGS[seed]
    target = scaled_target(spec, seed)
    dc = draft_config(
        target.config,
        head_dim=16,
        rope_scaling=dict(spec),
        rope_theta=target.config.rope_theta,
        max_position_embeddings=target.config.max_position_embeddings,
        target_layer_ids=[0, 2],
        block_size=4,
    )
    assert dc.rope_scaling == target.config.rope_scaling
    draft = randomize_(make_draft(dc), seed + 10_000)
    _, off_draft = official_twins(target, draft)
    g = torch.Generator().manual_seed(seed)
    batch, ctx_len = 2, 5
    for start in (0, 5000, 50_000):
        inputs = dict(
            position_ids=(start + torch.arange(ctx_len + dc.block_size))[None].expand(batch, -1),
            noise_embedding=torch.randn(batch, dc.block_size, dc.hidden_size, generator=g),
            target_hidden=torch.randn(batch, ctx_len, 2 * dc.hidden_size, generator=g),
        )
        with torch.no_grad():
            assert_close(draft(**inputs), off_draft(**inputs))
    assert off_draft.rotary_emb.attention_scaling == draft.rotary_emb.attention_scaling
