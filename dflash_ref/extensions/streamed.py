"""y = x · Wᵀ, (N, d_in) × (d_out, d_in)ᵀ → (N, d_out) in fp32, by a product written here in C
(`streamed.c`) for decoding's few rows: W is read from memory once for all N rows, which torch's
kernels do not manage for N of 1 … 16 on the CPUs measured (extensions/linear_plan.py's docstring).

A decoding forward of a small model is bound by reading its weights: an AR step and a verify of b
tokens both read every weight once, so both could cost about the time that read takes. The C
product keeps, per thread, a tile of (≤ 4 rows of x) × (4–8 rows of W) sums in vector registers
while it walks d_in, so each row of W comes from memory once and then from the L1 cache; its sums
are F.linear's up to the order of the d_in terms (16 interleaved partial sums, then the lanes).

It is compiled at first use by the machine's C compiler (`$CC`, else `cc`: `-O3 -march=native
-fopenmp`), once per source and CPU, into `$DFLASH_REF_CACHE` (default `~/.cache/dflash_ref`), and
loaded with ctypes into the process that already holds torch's OpenMP runtime (libgomp.so.1), so
both share one thread pool; it runs on `torch.get_num_threads()` threads. Without a compiler it is
not built, and linear_plan measures the other kernels only (`status()` says why).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("streamed.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_why_not: list[str] = []                  # why the library could not be built, once tried


def cache_folder() -> Path:
    """Where the compiled library is kept: $DFLASH_REF_CACHE, else $XDG_CACHE_HOME/dflash_ref, else
    ~/.cache/dflash_ref."""
    if os.environ.get("DFLASH_REF_CACHE"):
        return Path(os.environ["DFLASH_REF_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash_ref"


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and instruction-set flags (Linux), else the platform."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags")}))
    except OSError:
        return platform.processor() or platform.machine()


def library_path(compiler: str) -> Path:
    """The library's file: named by a digest of the source, the flags, the compiler and the CPU."""
    digest = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(FLAGS), compiler, platform.machine(),
                                       _cpu_identity()]).encode()).hexdigest()[:16]
    return cache_folder() / f"streamed-{digest}.so"


def _compile(compiler: str, target: Path) -> None:
    """cc FLAGS -o target streamed.c, written under a temporary name and renamed (another process may be
    compiling the same file); CalledProcessError / OSError on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], check=True, capture_output=True,
                       text=True, timeout=300)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def compiler() -> str | None:
    """The C compiler: $CC, else cc, else gcc on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled product (built on first call), or None where it cannot be built (`status()`: why)."""
    cc = compiler()
    if cc is None:
        _why_not.append("no C compiler ($CC, cc or gcc) on the PATH")
        return None
    path = library_path(cc)
    try:
        if not path.is_file():
            _compile(cc, path)
        lib = ctypes.CDLL(str(path))
    except subprocess.CalledProcessError as e:
        _why_not.append(f"{cc} failed: {(e.stderr or '').strip()[-300:]}")
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        _why_not.append(f"{type(e).__name__}: {e}")
        return None
    lib.streamed_product.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.streamed_product.restype = None
    return lib


def available() -> bool:
    """Whether the C product can run here (it is compiled on the first call)."""
    return library() is not None


def status() -> str:
    """One line for the benchmarks' tables: the library in use, or why there is none."""
    if available():
        return f"C product {library_path(compiler()).name}"
    return f"no C product ({_why_not[-1] if _why_not else 'not built'})"


def streamed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (N, d_in) · weightᵀ (d_out, d_in) → (N, d_out), fp32 on the CPU, by the compiled product."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the C product is not available here: {status()}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"streamed_product takes x (N, d_in) and weight (d_out, d_in), got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not (x.is_cpu and weight.is_cpu):
        raise ValueError(f"streamed_product is for fp32 CPU tensors, got {x.dtype} on {x.device} and "
                         f"{weight.dtype} on {weight.device}")
    x, weight = x.contiguous(), weight.contiguous()                      # row-major, as the C code reads them
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)   # (N, d_out)
    lib.streamed_product(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.shape[0], weight.shape[0],
                         weight.shape[1], torch.get_num_threads())
    return y
