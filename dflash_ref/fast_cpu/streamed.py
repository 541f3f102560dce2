"""y = x · Wᵀ, (N, d_in) × (d_out, d_in)ᵀ → (N, d_out) in fp32, by a product written here in C
(`streamed.c`) for decoding's few rows: W is read from memory once for all N rows, which torch's
kernels do not manage beyond one or two rows on some CPUs (`bench steps`: figures/bench/bench.md).

A decoding forward of a small model is bound by reading its weights: an AR step and a verify of b
tokens both read every weight once, so both could cost about the time that read takes. The C
product splits W's rows among the threads; each thread walks its rows 8 at a time and keeps a tile
of (2 rows of x) × (8 rows of W) sums in 16-lane vector registers (one lane set per row of x and W)
while it walks d_in; the next 2 rows of x read the same 8 rows of W again from the cache (L1 while
8 rows of W fit, d_in ≲ 1500), not from memory. (Built for a CPU without AVX-512, whose registers
would not hold that tile, a tile is 1 row of x × 8 rows of W in 8-lane vectors.) While it sums, it
prefetches its next 8 rows of W into L2, so that the memory is not idle while the core works (at 4
rows of x this made the product about as fast as at one). Its sums are F.linear's up to the order of
the d_in terms (16 or 8 interleaved partial sums, then a tree over the lanes), and a row's sums are
the same for any number of rows.

It is compiled at first use by the machine's C compiler (`$CC`, else `cc`, else `gcc`: `-O3
-march=native -fopenmp`), once per source and CPU, into `$DFLASH_REF_CACHE` (default
`~/.cache/dflash_ref`), and loaded with ctypes into the process that already holds torch's OpenMP
runtime (libgomp.so.1), so both share one thread pool; it runs on `torch.get_num_threads()` threads.
Where it cannot be built or loaded (no compiler, a compiler without GCC's vector extensions or
OpenMP, a second OpenMP runtime) plan.py measures the other kernels only; `status()` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from ..extensions import cache_folder

SOURCE = Path(__file__).with_name("streamed.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
MAX_SIZE = 2**31 - 64  # the C code's sizes are ints
CPU_FIELDS = ("model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part")
_why_not: list[str] = []  # why the library could not be built or loaded, once tried
_building = threading.Lock()  # one thread compiles; the others wait for its library


def compiler() -> list[str] | None:
    """The C compiler's command: $CC (split as a shell would: "ccache gcc"), else cc, else gcc on the PATH."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and instruction-set fields of /proc/cpuinfo (x86's
    model name and flags, Arm's implementer, part and features), else the platform's names."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    return "\n".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in CPU_FIELDS}))


def cpus_at_hand() -> int:
    """The CPUs this process may run on (its affinity, not os.cpu_count(): a container counts its host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def library_path(cc: list[str]) -> Path:
    """The library's file: named by a digest of the source, the flags, the compiler and the CPU."""
    digest = hashlib.sha256(
        "\n".join([SOURCE.read_text(), " ".join(FLAGS), " ".join(cc), platform.machine(), cpu_identity()]).encode()
    ).hexdigest()[:16]
    return cache_folder() / f"streamed-{digest}.so"


def _compile(cc: list[str], target: Path) -> None:
    """cc FLAGS -o target streamed.c, written under a temporary name in the same folder and renamed (another
    process may be compiling the same file); CalledProcessError / OSError / TimeoutExpired on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(handle)
    try:
        subprocess.run(
            [*cc, *FLAGS, "-o", partial, str(SOURCE)], check=True, capture_output=True, text=True, timeout=300
        )
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    names = ("libgomp", "libomp", "libiomp")
    return {line.split()[-1] for line in maps.splitlines() if any(n in line.rsplit("/", 1)[-1] for n in names)}


def _load(path: Path) -> ctypes.CDLL:
    """The library at `path`, its one function typed; OSError if it brought a second OpenMP runtime.

    Only a runtime that loading it adds is refused: other packages may already hold privately renamed
    copies of libgomp (sentencepiece's wheel ships libgomp-<hash>.so), which ours never binds to, since
    the loader resolves its libgomp.so.1 to the object of that name already loaded, torch's."""
    before = _openmp_runtimes()
    lib = ctypes.CDLL(str(path))
    added = _openmp_runtimes() - before
    if before and added:
        raise OSError(f"it loads a second OpenMP runtime ({sorted(added)}) beside torch's: build it with GCC")
    lib.streamed_product.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.streamed_product.restype = None
    return lib


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled product (built on the first call, by one thread), or None where it cannot be built or
    loaded (`status()` says why). A cached file that does not load is compiled again, once."""
    with _building:
        cc = compiler()
        if cc is None:
            _why_not.append("no C compiler ($CC, cc or gcc) on the PATH")
            return None
        path = library_path(cc)
        try:
            if path.is_file():
                try:
                    return _load(path)
                except OSError:  # a damaged or foreign file: build it anew
                    path.unlink(missing_ok=True)
            _compile(cc, path)
            return _load(path)
        except subprocess.CalledProcessError as e:
            _why_not.append(f"{' '.join(cc)} failed: {(e.stderr or '').strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as e:
            _why_not.append(f"{type(e).__name__}: {e}")
        return None


def available() -> bool:
    """Whether the C product can run here (it is compiled on the first call)."""
    return library() is not None


def status() -> str:
    """One line for the benchmarks' tables: the library in use, or why there is none."""
    if available():
        return f"C product {library_path(compiler()).name}"
    return f"no C product ({_why_not[-1] if _why_not else 'not built'})"


def streamed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (N, d_in) · weightᵀ (d_out, d_in) → (N, d_out), fp32 on the CPU, by the compiled product (no
    gradient: it is for inference; the plan uses it outside grad mode only)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the C product is not available here: {status()}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"streamed_product takes x (N, d_in) and weight (d_out, d_in), got {tuple(x.shape)} "
            f"and {tuple(weight.shape)}"
        )
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not (x.is_cpu and weight.is_cpu):
        raise ValueError(
            f"streamed_product is for fp32 CPU tensors, got {x.dtype} on {x.device} and "
            f"{weight.dtype} on {weight.device}"
        )
    if max(*x.shape, weight.shape[0]) > MAX_SIZE:
        raise ValueError(f"streamed_product takes sizes below 2³¹, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise RuntimeError(
            "streamed_product computes no gradient: call it under torch.no_grad() or inference_mode, or use F.linear"
        )
    return product(x, weight)


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (…, d_in) · weightᵀ (d_out, d_in) → (…, d_out) by the compiled product, unchecked: what
    `streamed_product` checks must hold (fp32 CPU tensors, no gradient wanted, sizes up to MAX_SIZE, the
    library available; an empty x or d_in = 0 is fine). The linear plan calls this on each of decoding's
    products, whose inputs linear_product has checked already: checking them again would cost a
    noticeable share of a small product at one row."""
    x, weight = x.contiguous(), weight.contiguous()  # row-major, as the C code reads them
    y = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)  # (…, d_out)
    library().streamed_product(
        x.data_ptr(),
        weight.data_ptr(),
        y.data_ptr(),
        math.prod(x.shape[:-1]),
        weight.shape[0],
        weight.shape[1],
        torch.get_num_threads(),
    )
    return y
