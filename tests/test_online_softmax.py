"""A softmax over rows too long for registers (a wide looped kernel) accumulates its row sum in its row max's pass,
relative to a running max (``kernel_builder._online_softmax_sums``, ``Emitter._online_step``): two passes over the
row instead of three. The outputs are eager's: NaN, +-inf and all -inf rows included, where the online sum
itself may differ (0 for a row of -inf) but the exp it divides is NaN. A sum that is stored or read otherwise
keeps its own pass.
"""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import plan
from pyfuser.codegen.kernel_builder import COMPILE_OPTIONS, prelude
from harness import DEVICE, assert_same, load_source_module

COLS = 20000  # > plan.TUNING["wide_min_cols"]: a wide looped kernel


@pytest.fixture(autouse=True)
def online_softmax(monkeypatch):
    """The form under test for every element size (by default only rows of 4-byte elements take it:
    plan.TUNING["wide_online_softmax_min_itemsize"])."""
    monkeypatch.setitem(plan.TUNING, "wide_online_softmax_min_itemsize", 1)


def _softmax(fd, x, out_dtype=None, extra=None):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    m = fd.ops.max(t, dims=[1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(t, m))
    s = fd.ops.sum(e, dims=[1], keepdim=True)
    q = fd.ops.div(e, s)
    fd.add_output(q if out_dtype is None else fd.ops.cast(q, out_dtype))
    if extra == "sum":
        fd.add_output(s)
    elif extra == "logsumexp":
        fd.add_output(fd.ops.add(m, fd.ops.log(s)))


def _rows(dtype, cols=COLS):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(10, cols, generator=g) * 4
    x[0, 7] = float("nan")
    x[1, :] = float("-inf")
    x[2, cols // 2] = float("inf")
    x[3, : cols - 100] = float("-inf")  # the first tiles all -inf, then finite values
    x[4, :] = 0.0
    x[5, ::2] = float("-inf")
    x[6, 3] = 80.0  # one large value in the first tile, the rest far below it
    x[6, 4:] = -30.0
    x[7, -1] = 60.0  # the max in the last tile: every earlier tile's sum is rescaled
    x[8, :] = torch.linspace(-50, 50, cols)  # an increasing row: the max moves in every tile
    # The first tiles all -inf, then values whose exp underflows against a shift of 0: the sum kept while the max
    # was -inf (0) must be rescaled by 0, not by exp(0 - max), which overflows to inf (0 * inf: NaN).
    x[9, : cols - 100] = float("-inf")
    x[9, cols - 100:] = -100.0 - x[9, cols - 100:].abs()
    return x.to(dtype).to(DEVICE)


def _source(fd) -> str:
    src = fd.last_execution()[0].kernel_source
    return src[src.index("\ndef pf_"):]


@pytest.mark.parametrize("cols", [COLS, 32768], ids=["masked tail", "whole steps"])
@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_wide_softmax_takes_one_pass_for_its_max_and_sum_and_equals_eager(io, cols):
    x = _rows(io, cols)
    with FusionDefinition() as fd:
        _softmax(fd, x, out_dtype=None if io == torch.float32 else DataType.BFloat16)
    (out,) = fd.execute([x])
    src = _source(fd)
    assert "pf_looped" in src and "on_m" in src
    assert src.count("for c00 in range(") == 2  # the max-and-sum pass, the output pass
    ref = torch.softmax(x.float(), dim=1).to(io)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.isnan(), ref.isnan())
    # The sum's rounding is a reduction's (order, and the exp of the sum on the GPU is ex2.approx's): a few ulps
    # of fp32; the bf16 outputs then round the same but near a rounding midpoint.
    tol = dict(atol=1e-5, rtol=1.3e-6) if io == torch.float32 else dict(atol=2 ** -14, rtol=2 ** -7)
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, **tol)


@pytest.mark.parametrize("extra", ["sum", "logsumexp"])
def test_a_sum_read_beyond_the_division_keeps_its_own_pass(extra):
    x = _rows(torch.float32)
    with FusionDefinition() as fd:
        _softmax(fd, x, extra=extra)
    outs = fd.execute([x])
    src = _source(fd)
    assert "on_m" not in src and src.count("for c00 in range(") == 3
    t = x.float()
    m = t.amax(1, keepdim=True)
    s = torch.exp(t - m).sum(1, keepdim=True)
    ref = [torch.softmax(t, dim=1), s if extra == "sum" else m + torch.log(s)]
    for o, r in zip(outs, ref):
        assert_same(o, r, atol=1e-5, rtol=1.3e-6)


def test_rows_that_fit_in_registers_keep_their_passes():
    x = _rows(torch.float32, 4096)
    with FusionDefinition() as fd:
        _softmax(fd, x)
    fd.execute([x])
    assert "on_m" not in _source(fd)


@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_by_default_only_rows_of_4_byte_elements_take_it(monkeypatch, io):
    monkeypatch.setitem(plan.TUNING, "wide_online_softmax_min_itemsize", 4)
    x = _rows(io)
    with FusionDefinition() as fd:
        _softmax(fd, x)
    fd.execute([x])
    src = _source(fd)
    assert ("on_m" in src) == (io == torch.float32)
    assert src.count("for c00 in range(") == (2 if io == torch.float32 else 3)


def test_two_sums_of_one_max_take_one_online_pass_and_one_of_their_own():
    """Only one sum per max is accumulated in the max's pass; a second sum of exp(x - max) keeps its own pass."""
    x = _rows(torch.float32)
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        m = fd.ops.max(t, dims=[1], keepdim=True)
        for _ in range(2):
            e = fd.ops.exp(fd.ops.sub(t, m))
            fd.add_output(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)))
    outs = fd.execute([x])
    src = _source(fd)
    assert "on_m" in src and src.count("for c00 in range(") == 3
    ref = torch.softmax(x.float(), dim=1)
    for o in outs:
        assert_same(o, ref, atol=1e-5, rtol=1.3e-6)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_wide_softmax_of_a_non_contiguous_input(layout):
    base = _rows(torch.float32, COLS + 3)
    x = base[:, 2:COLS + 2] if layout == "sliced" else base.t().contiguous().t()
    with FusionDefinition() as fd:
        _softmax(fd, x)
    (out,) = fd.execute([x])
    assert "on_m" in _source(fd)
    t = x.float()  # eager op by op, which keeps the input's layout
    e = torch.exp(t - t.amax(1, keepdim=True))
    assert_same(out, e / e.sum(1, keepdim=True), atol=1e-5, rtol=1.3e-6)


_FAST_EXP = "_exp_ftz(" if DEVICE.type == "cuda" else "tl.exp("  # (the interpreter runs no PTX)


@pytest.mark.parametrize("cols,layout", [(COLS, "contiguous"), (32768, "contiguous"), (32768, "transposed")],
                         ids=["masked tail", "whole steps", "whole steps, column-major"])
def test_a_sum_in_a_pass_of_its_own_adds_the_fast_exp_and_equals_eager(monkeypatch, cols, layout):
    """Rows of 2-byte elements keep three passes by default; with TUNING["wide_fast_exp_sums"] (on by default)
    their sum's pass adds the fast exp of x - max (the prelude's _exp_ftz on the GPU, tl.exp in the
    interpreter), the output pass the exact one."""
    monkeypatch.setitem(plan.TUNING, "wide_online_softmax_min_itemsize", 4)
    monkeypatch.setitem(plan.TUNING, "wide_fast_exp_sums", True)
    x = _rows(torch.bfloat16, cols)
    if layout == "transposed":
        x = x.t().contiguous().t()
    with FusionDefinition() as fd:
        _softmax(fd, x, out_dtype=DataType.BFloat16)
    (out,) = fd.execute([x])
    src = _source(fd)
    passes = src.split("for c00 in range(")
    assert len(passes) == 4 and "on_m" not in src
    assert _FAST_EXP in passes[2] and "libdevice.exp(" not in passes[2]
    assert "libdevice.exp(" in passes[3] and _FAST_EXP not in passes[3]
    t = x.float()  # eager op by op, which keeps the input's layout
    e = torch.exp(t - t.amax(1, keepdim=True))
    ref = (e / e.sum(1, keepdim=True)).to(torch.bfloat16)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, atol=2 ** -14, rtol=2 ** -7)


@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_the_online_sum_takes_the_fast_exp_with_the_switch(monkeypatch, io):
    monkeypatch.setitem(plan.TUNING, "wide_fast_exp_sums", True)
    x = _rows(io)
    with FusionDefinition() as fd:
        _softmax(fd, x, out_dtype=None if io == torch.float32 else DataType.BFloat16)
    (out,) = fd.execute([x])
    src = _source(fd)
    assert "on_m" in src and f"+ {_FAST_EXP}" in src
    ref = torch.softmax(x.float(), dim=1).to(io)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.isnan(), ref.isnan())
    tol = dict(atol=1e-5, rtol=1.3e-6) if io == torch.float32 else dict(atol=2 ** -14, rtol=2 ** -7)
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, **tol)


def test_without_the_switch_a_sum_in_a_pass_of_its_own_adds_the_exact_exp(monkeypatch):
    monkeypatch.setitem(plan.TUNING, "wide_online_softmax_min_itemsize", 4)
    monkeypatch.setitem(plan.TUNING, "wide_fast_exp_sums", False)
    x = _rows(torch.bfloat16)
    with FusionDefinition() as fd:
        _softmax(fd, x, out_dtype=DataType.BFloat16)
    (out,) = fd.execute([x])
    passes = _source(fd).split("for c00 in range(")
    assert "libdevice.exp(" in passes[2] and "tl.exp(" not in passes[2] and "_exp_ftz(" not in passes[2]
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), dim=1).to(torch.bfloat16).float(),
                               equal_nan=True, atol=2 ** -14, rtol=2 ** -7)


_EXP_KERNELS = """
import triton
import triton.language as tl
from triton.language.extra import libdevice
""" + prelude() + """

@triton.jit
def exp_pair(fast_ptr, exact_ptr, start, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = (start + offs).to(tl.int32).to(tl.float32, bitcast=True)
    tl.store(fast_ptr + offs, _exp_ftz(x))
    tl.store(exact_ptr + offs, libdevice.exp(x))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fast_exp_of_every_non_positive_fp32_is_within_2_to_the_minus_21_of_expf(tmp_path):
    """_exp_ftz over every fp32 with the sign bit set (-0, subnormals, normals, -inf, NaNs): the terms of a
    softmax sum, x - max <= 0. Within 2^-21 of libdevice's expf (each term is at most 1 and the sum at least 1),
    NaN for NaN, 0 for -inf."""
    mod = load_source_module(_EXP_KERNELS, tmp_path, "fast_exp_kernels")
    chunk, block = 1 << 28, 1024
    fast = torch.empty(chunk, dtype=torch.float32, device="cuda")
    exact = torch.empty_like(fast)
    worst = 0.0
    for start in range(-(1 << 31), 0, chunk):
        mod.exp_pair[(chunk // block,)](fast, exact, start, BLOCK=block, num_warps=4, **COMPILE_OPTIONS)
        assert torch.equal(fast.isnan(), exact.isnan())
        worst = max(worst, float((fast.double() - exact.double()).abs().nan_to_num(0.0).max()))
    x = torch.tensor([float("-inf")], device="cuda")
    mod.exp_pair[(1,)](fast, exact, int(x.view(torch.int32)), BLOCK=block, num_warps=4, **COMPILE_OPTIONS)
    assert float(fast[0]) == 0.0
    print(f"max |_exp_ftz - expf| over x <= 0: {worst!r}")
    assert worst <= 2 ** -21


@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_the_fast_exp_sums_compile_for_sm90(monkeypatch, io):
    """As the GPU plans them (the prelude's _exp_ftz, an inline PTX block): the online sum of fp32 rows and the
    own-pass sum of bf16 rows compile for sm_90 with ex2.approx.ftz."""
    from sm90 import compile_ptx, gpu_plans, kernel_spec

    monkeypatch.setitem(plan.TUNING, "wide_online_softmax_min_itemsize", 4)
    monkeypatch.setitem(plan.TUNING, "wide_fast_exp_sums", True)
    x = torch.randn(4, 32768, dtype=io, device=DEVICE)
    with FusionDefinition() as fd:
        _softmax(fd, x, out_dtype=None if io == torch.float32 else DataType.BFloat16)
    (p,) = gpu_plans(monkeypatch, fd, [x])
    assert "_exp_ftz(" in p.source.split("def pf_")[1]
    (ptx,) = compile_ptx([kernel_spec(p, specialized=True)])
    assert "ex2.approx.ftz.f32" in ptx
