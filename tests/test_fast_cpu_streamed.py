"""The C product (fast_cpu/streamed.py): F.linear's numbers to fp32 rounding for any shape, a
candidate of the measured plan where it builds, and a clear account of why where it does not."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.fast_cpu import plan, streamed

built = pytest.mark.skipif(not streamed.available(), reason=f"no C product here: {streamed.status()}")


@built
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 19),
    d_out=st.integers(1, 41),
    d_in=st.integers(0, 70),
    seed=st.integers(0, 2**16),
    threads=st.sampled_from([1, 2, 3]),
)
def test_the_c_product_is_within_fp32_rounding_of_the_exact_product(rows, d_out, d_in, seed, threads):
    """|y − y_exact| ≤ γ_n Σ_k |x_k w_k| with γ_n = n·u / (1 − n·u), u = 2⁻²⁴, n = d_in: the bound of any order
    of fp32 sums (Higham 3.1), so a wrong index, a lost tail or a dropped tile fails it. Both tiles (2 rows of
    x and the odd last one), d_out not a multiple of 8, d_in not a multiple of 16, threads with no rows."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = streamed.streamed_product(x, w)
    finally:
        torch.set_num_threads(previous)
    assert y.shape == (rows, d_out) and y.dtype == torch.float32
    assert_within_fp32_rounding(y, x, w)


def assert_within_fp32_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """|y − x·wᵀ| ≤ γ_n |x|·|w|ᵀ elementwise, n = d_in, against the product in float64."""
    exact = x.double() @ w.double().T  # (rows, d_out)
    u, d_in = 2.0**-24, x.shape[1]
    gamma = d_in * u / (1 - d_in * u)
    bound = gamma * (x.double().abs() @ w.double().abs().T)
    assert bool(((y.double() - exact).abs() <= bound + 1e-300).all())


def narrow_library(folder: Path) -> ctypes.CDLL:
    """streamed.c as it is built for a CPU without AVX-512 (tiles of 1 row of x in 8-lane vectors): built
    with -mno-avx512f where this CPU has AVX-512, else as the library itself is built (then it is that code)."""
    flags = ["-mno-avx512f"] if "avx512f" in streamed.cpu_identity().split() else []
    cc, path = streamed.compiler(), folder / "narrow.so"
    macros = subprocess.run(
        [*cc, *streamed.FLAGS, *flags, "-dM", "-E", "-x", "c", os.devnull],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "__AVX512F__" not in macros.split(), "the narrow build still targets AVX-512"
    subprocess.run(
        [*cc, *streamed.FLAGS, *flags, "-o", str(path), str(streamed.SOURCE)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return streamed._load(path)


def product_by(lib: ctypes.CDLL, x: torch.Tensor, w: torch.Tensor, threads: int) -> torch.Tensor:
    y = torch.empty(x.shape[0], w.shape[0])  # (rows, d_out)
    lib.streamed_product(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], w.shape[0], w.shape[1], threads)
    return y


@built
def test_both_builds_give_each_row_the_same_sums_for_any_number_of_rows(tmp_path):
    """The AVX-512 code (tiles of 2 rows of x, then 1) and the code for other CPUs (1-row tiles of 8 lanes):
    each within fp32 rounding, and a row's result bit for bit the same whether it comes alone or with others
    (what lets a verify's rows equal AR steps' where the plan takes the C product for both)."""
    libraries = {"as built here": streamed.library(), "narrow": narrow_library(tmp_path)}
    g = torch.Generator().manual_seed(0)
    shapes = [
        (9, 41, 70, 2),
        (4, 17, 16, 3),
        (3, 8, 7, 1),
        (5, 100, 33, 2),
        (2, 3, 0, 2),
        (3, 9, 25, 2),
        (4, 20, 45, 3),
        (2, 16, 15, 1),
    ]  # d_in % 16: 6, 0, 7, 1, 0, 9, 13, 15
    for rows, d_out, d_in, threads in shapes:
        x, w = torch.randn(rows, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
        for name, lib in libraries.items():
            y = product_by(lib, x, w, threads)
            assert_within_fp32_rounding(y, x, w)
            for i in range(rows):
                assert torch.equal(product_by(lib, x[i : i + 1].clone(), w, threads)[0], y[i]), (name, rows, i)


@built
def test_the_c_product_reads_views_and_refuses_what_it_cannot_compute():
    """A transposed weight or a sliced x is read as its values (made contiguous first); other dtypes,
    mismatched shapes and a weight that wants a gradient are named."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 40, generator=g), torch.randn(40, 24, generator=g)
    torch.testing.assert_close(streamed.streamed_product(x[::2], w.T), x[::2] @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"x \(N, d_in\) and weight \(d_out, d_in\), got \(6, 40\) and \(40, 24\)"):
        streamed.streamed_product(x, w)
    with pytest.raises(ValueError, match="fp32 CPU tensors, got torch.float64"):
        streamed.streamed_product(x.double(), w.T.double())
    with pytest.raises(RuntimeError, match="computes no gradient"):
        streamed.streamed_product(x, w.T.requires_grad_())


@built
def test_the_plan_offers_it_after_f_linear_and_before_torchs_other_products():
    """choose() walks the candidates in order: F.linear, the C product, torch's other products, the copies of W."""
    assert plan.candidates(1536, 4, with_copies=True) == (
        "linear",
        "streamed",
        "rows-first",
        "transposed",
        "sliced",
    )
    assert plan.candidates(576, 1, with_copies=False) == ("linear", "streamed", "duplicated-row")


@pytest.mark.parametrize(
    "env, why",
    [
        ({"CC": "false"}, "no C product (false failed"),
        ({"PATH": "/nonexistent"}, "no C product (no C compiler ($CC, cc or gcc)"),
    ],
)
def test_without_a_compiler_the_plan_measures_the_other_kernels(tmp_path, env, why):
    """A compiler that fails, or none on the PATH: nothing is built, status() says why, and the plan's
    candidates are torch's own (a fresh process: the library is looked for once per process)."""
    code = (
        "from dflash_ref.fast_cpu import plan, streamed\n"
        "print(streamed.available(), plan.candidates(576, 4, False), streamed.status())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "DFLASH_REF_CACHE": str(tmp_path), **env},
    ).stdout
    assert out.startswith(f"False ('linear', 'rows-first') {why}")
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


@built
def test_a_damaged_cached_library_is_built_again(tmp_path):
    """A cached file that does not load (cut short, say) is compiled anew, not trusted or given up on."""
    code = (
        "from dflash_ref.fast_cpu import streamed\n"
        "path = streamed.library_path(streamed.compiler())\n"
        "path.parent.mkdir(parents=True, exist_ok=True)\n"
        "path.write_bytes(b'not a library')\n"
        "print(streamed.available(), path.stat().st_size > 1000)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DFLASH_REF_CACHE": str(tmp_path)},
    ).stdout
    assert out.split() == ["True", "True"]


@built
def test_the_c_product_binds_to_torchs_openmp_runtime_beside_a_private_copy():
    """Its OpenMP calls go to torch's libgomp, even where another wheel already loaded a renamed copy
    (sentencepiece ships libgomp-<hash>.so; the transformers extra imports it): its threads are torch's pool."""
    if sys.platform != "linux":
        pytest.skip("reads /proc/self/maps and asks the loader with dladdr")
    pytest.importorskip("sentencepiece")
    code = textwrap.dedent("""
        import ctypes, torch, sentencepiece
        from dflash_ref.fast_cpu import streamed
        before = streamed._openmp_runtimes()
        lib = streamed.library()
        class Info(ctypes.Structure):
            _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                        ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
        info = Info()
        address = ctypes.cast(lib.omp_get_max_threads, ctypes.c_void_p)
        assert ctypes.CDLL(None).dladdr(address, ctypes.byref(info))
        print(len(before), streamed._openmp_runtimes() == before, info.fname.decode())
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["2", "True"], out  # torch's and sentencepiece's, and no third
    assert out[2] == str(Path(torch.__file__).parent / "lib" / "libgomp.so.1"), out
