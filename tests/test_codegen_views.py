"""Memory-read ops in generated kernels (slice, pad, cat): one kernel segment with their consumers, values bit
for bit against eager on special-valued, negative, non-contiguous, offset and negative-bit inputs, eager's
shapes, dtypes and strides; a slice returned as a fusion output stays a view of its input."""

import pytest
import torch
import torch.nn.functional as F

from harness import check_fusion, define, make, sliced, transposed
from pyfuser import DataType


def specials(shape, dtype=torch.float32):
    """Random values with NaN, +-inf, +-0 and negatives spread in."""
    x = make(shape, dtype)
    flat = x.view(-1) if x.is_contiguous() else None
    if dtype.is_floating_point and flat is not None:
        vals = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.5], dtype=dtype)
        k = min(flat.numel(), vals.numel())
        idx = torch.randperm(flat.numel())[:k]
        flat[idx] = vals[:k].to(flat.device)
    return x


def bits_equal(out, ref, nan_bits=True):
    """Bitwise equality (the sign of zero included, and NaN payloads unless ``nan_bits`` is False: arithmetic
    such as neg leaves a NaN's sign to the hardware), plus dtype, shape and strides."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, ref.dtype, out.shape, ref.shape)
    o = [s for s, n in zip(out.stride(), out.shape) if n != 1]
    r = [s for s, n in zip(ref.stride(), ref.shape) if n != 1]
    assert o == r, (out.stride(), ref.stride())
    if out.dtype.is_floating_point:
        if not nan_bits:
            assert torch.equal(out.isnan(), ref.isnan())
            out, ref = out.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf")), ref.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf"))
        iview = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
        assert torch.equal(out.contiguous().view(iview), ref.contiguous().view(iview))
    else:
        assert torch.equal(out, ref)


def kernel_count(fd):
    """How many segments ran; each must have been a generated kernel."""
    reports = fd.last_execution()
    assert all(r.runs_as == "triton" for r in reports), [str(r).splitlines()[0] for r in reports]
    return len(reports)


# --- slice ---------------------------------------------------------------------------------------------------


def _slice_add_mul(x, y):
    def fn(fd):
        s = fd.ops.slice(fd.from_pytorch(x), [1, 2], [7, 12])
        yy = fd.from_pytorch(y)
        fd.add_output(fd.ops.mul(fd.ops.add(s, yy), yy))

    return fn


def _slice_add_mul_eager(x, y):
    # bf16 operands compute in fp32 and give an fp32 result, as in nvFuser
    s, y = x[1:7, 2:12].float(), y.float()
    return (s + y) * y


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slice_add_mul_is_one_kernel(layout, dtype):
    if layout == "contiguous":
        x = specials((9, 13), dtype)
    elif layout == "transposed":
        x = transposed((9, 13), dtype)
    elif layout == "sliced":
        x = sliced((9, 13), dtype)
    else:  # a storage offset
        x = make((11, 13), dtype)[2:]
    y = specials((6, 10), dtype)
    fd = define(_slice_add_mul(x, y))
    (out,) = fd.execute([x, y])
    bits_equal(out, _slice_add_mul_eager(x, y), nan_bits=False)
    assert kernel_count(fd) == 1


def test_slice_negative_bit_input():
    x = torch._neg_view(torch.neg(make((8, 12))))
    y = make((6, 10))
    fd = define(_slice_add_mul(x, y))
    (out,) = fd.execute([x, y])
    bits_equal(out, _slice_add_mul_eager(x.resolve_neg(), y))
    assert kernel_count(fd) == 1


def test_slice_bounds_normalized_like_eager():
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        s = fd.ops.slice(x, [-3, 0], [100, -2])  # negative start, end past the extent, negative end
        fd.add_output(fd.ops.neg(s))

    x = specials((7, 9))
    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, -x[-3:100, 0:-2], nan_bits=False)
    assert kernel_count(fd) == 1
    check_fusion(fn, [x], lambda x: -x[-3:, :-2])


def test_slice_output_stays_a_view():
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.slice(x, [1, 1], [4, 5]))
        fd.add_output(fd.ops.neg(x))

    x = make((6, 7))
    fd = define(fn)
    view, e = fd.execute([x])
    assert view.data_ptr() == x[1:4, 1:5].data_ptr() and view.stride() == x.stride()
    bits_equal(e, torch.neg(x))


def test_slice_of_a_value_computed_in_the_kernel_recomputes_it():
    # (a + b)[1:] reads the sum at other coordinates than its own: the kernel recomputes it from shifted reads;
    # when the sum is also returned it is written by a kernel of its own and read back shifted
    a, b = specials((5, 6)), make((5, 6))

    def fn(fd, also_returned):
        s = fd.ops.add(fd.from_pytorch(a), fd.from_pytorch(b))
        if also_returned:
            fd.add_output(s)
        fd.add_output(fd.ops.mul(fd.ops.slice(s, [1, 0], [5, 6]), 2.0))

    for also_returned, kernels in ((False, 1), (True, 2)):
        fd = define(lambda fd: fn(fd, also_returned))
        outs = fd.execute([a, b])
        bits_equal(outs[-1], (a + b)[1:5] * 2.0, nan_bits=False)
        assert kernel_count(fd) == kernels
        ref = (lambda a, b: [a + b, (a + b)[1:5] * 2.0]) if also_returned else (lambda a, b: (a + b)[1:5] * 2.0)
        check_fusion(lambda fd: fn(fd, also_returned), [a, b], ref)


def test_recomputed_cat_operands():
    # cat of values computed from outside tensors of lower rank, a select, a symbolic scalar and a CPU scalar
    x, bias = specials((3, 4, 6)), make((6,))
    k = torch.tensor(1.5)

    def fn(fd):
        tx, tb, tk = fd.from_pytorch(x), fd.from_pytorch(bias), fd.from_pytorch(k)
        s = fd.define_scalar(None, dtype=DataType.Float)
        left = fd.ops.mul(fd.ops.add(tx, tb), s)  # [3, 4, 6], bias aligned to the last dim
        right = fd.ops.mul(fd.ops.broadcast_in_dim(fd.ops.select(tx, 1, 1), [3, 4, 6], [0, 2]), tk)
        fd.add_output(fd.ops.cat([left, fd.ops.neg(fd.ops.slice(tx, [0, 0, 2], [3, 4, 5]))], 2))
        fd.add_output(fd.ops.cat([right, left], 1))

    def ref(x, bias, k, s=0.5):
        left = (x + bias) * s
        right = x[:, 1:2, :].expand(3, 4, 6) * k
        return [torch.cat([left, -x[:, :, 2:5]], 2), torch.cat([right, left], 1)]

    fd = define(fn)
    outs = fd.execute([x, bias, k, 0.5])
    for o, r in zip(outs, ref(x, bias, k)):
        bits_equal(o, r, nan_bits=False)
    check_fusion(fn, [x, bias, k, 0.5], ref)


def test_operand_made_by_a_reduction_is_not_recomputed():
    x = make((4, 6))

    def fn(fd):
        tx = fd.from_pytorch(x)
        m = fd.ops.sum(tx, dims=[1], keepdim=True)  # [4, 1]
        fd.add_output(fd.ops.cat([fd.ops.sub(tx, m), tx], 1))

    outs = check_fusion(fn, [x], lambda x: torch.cat([x - x.sum(1, keepdim=True), x], 1), atol=1e-5, rtol=1e-5)
    fd = define(fn)
    fd.execute([x])
    assert kernel_count(fd) == 2


def test_slice_symbolic_bounds_run_on_aten():
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        n = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.add(fd.ops.slice(x, [0, 0], [n, 4]), 1.0))

    x = make((6, 5))
    fd = define(fn)
    (out,) = fd.execute([x, 3])
    bits_equal(out, x[:3, :4] + 1.0)
    assert [r.kind for r in fd.last_execution()] == ["ExprEval", "PointWise"]


@pytest.mark.parametrize("cols", [40, 9000])  # persistent and looped softmax
def test_softmax_of_a_slice(cols):
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        s = fd.ops.cast(fd.ops.slice(x, [0, 3], [4, 3 + cols]), DataType.Float)
        e = fd.ops.exp(fd.ops.sub(s, fd.ops.max(s, dims=[1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)), DataType.BFloat16))

    x = make((4, cols + 5), torch.bfloat16)
    fd = define(fn)
    (out,) = fd.execute([x])
    assert kernel_count(fd) == 1
    ref = torch.softmax(x[:, 3:3 + cols].float(), dim=1).bfloat16()
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


# --- pad -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("widths", [[1, 2], [0, 0, 2, 1], [-1, 3, 1, -2], [2, 0, 0, 1, 1, 1]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_pad(widths, dtype):
    value = {torch.bool: True, torch.int32: -7}.get(dtype, -0.0)

    for x in (specials((3, 4, 5), dtype), transposed((3, 4, 5), dtype)):
        def fn(fd):
            fd.add_output(fd.ops.pad(fd.from_pytorch(x), widths, value))

        fd = define(fn)
        (out,) = fd.execute([x])
        bits_equal(out, F.pad(x, widths, value=value))
        assert kernel_count(fd) == 1


def test_pad_default_value_and_consumers_fuse():
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        y = fd.define_tensor([-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.mul(fd.ops.pad(x, [1, 1]), y))

    x, y = specials((4, 6)), specials((4, 8))
    check_fusion(fn, [x, y], lambda x, y: F.pad(x, [1, 1]) * y)
    fd = define(fn)
    fd.execute([x, y])
    assert kernel_count(fd) == 1


def test_pad_then_sum_over_padded_dim():
    # the padded dim is the reduced (column) dim of a persistent kernel
    def fn(fd):
        x = fd.define_tensor([-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.sum(fd.ops.pad(x, [2, 3], 1.0), dims=[1]))

    x = make((5, 7))
    fd = define(fn)
    (out,) = fd.execute([x])
    assert kernel_count(fd) == 1
    torch.testing.assert_close(out, F.pad(x, [2, 3], value=1.0).sum(1), atol=1e-6, rtol=1e-6)


# --- cat -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_cat(dim, dtype):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[dim] = i + 1

    inputs = [specials(shapes[0], dtype), transposed(shapes[1], dtype), make(shapes[2], dtype)]

    def fn(fd):
        fd.add_output(fd.ops.cat([fd.from_pytorch(t) for t in inputs], dim))

    fd = define(fn)
    (out,) = fd.execute(inputs)
    bits_equal(out, torch.cat(inputs, dim))
    assert kernel_count(fd) == 1


def test_cat_with_an_empty_input_and_consumer():
    def fn(fd):
        a = fd.define_tensor([-1, -1], contiguity=[True, True])
        b = fd.define_tensor([-1, -1], contiguity=[True, True])
        c = fd.define_tensor([-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.abs(fd.ops.cat([a, b, c], 1)))

    inputs = [specials((3, 2)), make((3, 0)), specials((3, 5))]
    check_fusion(fn, inputs, lambda a, b, c: torch.abs(torch.cat([a, b, c], 1)))
    fd = define(fn)
    fd.execute(inputs)
    assert kernel_count(fd) == 1


# --- select, reshape, iota, full -----------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 2, -1])
def test_select_reads_at_an_offset(index):
    x, y = specials((4, 6, 5)), transposed((6, 5))

    def fn(fd):
        fd.add_output(fd.ops.mul(fd.ops.select(fd.from_pytorch(x), index, 0), fd.from_pytorch(y)))

    check_fusion(fn, [x, y], lambda x, y: torch.select(x, 0, index) * y)
    fd = define(fn)
    (out,) = fd.execute([x, y])
    bits_equal(out, torch.select(x, 0, index) * y, nan_bits=False)
    assert kernel_count(fd) == 1


def test_select_returned_stays_a_view():
    x = make((4, 6))

    def fn(fd):
        fd.add_output(fd.ops.select(fd.from_pytorch(x), 1, 1))

    fd = define(fn)
    (out,) = fd.execute([x])
    assert out.data_ptr() == x[:, 1].data_ptr() and out.stride() == (6,)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_reshape_of_an_input(layout):
    x = {"contiguous": specials((4, 6, 5)), "transposed": transposed((4, 6, 5)),
         "offset": make((5, 6, 5))[1:]}[layout]

    def fn(fd):
        fd.add_output(fd.ops.add(fd.ops.reshape(fd.from_pytorch(x), [4, 30]), 1.0))

    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, x.reshape(4, 30) + 1.0, nan_bits=False)
    assert kernel_count(fd) == 1  # transposed: not a view, the kernel computes each element's input offset
    check_fusion(fn, [x], lambda x: x.reshape(4, 30) + 1.0)


@pytest.mark.parametrize("shape,new", [((3, 4, 5), [5, 12]), ((6, 1, 4), [2, 3, 4, 1]), ((2, 3, 4), [24])])
def test_reshape_that_needs_a_copy(shape, new):
    x = make(shape).permute(2, 0, 1).contiguous().permute(1, 2, 0)  # dims permuted in memory
    assert not x.is_contiguous()

    def fn(fd):
        fd.add_output(fd.ops.mul(fd.ops.reshape(fd.from_pytorch(x), new), 3.0))

    outs = check_fusion(fn, [x], lambda x: x.reshape(new) * 3.0)
    bits_equal(outs[0], x.reshape(new) * 3.0)
    fd = define(fn)
    fd.execute([x])
    assert kernel_count(fd) == 1


@pytest.mark.parametrize("dtype,start,step", [(DataType.Int, 3, -2), (DataType.Float, 0.5, 0.1),
                                               (DataType.BFloat16, -1.0, 0.3), (DataType.Int32, None, None)])
def test_iota_and_full(dtype, start, step):
    tdt = {DataType.Int: torch.int64, DataType.Float: torch.float32, DataType.BFloat16: torch.bfloat16,
           DataType.Int32: torch.int32}[dtype]
    x = make((3, 7), tdt)

    def fn(fd):
        i = fd.ops.iota(7, start, step, dtype=dtype)
        f = fd.ops.full([3, 7], 2, dtype)
        fd.add_output(fd.ops.add(fd.ops.mul(fd.from_pytorch(x), f), fd.ops.broadcast_in_dim(i, [3, 7], [1])))
        fd.add_output(i)

    def ref(x):
        compute = torch.float32 if tdt == torch.bfloat16 else tdt
        i = (torch.arange(7, dtype=compute, device=x.device) * (1 if step is None else step) + (0 if start is None else start)).to(tdt)
        if tdt == torch.bfloat16:
            return (x.float() * 2 + i.float()), i
        return x * 2 + i, i

    outs = check_fusion(fn, [x], ref)
    fd = define(fn)
    fd.execute([x])
    assert kernel_count(fd) == 1
    for o, r in zip(outs, ref(x)):
        bits_equal(o, r)


# --- cumsum --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_cumsum_in_a_kernel(dtype):
    x = make((5, 37), dtype) if dtype != torch.int64 else make((5, 37), dtype, low=-2**62, high=2**62)

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sub(fd.ops.cumsum(t, 1), fd.ops.cast(t, DataType.Int)))  # exclusive prefix sums

    ref = lambda x: torch.cumsum(x, 1) - x.long()  # noqa: E731  (int64 wraps as torch does)
    outs = check_fusion(fn, [x], ref)
    bits_equal(outs[0], ref(x))
    fd = define(fn)
    fd.execute([x])
    assert kernel_count(fd) == 1


def test_cumsum_of_a_column_and_init():
    x = transposed((6, 4), torch.int32)

    def fn(fd):
        fd.add_output(fd.ops.cumsum(fd.from_pytorch(x), 0, init=5))

    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, torch.cumsum(x, 0) + 5)
    assert kernel_count(fd) == 1


def test_long_scans_run_on_aten():
    # (float cumsum in kernels: tests/test_codegen_scans.py)
    y = make((2, 20000), torch.int32)  # longer than any persistent row
    fd = define(lambda fd: fd.add_output(fd.ops.cumsum(fd.from_pytorch(y), 1)))
    (out,) = fd.execute([y])
    assert [r.runs_as for r in fd.last_execution()] == ["aten"]
    bits_equal(out, torch.cumsum(y, 1))


# --- independent computations over equal static extents --------------------------------------------------------


def test_independent_chains_of_equal_static_extents_share_a_kernel():
    # two cumsum chains over [6] (the MoE layer's token and block-scale offsets), each from its own input
    def fn(fd):
        a = fd.define_tensor([6], contiguity=[True], dtype=DataType.Int32)
        b = fd.define_tensor([6], contiguity=[True], dtype=DataType.Int32)
        for t in (a, b):
            fd.add_output(fd.ops.cast(fd.ops.sub(fd.ops.cumsum(t, 0), t), DataType.Int32))

    a, b = make((6,), torch.int32), make((6,), torch.int32)
    ref = lambda a, b: [(torch.cumsum(t, 0) - t).int() for t in (a, b)]  # noqa: E731
    outs = check_fusion(fn, [a, b], ref)
    for o, r in zip(outs, ref(a, b)):
        bits_equal(o, r)
    fd = define(fn)
    fd.execute([a, b])
    assert kernel_count(fd) == 1


def test_independent_chains_of_symbolic_or_different_extents_stay_apart():
    def fn(fd, static):
        a = fd.define_tensor([4, 5] if static else [-1, -1], contiguity=[True, True])
        b = fd.define_tensor([4, 6] if static else [-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.neg(a))
        fd.add_output(fd.ops.sum(b, dims=[1]))

    a, b = make((4, 5)), make((4, 6))
    for static in (True, False):
        fd = define(lambda fd: fn(fd, static))
        outs = fd.execute([a, b])
        bits_equal(outs[0], -a)
        torch.testing.assert_close(outs[1], b.sum(1))
        assert kernel_count(fd) == 2


def test_equal_static_extents_with_different_reductions_stay_apart():
    def fn(fd):
        a = fd.define_tensor([4, 5], contiguity=[True, True])
        b = fd.define_tensor([4, 5], contiguity=[True, True])
        fd.add_output(fd.ops.sum(a, dims=[1]))
        fd.add_output(fd.ops.sum(b, dims=[0]))

    a, b = make((4, 5)), make((4, 5))
    fd = define(fn)
    outs = fd.execute([a, b])
    torch.testing.assert_close(outs[0], a.sum(1))
    torch.testing.assert_close(outs[1], b.sum(0))
    assert kernel_count(fd) == 2


def test_cat_input_also_read_directly():
    # x is read through views by cat and at the kernel's own coordinates by the other output
    x, c = specials((4, 3)), make((4, 1))

    def fn(fd):
        tx, tc = fd.from_pytorch(x), fd.from_pytorch(c)
        fd.add_output(fd.ops.cat([tx, tc, tx], 1))
        fd.add_output(fd.ops.abs(tx))

    outs = check_fusion(fn, [x, c], lambda x, c: [torch.cat([x, c, x], 1), torch.abs(x)])
    bits_equal(outs[0], torch.cat([x, c, x], 1))


def test_static_computations_related_later_by_a_transpose_stay_one_kernel():
    # exp(x) and exp(z) are unrelated until the add relates x's dim 0 to z's dim 1
    x, z = make((4, 4)), make((4, 4))

    def fn(fd):
        a = fd.define_tensor([4, 4], contiguity=[True, True])
        b = fd.define_tensor([4, 4], contiguity=[True, True])
        fd.add_output(fd.ops.add(fd.ops.exp(a), fd.ops.permute(fd.ops.exp(b), [1, 0])))

    fd = define(fn)
    (out,) = fd.execute([x, z])
    torch.testing.assert_close(out, torch.exp(x) + torch.exp(z).T)
    assert kernel_count(fd) == 1


@pytest.mark.parametrize("static", [True, False])
def test_cumsum_over_one_element(static):
    # a scanned dim of extent 1 (a broadcast when static, a dropped loop dim either way): each value is its sum
    x = make((5, 1), torch.int32)

    def fn(fd):
        t = fd.define_tensor([-1, 1] if static else [-1, -1], contiguity=[True, None] if static else [True, True],
                             dtype=DataType.Int32)
        fd.add_output(fd.ops.sub(fd.ops.cumsum(t, 1), fd.ops.cast(t, DataType.Int)))
        fd.add_output(fd.ops.cumsum(t, 1, init=2))

    outs = check_fusion(fn, [x], lambda x: [torch.cumsum(x, 1) - x.long(), torch.cumsum(x, 1) + 2])
    bits_equal(outs[0], torch.zeros(5, 1, dtype=torch.int64, device=x.device))


def test_rotary_embedding_pattern():
    # x * cos + cat([-x2, x1]) * sin: one kernel, -x2 recomputed from shifted reads of x
    x, c, s = specials((2, 8, 16)), make((8, 16)), make((8, 16))

    def fn(fd):
        tx, tc, ts = fd.from_pytorch(x), fd.from_pytorch(c), fd.from_pytorch(s)
        x1 = fd.ops.slice(tx, [0, 0, 0], [2, 8, 8])
        x2 = fd.ops.slice(tx, [0, 0, 8], [2, 8, 16])
        rot = fd.ops.cat([fd.ops.neg(x2), x1], 2)
        fd.add_output(fd.ops.add(fd.ops.mul(tx, tc), fd.ops.mul(rot, ts)))

    ref = lambda x, c, s: x * c + torch.cat([-x[..., 8:], x[..., :8]], 2) * s  # noqa: E731
    outs = check_fusion(fn, [x, c, s], ref)
    bits_equal(outs[0], ref(x, c, s), nan_bits=False)
    fd = define(fn)
    fd.execute([x, c, s])
    assert kernel_count(fd) == 1


# --- randomized: memory reads on random layouts, bit for bit ---------------------------------------------------


def _random_layout(rng, shape, dtype):
    kind = rng.choice(["contiguous", "transposed", "sliced", "offset", "negbit"])
    if kind == "transposed" and len(shape) >= 2:
        return transposed(shape, dtype)
    if kind == "sliced":
        return sliced(shape, dtype)
    if kind == "offset":
        return make((shape[0] + 2, *shape[1:]), dtype)[2:]
    if kind == "negbit" and dtype.is_floating_point:
        return torch._neg_view(torch.neg(make(shape, dtype)))
    return specials(shape, dtype)


def _random_case(seed):
    """(fn, inputs, eager reference) of one random memory read feeding a pointwise op."""
    import random

    rng = random.Random(seed)
    dtype = rng.choice([torch.float32, torch.bfloat16, torch.int32])
    shape = [rng.randint(1, 6) for _ in range(rng.choice([2, 3]))]
    x = _random_layout(rng, shape, dtype)
    op = rng.choice(["slice", "pad", "cat", "select", "reshape"])
    if op == "slice":
        starts = [rng.randint(-n - 1, n) for n in shape]
        ends = [rng.randint(-n, n + 2) for n in shape]

        def read(fd, t):
            return fd.ops.slice(t, starts, ends)

        def eager_read(x):
            return x[tuple(slice(s, e) for s, e in zip(starts, ends))]
    elif op == "pad":
        widths = []
        for n in reversed(shape[-rng.randint(1, len(shape)):]):
            lo = rng.randint(-(n // 2), 2)
            widths += [lo, rng.randint(-(n - max(lo, 0) - (-lo if lo < 0 else 0)) // 2, 2)]
        value = rng.choice([0, 3, -1]) if dtype == torch.int32 else rng.choice([0.0, -0.0, 2.5, float("inf")])

        def read(fd, t):
            return fd.ops.pad(t, widths, value)

        def eager_read(x):
            return F.pad(x, widths, value=value)
    elif op == "cat":
        dim = rng.randrange(len(shape))
        others = []
        for _ in range(rng.randint(1, 2)):
            s = list(shape)
            s[dim] = rng.randint(1, 4)
            others.append(_random_layout(rng, s, dtype))

        def read(fd, t, *ts):
            return fd.ops.cat([t, *ts], dim)

        def eager_read(x, *xs):
            return torch.cat([x, *xs], dim)
    elif op == "select":
        dim = rng.randrange(len(shape))
        index = rng.randint(-shape[dim], shape[dim] - 1)

        def read(fd, t):
            return fd.ops.select(t, index, dim)

        def eager_read(x):
            return torch.select(x, dim, index)
    else:
        new = [shape[0] * shape[1], *shape[2:]] if rng.random() < 0.5 else [*shape[:-1], 1, shape[-1]]

        def read(fd, t):
            return fd.ops.reshape(t, new)

        def eager_read(x):
            return x.reshape(new)
    extra = others if op == "cat" else []
    # Half the slices, pads and cats read values computed in the kernel (recomputed at shifted coordinates).
    computed = op in ("slice", "pad", "cat") and rng.random() < 0.5
    plain_read, plain_eager = read, eager_read
    if computed:
        def read(fd, *ts):
            return plain_read(fd, *[fd.ops.mul(fd.ops.neg(t), 3) for t in ts])

        def eager_read(*xs):  # reduced-precision floats compute (and return) in Float, as in nvFuser
            return plain_eager(*[torch.neg(x.float() if x.dtype == torch.bfloat16 else x) * 3 for x in xs])
    out_shape = list(eager_read(x.resolve_neg(), *[t.resolve_neg() for t in extra]).shape)
    y = _random_layout(rng, out_shape, dtype) if out_shape else make([], dtype)
    inputs = [x, *extra, y]

    def fn(fd):
        ts = [fd.from_pytorch(t) for t in inputs]
        r = read(fd, *ts[:-1])
        fd.add_output(fd.ops.mul(fd.ops.add(r, ts[-1]), ts[-1]) if dtype != torch.int32 else
                      fd.ops.bitwise_xor(fd.ops.add(r, ts[-1]), 5))

    def reference(*ins):
        ins = [t.resolve_neg() for t in ins]
        r = eager_read(*ins[:-1])
        if dtype == torch.int32:
            return torch.bitwise_xor(r + ins[-1], 5)
        return ((r.float() + ins[-1].float()) * ins[-1].float())

    return fn, inputs, reference


@pytest.mark.parametrize("seed", range(60))
def test_random_memory_reads(seed):
    fn, inputs, reference = _random_case(seed)
    try:
        expected = reference(*inputs)
    except (RuntimeError, IndexError):  # an invalid random case (e.g. a pad cropping everything)
        pytest.skip("eager rejects this case")
    if expected.numel() == 0:
        pytest.skip("empty result")
    fd = define(fn)
    (out,) = fd.execute(inputs)
    bits_equal(out, expected, nan_bits=False)
    reports = fd.last_execution()
    assert len(reports) == 1 and reports[0].runs_as == "triton", [str(r).splitlines()[0] for r in reports]


def test_rotary_embedding_of_a_projection_is_one_kernel():
    # as traced from a model: the projection's output is reshaped to heads and permuted, then rotated;
    # the halves are slices of that view chain, recomputed through one composed strided view each
    B, S, H, D = 2, 5, 3, 8
    qkv, cos, sin = specials((B * S, H * D), torch.bfloat16), make((S, D)), make((S, D))

    def fn(fd):
        x, c, s = fd.from_pytorch(qkv), fd.from_pytorch(cos), fd.from_pytorch(sin)
        q = fd.ops.permute(fd.ops.reshape(x, [B, S, H, D]), [0, 2, 1, 3])  # [B, H, S, D]
        x1 = fd.ops.slice(q, [0, 0, 0, 0], [B, H, S, D // 2])
        x2 = fd.ops.slice(q, [0, 0, 0, D // 2], [B, H, S, D])
        rot = fd.ops.cat([fd.ops.neg(x2), fd.ops.cast(x1, DataType.Float)], 3)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(q, c), fd.ops.mul(rot, s)), DataType.BFloat16))

    def ref(qkv, cos, sin):
        q = qkv.reshape(B, S, H, D).permute(0, 2, 1, 3).float()
        rot = torch.cat([-q[..., D // 2:], q[..., :D // 2]], 3)
        return (q * cos + rot * sin).bfloat16()

    outs = check_fusion(fn, [qkv, cos, sin], ref)
    bits_equal(outs[0], ref(qkv, cos, sin), nan_bits=False)
    fd = define(fn)
    fd.execute([qkv, cos, sin])
    assert kernel_count(fd) == 1
