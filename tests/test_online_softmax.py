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
from harness import DEVICE, assert_same

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
