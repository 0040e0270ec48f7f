"""Reductions over expanded broadcast dims, as nvFuser defines them.

An expanded broadcast dim (``broadcast_in_dim``/``expand`` of a size-1 dim, or a stride-0 input dim) holds one
value repeated over its extent. nvFuser squeezes such a dim out of a sum or prod instead of reducing the
repeats: the sum is multiplied by the extent and the prod raised to it, the factor first cast to the result's
dtype. Eager adds the repeated values one by one, which rounds differently, so these tests compare with the
product nvFuser computes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from harness import DEVICE, assert_same, check_fusion, define, make
from pyfuser import DataType

SPECIAL = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, -1.75, 3.1]


def _column(values, dtype=torch.float32):
    """A [len(values), 1] tensor, a column of a wider one (so not contiguous)."""
    wide = torch.zeros(len(values), 3, dtype=dtype, device=DEVICE)
    wide[:, 1] = torch.tensor(values, dtype=torch.float64).to(dtype)
    return wide[:, 1:2]


def _column_input(fd, dtype=DataType.Float):
    return fd.define_tensor(shape=[-1, 1], contiguity=[False, None], dtype=dtype)


@pytest.mark.parametrize("extent", [3, 7, 4096])
def test_sum_over_an_expanded_dim_is_the_value_times_the_extent(extent):
    x = _column(SPECIAL)

    def fusion(fd):
        t = _column_input(fd)
        b = fd.ops.broadcast_in_dim(t, shape=[len(SPECIAL), extent], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[1]))

    check_fusion(fusion, [x], lambda x: x[:, 0] * float(extent), atol=0, rtol=0)


def test_sum_over_an_expanded_dim_is_not_eager_repeated_addition():
    # In Float, 0.1 added 7 times is 0.70000005 and 0.1 * 7 is 0.7000000 (one rounding): nvFuser's product.
    x = torch.full((1, 1), 0.1, device=DEVICE)
    fd = define(lambda fd: fd.add_output(fd.ops.sum(
        fd.ops.broadcast_in_dim(_column_input(fd), shape=[1, 7], broadcast_dims=[0, 1]), dims=[1])))
    out = fd.execute([x])[0]
    repeated = x[:, 0].clone()
    for _ in range(6):
        repeated = repeated + x[:, 0]
    assert torch.equal(out, x[:, 0] * 7.0)
    assert not torch.equal(out, repeated)


def test_sum_over_expanded_and_real_dims_scales_the_reduction_of_the_real_ones():
    x = make((4, 1, 6))
    x[0, 0, 0], x[1, 0, 2] = float("inf"), -0.0

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float)
        b = fd.ops.broadcast_in_dim(t, shape=[4, 5, 6], broadcast_dims=[0, 1, 2])
        fd.add_output(fd.ops.sum(b, dims=[1, 2]))

    # (the kernel's summation order of the real dim is its own: compared within rounding)
    check_fusion(fusion, [x], lambda x: x[:, 0, :].sum(1) * 5.0)


def test_symbolic_extent_is_read_at_run_time():
    x = _column(SPECIAL)

    def fusion(fd):
        t = _column_input(fd)
        n = fd.define_scalar(None, dtype=DataType.Int)
        b = fd.ops.broadcast_in_dim(t, shape=[fd.ops.size(t, 0), n], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[-1]))

    for n in (1, 5, 11):
        check_fusion(fusion, [x, n], lambda x, n: x[:, 0] * float(n), atol=0, rtol=0)


def test_stride_zero_input_dim_is_an_expanded_dim():
    base = make((5, 1))
    base[1, 0], base[3, 0] = float("-inf"), -2.5
    x = base.expand(5, 6)

    def fusion(fd):
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), dims=[1]))

    check_fusion(fusion, [x], lambda x: x[:, 0] * 6.0, atol=0, rtol=0)


def test_prod_over_an_expanded_dim_is_the_value_to_the_power_of_the_extent():
    x = _column([-1.5, -0.0, 0.5, float("inf"), float("-inf"), float("nan"), 1.1])

    def fusion(fd):
        b = fd.ops.broadcast_in_dim(_column_input(fd), shape=[7, 2, 3], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.prod(b, dims=[1, 2]))

    check_fusion(fusion, [x], lambda x: torch.pow(x[:, 0], 6.0), atol=0, rtol=0)


@pytest.mark.parametrize("symbolic", [False, True])
def test_reduced_precision_result_is_float_and_the_factor_exact(symbolic):
    # The multiplication runs in Float and gives Float, as nvFuser's does; the extent (257, which BFloat16
    # cannot hold) is not rounded to the input's dtype.
    x = _column([1.0, -3.5, float("inf"), -0.0, 0.3], torch.bfloat16)

    def fusion(fd):
        t = _column_input(fd, DataType.BFloat16)
        n = fd.define_scalar(None, dtype=DataType.Int) if symbolic else 257
        b = fd.ops.broadcast_in_dim(t, shape=[5, n], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[1]))

    inputs = [x, 257] if symbolic else [x]
    out = check_fusion(fusion, inputs, lambda x, *n: x[:, 0].float() * 257.0, atol=0, rtol=0)[0]
    assert out.dtype == torch.float32


def test_dtype_argument_casts_before_scaling():
    x = _column([1.25, -2.0, 7.0, -0.0])

    def fusion(fd):
        b = fd.ops.broadcast_in_dim(_column_input(fd), shape=[4, 3], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[1], dtype=DataType.Double))

    check_fusion(fusion, [x], lambda x: x[:, 0].double() * 3.0, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_and_bool_sums_are_int_products(dtype):
    x = make((6, 1), dtype) if dtype != torch.bool else torch.tensor([[True], [False], [True]], device=DEVICE)
    nv_dtype = {torch.int32: DataType.Int32, torch.int64: DataType.Int, torch.bool: DataType.Bool}[dtype]
    rows = x.shape[0]

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=nv_dtype)
        b = fd.ops.broadcast_in_dim(t, shape=[rows, 9], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[1]))

    check_fusion(fusion, [x], lambda x: x[:, 0].to(torch.int64) * 9, atol=0, rtol=0)


def test_keepdim_brings_the_squeezed_dims_back():
    x = make((3, 1, 4))

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float)
        b = fd.ops.broadcast_in_dim(t, shape=[3, 5, 4, 2], broadcast_dims=[0, 1, 2])
        fd.add_output(fd.ops.sum(b, dims=[1, 2, 3], keepdim=True))

    check_fusion(fusion, [x], lambda x: x.sum(2, keepdim=True).unsqueeze(-1) * 10.0, atol=0, rtol=0)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_over_an_expanded_dim_are_the_value_itself(op):
    x = _column(SPECIAL)

    def fusion(fd):
        b = fd.ops.broadcast_in_dim(_column_input(fd), shape=[len(SPECIAL), 6], broadcast_dims=[0, 1])
        fd.add_output(getattr(fd.ops, op)(b, dims=[1]))

    # A new tensor (not a view of the input), with the repeated value.
    out = check_fusion(fusion, [x], lambda x: x[:, 0].clone(), atol=0, rtol=0)[0]
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_empty_expanded_dim_gives_the_init_value():
    # An extent known to be 0 is checked first: the result is the init value (not inf * 0 = NaN).
    x = _column([float("inf"), float("nan"), 2.0])

    def fusion(fd):
        t = _column_input(fd)
        b = fd.ops.broadcast_in_dim(t, shape=[fd.ops.size(t, 0), 0, 2], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(b, dims=[1]))
        fd.add_output(fd.ops.prod(b, dims=[1], keepdim=True, dtype=DataType.Int))

    def ref(x):
        return [torch.zeros(3, 2, device=DEVICE), torch.ones(3, 1, 2, dtype=torch.int64, device=DEVICE)]

    check_fusion(fusion, [x], ref, atol=0, rtol=0)


def test_sum_of_a_broadcast_scalar_written_into_its_input():
    # A 0-dim value broadcast to n elements, summed and written back into that input's buffer, while the
    # broadcast also feeds pointwise outputs: the input becomes value * n.
    n = 1 << 12
    x, s = make((n,)), torch.tensor(0.3, device=DEVICE)
    expected = s * float(n)

    def fusion(fd):
        t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        c = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float)
        b = fd.ops.broadcast_in_dim(c, shape=[n], broadcast_dims=[])
        fd.add_output(fd.ops.sum(b, dims=[0]), c)
        fd.add_output(fd.ops.mul(t, b))
        fd.add_output(fd.ops.add(t, b))

    fd = define(fusion)
    prod_out, sum_out = fd.execute([x, s])
    assert torch.equal(s, expected)
    assert torch.equal(prod_out, x * 0.3) and torch.equal(sum_out, x + 0.3)


def test_printed_definition_shows_the_squeeze_and_the_scaling():
    fd = define(lambda fd: fd.add_output(fd.ops.sum(
        fd.ops.broadcast_in_dim(_column_input(fd), shape=[2, 3], broadcast_dims=[0, 1]), dims=[1])))
    text = repr(fd)
    assert "fd.ops.squeeze(tv1, dims=[1], squeeze_expanded=True)" in text
    assert "fd.ops.mul(tv2, 3.00000)" in text
    assert "fd.ops.sum" not in text


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dims", [[0], [-1]])
def test_reducing_a_zero_dim_tensor_is_a_copy(op, dims):
    # nvFuser (like torch) accepts dim 0 or -1 on a 0-dim tensor and returns a copy of it (was an IndexError).
    for value in (-2.5, float("nan"), float("-inf"), -0.0):
        x = torch.tensor(value, device=DEVICE)

        def fusion(fd):
            t = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float)
            fd.add_output(getattr(fd.ops, op)(t, dims=dims))

        out = check_fusion(fusion, [x], lambda x: x.clone(), atol=0, rtol=0)[0]
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert torch.equal(out.signbit(), x.signbit())


def test_sum_of_a_zero_dim_integer_tensor_is_int():
    x = torch.tensor(7, dtype=torch.int32, device=DEVICE)

    def fusion(fd):
        fd.add_output(fd.ops.sum(fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Int32), dims=[0]))

    check_fusion(fusion, [x], lambda x: torch.sum(x, 0), atol=0, rtol=0)


def test_result_over_a_permuted_input_is_contiguous_as_eagers_reduction():
    # Fuzz seed 31043 on the H200: the product that replaces the sum took its operand's layout ([4, 9] with
    # strides (1, 4) from a transposed input); eager's sum allocates its result contiguously.
    x = make((9, 4)).t()  # [4, 9], strides (1, 4)

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 1])
        b = fd.ops.broadcast_in_dim(t, shape=[4, 7, 9], broadcast_dims=[0, 2])
        fd.add_output(fd.ops.sum(b, dims=[1]))
        fd.add_output(fd.ops.prod(fd.ops.exp(b), dims=[1]))

    # (Not check_fusion: its repr round trip rebuilds nvFuser's printed squeeze-times-extent, whose eager layout
    # is its operand's.)
    outs = define(fusion).execute([x])
    assert_same(outs[0], (x * 7.0).contiguous(), atol=0, rtol=0)
    assert_same(outs[1], torch.pow(x.exp(), 7.0).contiguous(), atol=1e-6, rtol=1e-5)
