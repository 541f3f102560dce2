"""`train --distill-dtype auto` and `--train-dtype auto` (the defaults): bf16 where this CPU multiplies bf16
natively, else fp32. The recipe's bf16 (a bf16 copy of the target writes the responses; the draft's forward
under bf16 autocast) is faster than fp32 on a CPU with bf16 instructions (AMX, AVX-512 BF16); on one without
them torch emulates the bf16 products, several times slower than fp32. `auto` is resolved when a run starts
and saved as what it chose, so that a resumed run keeps it (training/options.py). No torch here.
"""

from __future__ import annotations

from pathlib import Path

DTYPE_OPTIONS = ("distill_dtype", "train_dtype")
# x86: AVX-512 BF16 and AMX-BF16 (/proc/cpuinfo's flags); Arm: FEAT_BF16 (its Features)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU lists a bf16 product instruction; False where /proc/cpuinfo cannot tell (fp32 is
    always exact enough, and never the slow emulation)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool(NATIVE_BF16_FLAGS & set(value.split()))
    return False


def choose_dtypes(options: dict) -> dict:
    """`auto` in the dtype options → bf16 or fp32 for this CPU (`native_bf16`); the other values as given."""
    chosen = "bf16" if any(options.get(k) == "auto" for k in DTYPE_OPTIONS) and native_bf16() else "fp32"
    return {**options, **{k: chosen for k in DTYPE_OPTIONS if options.get(k) == "auto"}}
