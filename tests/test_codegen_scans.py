"""Float cumsum in generated kernels (codegen/reduction_lowerings.py): a Double-accumulated tree scan, so every
prefix is within one rounding of eager's CPU cumsum (a sequential Double sum for Float, verified on torch 2.13),
bit for bit where no rounding boundary lies between the two Double prefixes; NaN/±inf propagate as in eager and
a row of -0.0 sums to +0.0 as ATen's CPU loop does. Half/BFloat16 compute in Float and round once."""

import math

import pytest
import torch

from harness import DEVICE, define, fd_softmax, make, transposed
from test_codegen_views import bits_equal, specials


def _cumsum_fusion(x, dim, init=None):
    def fn(fd):
        kw = {} if init is None else {"init": init}
        fd.add_output(fd.ops.cumsum(fd.from_pytorch(x), dim, **kw))

    fd = define(fn)
    (out,) = fd.execute([x])
    assert [r.runs_as for r in fd.last_execution()] == ["triton"], fd.last_execution()
    return out


def _within_one_rounding(out, ref, abs_prefix=None):
    """|out - ref| <= one ulp of ref (in ref's dtype), NaN where ref has NaN, infinities equal.

    Double has no wider type to accumulate in: its scan is a tree in Double, and each of its log2(n) levels may
    round once where eager's CPU loop rounded differently. So Double gets 2 * ceil(log2(n)) ulps of the result
    (cumprod), or of ``abs_prefix``, the running sum of |x| (cumsum: cancellation can leave a prefix far smaller
    than the roundings that made it)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    n = ref.shape[-1] if ref.dim() else 1
    ulps = 2 * max(1, math.ceil(math.log2(max(n, 2)))) if ref.dtype == torch.float64 else 1
    assert torch.equal(out.isnan(), ref.isnan())
    finite = ref.isfinite()
    assert torch.equal(out[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()])
    o, r = out[finite].double(), ref[finite].double()
    inf = torch.tensor(float("inf"), dtype=ref.dtype, device=ref.device)
    ulp = torch.nextafter(ref[finite].abs(), inf).double() - r.abs()
    if ref.dtype == torch.float64 and abs_prefix is not None:
        ulp = torch.maximum(ulp, abs_prefix[finite].double() * 2.0**-53)
    assert torch.all((o - r).abs() <= ulps * ulp), ((o - r).abs() / ulp).max()


@pytest.mark.parametrize("n", [5, 37, 256, 1000])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_float_cumsum_within_one_rounding_of_eager(n, layout):
    if layout == "transposed":
        x = transposed((4, n))
    elif layout == "offset":
        x = make((5, n))[1:]
    else:
        x = make((4, n))
    out = _cumsum_fusion(x, 1)
    ref = torch.cumsum(x.cpu(), 1).to(DEVICE)
    _within_one_rounding(out, ref)
    if DEVICE.type == "cpu":  # one rounding of two Double prefixes: nearly always the same Float
        assert (out == ref).float().mean() > 0.99


def test_float_scan_accumulates_in_double():
    # A Float accumulator would stay at 1.0; ATen's CPU cumsum (Double) ends at 1.00001.
    x = torch.tensor([[1.0] + [1e-8] * 1000], device=DEVICE)
    out = _cumsum_fusion(x, 1)
    assert out[0, -1].item() == pytest.approx(1.00001, rel=1e-7)
    if DEVICE.type == "cpu":
        bits_equal(out, torch.cumsum(x, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_special_values_and_zero_signs(dtype):
    x = specials((6, 9), dtype).to(DEVICE)
    x[0] = -0.0  # a row of negative zeros sums to +0.0, as ATen's CPU loop (from +0.0)
    x[1, 3] = float("inf")
    x[1, 5] = float("-inf")  # inf + -inf: NaN from there on
    out = _cumsum_fusion(x, 1)
    ref = torch.cumsum(x.cpu(), 1).to(DEVICE)
    bits_equal(out[0], ref[0])
    _within_one_rounding(out, ref, abs_prefix=torch.cumsum(x.abs().cpu(), 1).to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_computes_in_float(dtype):
    # nvFuser (and the ATen evaluator) compute a Half/BFloat16 cumsum in Float and round once; eager's own
    # reduced-precision cumsum rounds the same Float-or-better prefix: one rounding apart at most.
    x = make((3, 100), dtype)
    out = _cumsum_fusion(x, 1)
    bits_equal(out, torch.cumsum(x.float().cpu().double(), 1).to(dtype).to(DEVICE))
    _within_one_rounding(out, torch.cumsum(x.cpu(), 1).to(DEVICE))


def test_init_and_dim_0():
    x = transposed((7, 5))
    out = _cumsum_fusion(x, 0, init=1.5)
    _within_one_rounding(out, (torch.cumsum(x.cpu(), 0) + 1.5).to(DEVICE))


def test_cumulative_softmax_one_kernel():
    # top-p sampling's cumulative probabilities: softmax and its cumsum in one persistent kernel
    x = make((8, 50))

    def fn(fd):
        p = fd_softmax(fd, fd.from_pytorch(x), 1)
        fd.add_output(p)
        fd.add_output(fd.ops.cumsum(p, 1))

    fd = define(fn)
    p, out = fd.execute([x])
    torch.testing.assert_close(p, torch.softmax(x, 1))  # (exp and division: a few ulps from eager's softmax)
    _within_one_rounding(out, torch.cumsum(p.cpu(), 1).to(DEVICE))
    assert len(fd.segments()) == 1 and fd.last_execution()[0].runs_as == "triton"


# --- cummax, cummin, cumprod ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_cummax_cummin_bitwise(op, dtype, layout):
    # Exact in any order; ATen's update rule (a later NaN or a later equal value wins) decides zero signs and
    # NaN payloads, and the kernel's combine follows it.
    x = specials((6, 33), dtype).to(DEVICE) if dtype.is_floating_point else make((6, 33), dtype)
    if dtype.is_floating_point:
        x[0, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0], dtype=dtype)
        x[1, :3] = torch.tensor([-0.0, 0.0, -0.0], dtype=dtype)
    if layout == "transposed":
        x = x.t().contiguous().t()
    out = _cumsum_fusion_of(op, x, 1)
    # (Half/BFloat16 compute in Float: a NaN's payload comes back as the interpreter's 0xFFFF, not the input's)
    bits_equal(out, getattr(torch, op)(x, 1).values, nan_bits=dtype.itemsize > 2)


def test_cummax_of_a_column_in_a_kernel_with_its_neighbours():
    x = transposed((9, 4))

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sub(t, fd.ops.cummax(t, 0)))  # drawdown from the running maximum

    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, x - torch.cummax(x, 0).values)
    assert len(fd.segments()) == 1 and fd.last_execution()[0].runs_as == "triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_cumprod(dtype):
    x = make((4, 30), dtype, low=-2, high=2) if not dtype.is_floating_point else (
        0.5 + torch.rand((4, 30), generator=torch.Generator().manual_seed(0)) * 1.0).to(dtype).to(DEVICE)
    if dtype.is_floating_point:
        x[0, 3] = -0.0
        x[1, 5] = float("nan")
        x[2, 7] = float("inf")
    out = _cumsum_fusion_of("cumprod", x, 1)
    ref = torch.cumprod(x.cpu(), 1).to(DEVICE)
    if dtype.is_floating_point:
        _within_one_rounding(out, ref)
        if DEVICE.type == "cpu":  # a zero times anything finite: the sign is the product's own
            bits_equal(out[0, 3:], ref[0, 3:])
    else:
        bits_equal(out, ref)


def test_cummax_with_init_runs_on_aten():
    x = make((3, 8))

    def fn(fd):
        fd.add_output(fd.ops.cummax(fd.from_pytorch(x), 1, init=0.5))

    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, torch.maximum(torch.cummax(x, 1).values, torch.tensor(0.5)))
    assert [s.kind.value for s in fd.segments()] == ["ExprEval"]


def _cumsum_fusion_of(op, x, dim):
    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), dim))

    fd = define(fn)
    (out,) = fd.execute([x])
    assert [r.runs_as for r in fd.last_execution()] == ["triton"], fd.last_execution()
    return out
