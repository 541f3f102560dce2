"""Reading a `config.json`'s fields: the typed checks every config uses (ConfigError naming the field),
and the RoPE settings: the two spellings, the keys each rope type reads, their defaults.

Released checkpoints write a top-level `rope_theta` and `rope_scaling: {type | rope_type, factor, …}`;
transformers 5 writes `rope_parameters: {rope_theta, rope_type, factor, …}`. Either is read into

    rope_theta   the base of θ_i = rope_theta^(−2i/d_h)          (10000 where no spelling gives one)
    scaling      None (plain RoPE), or one rope type's parameters, normalised:

    linear  {"rope_type": "linear", "factor": s}                                   s > 0
    yarn    {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L₀,
             "beta_fast": β_f, "beta_slow": β_s, "truncate": t}                   s ≥ 1, β_f ≥ β_s > 0
            + "mscale", "mscale_all_dim" (≥ 0), "attention_factor" (> 0), each only where given

with transformers' defaults filled in: β_f = 32, β_s = 1, t = true, L₀ = max_position_embeddings
(a top-level `original_max_position_embeddings` wins, as in transformers) and a null yarn factor
s = max_position_embeddings / L₀. An explicit factor is used as given, even where it differs from that
ratio (transformers only warns). Settings that mean the same thing so compare equal. The equations
that use them are in rope.py. Rope types other than these three, and unknown keys, are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A config field is missing, of the wrong type, out of range, or not supported."""


def int_field(d: dict, key: str, minimum: int = 1, default: Any = dataclasses.MISSING) -> int:
    if key not in d or d[key] is None:
        if default is dataclasses.MISSING:
            raise ConfigError(f"config field '{key}' is missing")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config field '{key}' must be an integer ≥ {minimum}, got {value!r}")
    return value


def float_field(d: dict, key: str, default: float) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"config field '{key}' must be a positive number, got {value!r}")
    return float(value)


def dict_field(d: dict, key: str) -> dict:
    value = d.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"config field '{key}' must be a JSON object, got {value!r}")
    return value


def bool_field(value, key: str, allow_none: bool = False) -> bool | None:
    if (value is None and allow_none) or isinstance(value, bool):
        return value
    raise ConfigError(f"config field '{key}' must be true or false, got {value!r}")


IMPLEMENTED = ("default", "linear", "yarn")
DEFAULT_THETA = 10000.0
_KEYS = {
    "linear": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "truncate",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
    ),
}
_READ_ELSEWHERE = ("type", "rope_type", "rope_theta")  # the type (either spelling) and the base


def _number(value, field: str, minimum: float, strict: bool = False) -> float:
    """value as a float, refused unless a number > minimum (strict) or ≥ minimum."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value > minimum if strict else value >= minimum)
    ):
        raise ConfigError(
            f"config field '{field}' must be a number {'>' if strict else '≥'} {minimum:g}, got {value!r}"
        )
    return float(value)


def _given(spec: dict, key: str, default):
    """spec[key], or the default where the key is absent or null."""
    return default if spec.get(key) is None else spec[key]


def rope_type(spec: dict, where: str) -> str:
    """The type a spec asks for ("type" is the older spelling of "rope_type"); unknown ones refused."""
    kinds = [spec[k] for k in ("rope_type", "type") if k in spec]
    if len(set(map(str, kinds))) > 1:
        raise ConfigError(f"config field '{where}' names two rope types: rope_type={kinds[0]!r}, type={kinds[1]!r}")
    kind = kinds[0] if kinds else "default"
    if kind not in IMPLEMENTED:
        raise ConfigError(
            f"config field '{where}' asks for rope type {kind!r}; implemented are 'default' "
            "(plain RoPE), 'linear' and 'yarn'"
        )
    return kind


def normalise_scaling(spec: dict | None, max_position_embeddings: int, where: str = "rope_scaling") -> dict | None:
    """A rope_scaling / rope_parameters object → None (plain) or the normalised parameters above.

    Normalised parameters come back unchanged, so this may run again on its own output."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"config field '{where}' must be a JSON object, got {spec!r}")
    kind = rope_type(spec, where)
    if kind == "default":  # its other keys change nothing (transformers ignores them too)
        return None
    unknown = sorted(set(spec) - set(_READ_ELSEWHERE) - set(_KEYS[kind]))
    if unknown:
        raise ConfigError(
            f"config field '{where}' has keys {unknown} that {kind} RoPE does not read "
            f"(it reads {', '.join(_KEYS[kind])})"
        )
    if "factor" not in spec:
        raise ConfigError(f"config field '{where}.factor' is missing ({kind} RoPE needs it)")
    if kind == "linear":
        return {"rope_type": "linear", "factor": _number(spec["factor"], f"{where}.factor", 0, strict=True)}

    original = _given(spec, "original_max_position_embeddings", max_position_embeddings)
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigError(
            f"config field '{where}.original_max_position_embeddings' must be an integer ≥ 1, got {original!r}"
        )
    out = {
        "rope_type": "yarn",
        "factor": _number(_given(spec, "factor", max_position_embeddings / original), f"{where}.factor", 1),
        "original_max_position_embeddings": original,
        "beta_fast": _number(_given(spec, "beta_fast", 32), f"{where}.beta_fast", 0, strict=True),
        "beta_slow": _number(_given(spec, "beta_slow", 1), f"{where}.beta_slow", 0, strict=True),
        "truncate": spec.get("truncate", True),
    }
    if out["beta_fast"] < out["beta_slow"]:
        raise ConfigError(
            f"config field '{where}.beta_fast' ({out['beta_fast']:g}) must be ≥ beta_slow ({out['beta_slow']:g})"
        )
    if not isinstance(out["truncate"], bool):
        raise ConfigError(f"config field '{where}.truncate' must be true or false, got {out['truncate']!r}")
    for key, strict in (("mscale", False), ("mscale_all_dim", False), ("attention_factor", True)):
        if spec.get(key) is not None:
            out[key] = _number(spec[key], f"{where}.{key}", 0, strict)
    return out


def _theta(spec: dict, d: dict, where: str) -> float:
    """The spec's own rope_theta, else the top-level one, else 10000."""
    if "rope_theta" in spec:
        return _number(spec["rope_theta"], f"{where}.rope_theta", 0, strict=True)
    return _number(d.get("rope_theta", DEFAULT_THETA), "rope_theta", 0, strict=True)


def read_rope(d: dict, max_position_embeddings: int) -> tuple[float, dict | None]:
    """A config.json → (rope_theta, normalised scaling), from whichever spelling it has.

    Where both `rope_scaling` and `rope_parameters` are given they must say the same (transformers
    would silently take `rope_scaling`)."""
    read = []
    for where in ("rope_scaling", "rope_parameters"):
        spec = d.get(where)
        if spec is None or spec == {}:
            continue
        if isinstance(spec, dict) and rope_type(spec, where) == "yarn" and d.get("original_max_position_embeddings"):
            top = d["original_max_position_embeddings"]  # transformers lets the top-level one win
            spec = {**spec, "original_max_position_embeddings": _given(spec, "original_max_position_embeddings", top)}
            if spec["original_max_position_embeddings"] != top:
                raise ConfigError(
                    f"config field '{where}.original_max_position_embeddings' "
                    f"({spec['original_max_position_embeddings']!r}) disagrees with the top-level "
                    f"original_max_position_embeddings ({top!r})"
                )
        scaling = normalise_scaling(spec, max_position_embeddings, where)
        read.append((where, _theta(spec, d, where), scaling))
    if not read:
        return _number(d.get("rope_theta", DEFAULT_THETA), "rope_theta", 0, strict=True), None
    if len(read) == 2 and read[0][1:] != read[1][1:]:
        (a, theta_a, scaling_a), (b, theta_b, scaling_b) = read
        raise ConfigError(
            f"config fields '{a}' and '{b}' disagree: rope_theta {theta_a:g} with {scaling_a} "
            f"against rope_theta {theta_b:g} with {scaling_b}; give one, or both alike"
        )
    return read[0][1], read[0][2]


def rope_fields(rope_theta: float, scaling: dict | None) -> dict:
    """The config.json fields for these settings, both spellings written alike:

    rope_theta, rope_parameters = {rope_theta, rope_type, …}, and rope_scaling = {rope_type, …} when
    scaled (plain RoPE writes no rope_scaling)."""
    out = {
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_theta": rope_theta, **(scaling or {"rope_type": "default"})},
    }
    if scaling is not None:
        out["rope_scaling"] = dict(scaling)
    return out
