"""Indexing ops: index_select, select, gather, take_along_axis, scatter, embedding_fwd.

Each parity test compares with the eager torch op (values, shapes, dtypes and strides) over dtypes and over
contiguous, transposed, sliced, expanded and stride_order inputs; definition-time errors are tested per op.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness import STRIDE_ORDER_3D, with_layout, with_stride_order, kernel_kind, DEVICE, check_fusion, define, expanded, make, sliced, transposed
from pyfuser import DataType, FusionDefinitionError, FusionDtypeError
from pyfuser.errors import FusionExecutionError
from pyfuser.ir.dtypes import from_torch_dtype

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
DTYPES = FLOATS + [torch.int64, torch.bool]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "stride_order"]
make_arg = with_layout  # a 2-D or 3-D tensor of ``shape`` in the given layout (expanded along dim 0)


def define_input(fd, t, layout=None):
    """The input for ``t``: an explicit define_tensor(stride_order=...) for that layout, else from_pytorch."""
    if layout == "stride_order":
        order = STRIDE_ORDER_3D if t.dim() == 3 else [0, 1]
        return fd.define_tensor(
            shape=[-1] * t.dim(), contiguity=[True] * t.dim(), dtype=from_torch_dtype(t.dtype), stride_order=order
        )
    return fd.from_pytorch(t)


def rand_index(shape, high, dtype=torch.int64):
    return torch.randint(0, high, shape, device=DEVICE, dtype=dtype)


def unique_index(shape, dim, high, dtype=torch.int64):
    """Indices that are distinct along ``dim`` (so scatter writes each position at most once)."""
    keys = torch.rand(*shape[:dim], high, *shape[dim + 1 :], device=DEVICE)
    idx = keys.argsort(dim=dim).narrow(dim, 0, shape[dim])
    return idx.to(dtype).contiguous()


def int_scalar(fd):
    return fd.define_scalar(None, dtype=DataType.Int)


# ==============================================================================================================
# index_select


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_index_select_dtypes_layouts(dtype, layout):
    shape = (4, 6, 5) if layout == "stride_order" else (4, 6)
    x = make_arg(layout, shape, dtype)
    i = rand_index((7,), 6)

    def fn(fd):
        t0, t1 = define_input(fd, x, layout), fd.from_pytorch(i)
        fd.add_output(fd.ops.index_select(t0, t1, 1))

    check_fusion(fn, [x, i], lambda x, i: torch.index_select(x, 1, i), expected_segments=[kernel_kind("index_select")])


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_select_dims_and_index_dtypes(dim, index_dtype):
    x = make((3, 4, 5))
    i = rand_index((6,), x.shape[dim], index_dtype)

    def fn(fd):
        fd.add_output(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(i), dim))

    check_fusion(fn, [x, i], lambda x, i: torch.index_select(x, dim, i))


def test_index_select_index_layouts_and_0d_index():
    x = make((5, 4))
    strided_index = rand_index((8,), 5)[::2]  # stride 2
    expanded_index = rand_index((1,), 5).expand(3)  # stride 0
    scalar_index = torch.tensor(3, device=DEVICE)  # 0-D: keeps the dim with size 1

    def fn(fd):
        t0 = fd.from_pytorch(x)
        for idx in (strided_index, expanded_index, scalar_index):
            fd.add_output(fd.ops.index_select(t0, fd.from_pytorch(idx), 0))

    def ref(x, a, b, c):
        return [torch.index_select(x, 0, a), torch.index_select(x, 0, b), torch.index_select(x, 0, c)]

    outs = check_fusion(fn, [x, strided_index, expanded_index, scalar_index], ref)
    assert outs[2].shape == (1, 4)


def test_index_select_feeds_pointwise():
    x, i = make((6, 4)), rand_index((5,), 6)

    def fn(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(i)
        t2 = fd.ops.index_select(t0, t1, 0)
        fd.add_output(fd.ops.mul(t2, t2))

    check_fusion(fn, [x, i], lambda x, i: torch.index_select(x, 0, i) * torch.index_select(x, 0, i))


def test_index_select_errors():
    with pytest.raises(FusionDtypeError, match=r"fd.ops.index_select: argument 'index' must be an Int or Int32"):
        define(lambda fd: fd.ops.index_select(
            fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Float), 0))
    with pytest.raises(FusionDefinitionError, match=r"index_select: argument 'index' must be a 1-D or 0-D"):
        define(lambda fd: fd.ops.index_select(
            fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), 0))
    with pytest.raises(FusionDefinitionError, match=r"index_select: argument 'dim'=2 is out of range"):
        define(lambda fd: fd.ops.index_select(
            fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int), 2))
    with pytest.raises(FusionDefinitionError, match=r"index_select: argument 'arg' must have rank >= 1"):
        define(lambda fd: fd.ops.index_select(
            fd.define_tensor([]), fd.define_tensor([-1], dtype=DataType.Int), 0))
    with pytest.raises(FusionDtypeError, match=r"index_select: argument 'arg' must be a TensorView"):
        define(lambda fd: fd.ops.index_select(
            fd.define_scalar(1.0), fd.define_tensor([-1], dtype=DataType.Int), 0))


# ==============================================================================================================
# select


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_select_dtypes_layouts(dtype, layout):
    shape = (4, 6, 5) if layout == "stride_order" else (4, 6)
    x = make_arg(layout, shape, dtype)

    def fn(fd):
        fd.add_output(fd.ops.select(define_input(fd, x, layout), 2, 1))

    check_fusion(fn, [x], lambda x: torch.select(x, 1, 2), expected_segments=["ExprEval"])


@pytest.mark.parametrize("dim,index", [(0, 0), (0, -1), (1, 3), (2, -5), (-1, 4)])
def test_select_symbolic_index(dim, index):
    x = make((3, 4, 5))

    def fn(fd):
        t0, s = fd.from_pytorch(x), int_scalar(fd)
        fd.add_output(fd.ops.select(t0, s, dim))

    check_fusion(fn, [x, index], lambda x, i: torch.select(x, dim, i))


def test_select_output_is_a_view_of_the_input():
    x = make((4, 6))
    fd = define(lambda fd: fd.add_output(fd.ops.select(fd.from_pytorch(x), 1, 0)))
    (out,) = fd.execute([x])
    assert out.data_ptr() == x[1].data_ptr() and out.stride() == x[1].stride()
    x.add_(1.0)  # writes through the alias, as with eager views
    torch.testing.assert_close(out, x[1])


def test_select_feeds_pointwise():
    x = transposed((4, 6))

    def fn(fd):
        t1 = fd.ops.select(fd.from_pytorch(x), 3, 1)
        fd.add_output(fd.ops.add(t1, 1.0))

    # select with a constant index is read by the kernel at an offset: one kernel.
    check_fusion(fn, [x], lambda x: torch.select(x, 1, 3) + 1.0, expected_segments=[kernel_kind("select")])


def test_select_out_of_range_at_run_time():
    x = make((4, 6))

    def fn(fd):
        fd.add_output(fd.ops.select(fd.from_pytorch(x), int_scalar(fd), 0))

    # our error, naming the op (not torch's raw IndexError)
    with pytest.raises(FusionExecutionError, match=r"fd\.ops\.select .*index 4 out of range"):
        define(fn).execute([x, 4])


def test_select_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.select: argument 'index'=5 is out of range for dim 1 of size 5"):
        define(lambda fd: fd.ops.select(fd.define_tensor([3, 5]), 5, 1))
    with pytest.raises(FusionDefinitionError, match=r"select: argument 'index'=-4 is out of range"):
        define(lambda fd: fd.ops.select(fd.define_tensor([3, 5]), -4, 0))
    with pytest.raises(FusionDtypeError, match=r"select: argument 'index' must be an Int scalar"):
        define(lambda fd: fd.ops.select(fd.define_tensor([-1]), fd.define_scalar(None, dtype=DataType.Double), 0))
    with pytest.raises(FusionDtypeError, match=r"select: argument 'index' must be an int"):
        define(lambda fd: fd.ops.select(fd.define_tensor([-1]), 1.0, 0))
    with pytest.raises(FusionDtypeError, match=r"select: argument 'index' must be an int"):
        define(lambda fd: fd.ops.select(fd.define_tensor([-1]), True, 0))
    with pytest.raises(FusionDefinitionError, match=r"select: argument 'dim'=-3 is out of range"):
        define(lambda fd: fd.ops.select(fd.define_tensor([-1, -1]), 0, -3))
    with pytest.raises(FusionDefinitionError, match=r"select: argument 'arg' must have rank >= 1"):
        define(lambda fd: fd.ops.select(fd.define_tensor([]), 0, 0))


# ==============================================================================================================
# gather


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gather_dtypes_layouts(dtype, layout):
    shape = (4, 6, 5) if layout == "stride_order" else (4, 6)
    x = make_arg(layout, shape, dtype)
    # Index smaller than arg in the non-gathered dims (allowed by torch.gather).
    i = rand_index((3, 7, 2) if len(shape) == 3 else (3, 7), 6)

    def fn(fd):
        t0, t1 = define_input(fd, x, layout), fd.from_pytorch(i)
        fd.add_output(fd.ops.gather(t0, t1, 1))

    check_fusion(fn, [x, i], lambda x, i: torch.gather(x, 1, i), expected_segments=[kernel_kind("gather")])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("index_layout", ["contiguous", "transposed", "expanded"])
def test_gather_dims_index_dtypes_and_layouts(dim, index_dtype, index_layout):
    x = make((5, 6))
    shape = (4, 4)
    if index_layout == "contiguous":
        i = rand_index(shape, x.shape[dim], index_dtype)
    elif index_layout == "transposed":
        i = rand_index(shape[::-1], x.shape[dim], index_dtype).t()
    else:
        i = rand_index((4, 1), x.shape[dim], index_dtype).expand(shape)

    def fn(fd):
        fd.add_output(fd.ops.gather(fd.from_pytorch(x), fd.from_pytorch(i), dim))

    check_fusion(fn, [x, i], lambda x, i: torch.gather(x, dim, i.long()))


def test_gather_then_reduce_style_pointwise():
    x, i = make((4, 8)), rand_index((4, 3), 8)

    def fn(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(i)
        g = fd.ops.gather(t0, t1, 1)
        fd.add_output(fd.ops.exp(g))

    check_fusion(fn, [x, i], lambda x, i: torch.exp(torch.gather(x, 1, i)), atol=1e-6, rtol=1e-6)


def test_gather_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.gather: tensors must have equal rank \('arg' has rank 2, 'index' has rank 1\)"):
        define(lambda fd: fd.ops.gather(fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int), 0))
    with pytest.raises(FusionDtypeError, match=r"gather: argument 'index' must be an Int or Int32 tensor, got DataType.Half"):
        define(lambda fd: fd.ops.gather(fd.define_tensor([-1]), fd.define_tensor([-1], dtype=DataType.Half), 0))
    with pytest.raises(FusionDefinitionError, match=r"gather: 'index' has size 5 in dim 1, larger than 4 of 'arg'"):
        define(lambda fd: fd.ops.gather(fd.define_tensor([3, 4]), fd.define_tensor([2, 5], dtype=DataType.Int), 0))
    with pytest.raises(FusionDefinitionError, match=r"gather: argument 'dim'=2 is out of range"):
        define(lambda fd: fd.ops.gather(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), 2))
    with pytest.raises(FusionDefinitionError, match=r"gather: argument 'arg' must have rank >= 1"):
        define(lambda fd: fd.ops.gather(fd.define_tensor([]), fd.define_tensor([], dtype=DataType.Int), 0))


def test_gather_larger_index_along_dim_is_allowed():
    # Only the non-gathered dims are bounded by arg: the gathered dim may be longer than arg's.
    x, i = make((3, 4)), rand_index((3, 9), 4)

    def fn(fd):
        fd.add_output(fd.ops.gather(fd.define_tensor([3, 4]), fd.define_tensor([3, 9], dtype=DataType.Int), 1))

    check_fusion(fn, [x, i], lambda x, i: torch.gather(x, 1, i))


# ==============================================================================================================
# take_along_axis


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_take_along_axis_dtypes_layouts(dtype, layout):
    shape = (4, 6, 5) if layout == "stride_order" else (4, 6)
    x = make_arg(layout, shape, dtype)
    i = rand_index((4, 3, 5) if len(shape) == 3 else (4, 3), 6)

    def fn(fd):
        t0, t1 = define_input(fd, x, layout), fd.from_pytorch(i)
        fd.add_output(fd.ops.take_along_axis(t0, t1, 1))

    check_fusion(fn, [x, i], lambda x, i: torch.take_along_dim(x, i, 1), expected_segments=[kernel_kind("take_along_axis")])


@pytest.mark.parametrize(
    "x_shape,i_shape,dim",
    [
        ((4, 6), (1, 3), 1),  # index broadcast in the non-indexed dim
        ((1, 6), (4, 3), 1),  # arg broadcast in the non-indexed dim
        ((4, 6), (4, 1), 1),  # one index per row (argmax-like)
        ((5, 3, 4), (2, 3, 1), 0),
        ((5, 1, 4), (2, 3, 4), 0),
    ],
)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_take_along_axis_broadcasting(x_shape, i_shape, dim, index_dtype):
    x, i = make(x_shape), rand_index(i_shape, x_shape[dim], index_dtype)

    def fn(fd):
        fd.add_output(fd.ops.take_along_axis(fd.from_pytorch(x), fd.from_pytorch(i), dim))

    check_fusion(fn, [x, i], lambda x, i: torch.take_along_dim(x, i.long(), dim))


def test_take_along_axis_with_expanded_index_and_argsorted_index():
    x = make((4, 6))
    i_exp = rand_index((1, 6), 6).expand(4, 6)

    def fn(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(i_exp)
        fd.add_output(fd.ops.take_along_axis(t0, t1, 1))
        # The classic use: sort values with argsort indices.
        fd.add_output(fd.ops.take_along_axis(t0, fd.ops.argsort(t0, 1), 1))

    check_fusion(fn, [x, i_exp], lambda x, i: [torch.take_along_dim(x, i, 1), torch.sort(x, dim=1).values])


def test_take_along_axis_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.take_along_axis: tensors must have equal rank"):
        define(lambda fd: fd.ops.take_along_axis(fd.define_tensor([-1, -1]), fd.define_tensor([-1], dtype=DataType.Int), 0))
    with pytest.raises(FusionDefinitionError, match=r"take_along_axis: dim 0 has extent 4 in 'arg' but 3 in 'index'"):
        define(lambda fd: fd.ops.take_along_axis(fd.define_tensor([4, 5]), fd.define_tensor([3, 2], dtype=DataType.Int), 1))
    with pytest.raises(FusionDtypeError, match=r"take_along_axis: argument 'index' must be an Int or Int32 tensor, got DataType.Bool"):
        define(lambda fd: fd.ops.take_along_axis(fd.define_tensor([-1]), fd.define_tensor([-1], dtype=DataType.Bool), 0))
    with pytest.raises(FusionDefinitionError, match=r"take_along_axis: argument 'dim'=-3 is out of range"):
        define(lambda fd: fd.ops.take_along_axis(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=DataType.Int), -3))


# ==============================================================================================================
# scatter


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scatter_dtypes_layouts(dtype, layout):
    shape = (4, 6, 5) if layout == "stride_order" else (4, 6)
    x = make_arg(layout, shape, dtype)
    i_shape = (3, 4, 2) if len(shape) == 3 else (3, 4)
    i = unique_index(i_shape, 1, 6)
    src = make(i_shape, dtype)

    def fn(fd):
        t0, t1, t2 = define_input(fd, x, layout), fd.from_pytorch(i), fd.from_pytorch(src)
        fd.add_output(fd.ops.scatter(t0, t1, t2, 1))

    check_fusion(fn, [x, i, src], lambda x, i, s: torch.scatter(x, 1, i, s), expected_segments=[kernel_kind("scatter")])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_scatter_dims_and_larger_src(dim, index_dtype):
    x = make((5, 6))
    i = unique_index((3, 4), dim % 2, x.shape[dim], index_dtype)
    src = transposed((4, 5))  # larger than index in both dims, non-contiguous

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(i), fd.from_pytorch(src), dim))

    check_fusion(fn, [x, i, src], lambda x, i, s: torch.scatter(x, dim, i.long(), s))


@pytest.mark.parametrize("value", [2.5, -1])
def test_scatter_scalar_src(value):
    x, i = make((4, 6)), unique_index((4, 2), 1, 6)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(i), value, 1))

    check_fusion(fn, [x, i], lambda x, i: torch.scatter(x, 1, i, value))


def test_scatter_into_expanded_arg_materializes():
    # The expanded dim of arg is written with varying values: the result must not stay a broadcast, so it
    # combines with a same-shaped tensor like any other dim.
    x, y = expanded((4, 6), 0), make((4, 6))
    i = unique_index((4, 2), 1, 6)
    src = make((4, 2))

    def fn(fd):
        t = fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(i), fd.from_pytorch(src), 1)
        fd.add_output(t)
        fd.add_output(fd.ops.add(t, fd.from_pytorch(y)))

    def ref(x, i, s, y):
        out = torch.scatter(x, 1, i, s)
        return [out, out + y]

    check_fusion(fn, [x, i, src, y], ref)


def test_scatter_errors():
    def tv(fd, shape, dtype=DataType.Float):
        return fd.define_tensor(shape, dtype=dtype)

    with pytest.raises(FusionDtypeError, match=r"fd.ops.scatter: argument 'src' must have arg's dtype DataType.Float, got DataType.Half"):
        define(lambda fd: fd.ops.scatter(tv(fd, [-1, -1]), tv(fd, [-1, -1], DataType.Int), tv(fd, [-1, -1], DataType.Half), 0))
    with pytest.raises(FusionDefinitionError, match=r"scatter: tensors must have equal rank \('arg' has rank 2, 'index' has rank 2, 'src' has rank 1\)"):
        define(lambda fd: fd.ops.scatter(tv(fd, [-1, -1]), tv(fd, [-1, -1], DataType.Int), tv(fd, [-1]), 0))
    with pytest.raises(FusionDtypeError, match=r"scatter: argument 'index' must be an Int or Int32 tensor"):
        define(lambda fd: fd.ops.scatter(tv(fd, [-1]), tv(fd, [-1]), tv(fd, [-1]), 0))
    with pytest.raises(FusionDefinitionError, match=r"scatter: 'index' has size 5 in dim 0, larger than 4 of 'src'"):
        define(lambda fd: fd.ops.scatter(tv(fd, [9]), tv(fd, [5], DataType.Int), tv(fd, [4]), 0))
    with pytest.raises(FusionDefinitionError, match=r"scatter: 'index' has size 3 in dim 1, larger than 2 of 'arg'"):
        define(lambda fd: fd.ops.scatter(tv(fd, [4, 2]), tv(fd, [2, 3], DataType.Int), tv(fd, [4, 4]), 0))
    with pytest.raises(FusionDtypeError, match=r"scatter: argument 'src' is complex"):
        define(lambda fd: fd.ops.scatter(tv(fd, [-1]), tv(fd, [-1], DataType.Int), 1j, 0))
    with pytest.raises(FusionDefinitionError, match=r"scatter: argument 'dim'=1 is out of range"):
        define(lambda fd: fd.ops.scatter(tv(fd, [-1]), tv(fd, [-1], DataType.Int), tv(fd, [-1]), 1))


# ==============================================================================================================
# embedding_fwd


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("input_shape", [(5,), (2, 3), (2, 3, 2)])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_fwd_dtypes_shapes(dtype, input_shape, index_dtype):
    w = make((10, 4), dtype)
    i = rand_index(input_shape, 10, index_dtype)

    def fn(fd):
        fd.add_output(fd.ops.embedding_fwd(fd.from_pytorch(i), fd.from_pytorch(w)))

    outs = check_fusion(fn, [i, w], lambda i, w: F.embedding(i, w), expected_segments=["ExprEval"])
    assert outs[0].shape == (*input_shape, 4)


@pytest.mark.parametrize("layout", ["transposed_weight", "sliced_weight", "expanded_weight", "stride_order_weight", "transposed_input"])
def test_embedding_fwd_layouts_give_contiguous_output(layout):
    # The real result is a fresh contiguous tensor whatever the operands' layouts; check_fusion compares the
    # meta-inferred layout (the registered meta override) with the real one via the check_layouts option.
    w = {
        "transposed_weight": lambda: transposed((10, 4)),
        "sliced_weight": lambda: sliced((10, 4)),
        "expanded_weight": lambda: expanded((10, 4), 0),
        "stride_order_weight": lambda: with_stride_order((10, 4), [0, 1]),
    }.get(layout, lambda: make((10, 4)))()
    i = rand_index((3, 5), 10).t() if layout == "transposed_input" else rand_index((5, 3), 10)

    def fn(fd):
        t0 = fd.from_pytorch(i)
        t1 = define_input(fd, w, "stride_order" if layout == "stride_order_weight" else None)
        fd.add_output(fd.ops.embedding_fwd(t0, t1))

    outs = check_fusion(fn, [i, w], lambda i, w: F.embedding(i, w))
    assert outs[0].is_contiguous()


def test_embedding_fwd_meta_matches_real():
    # Eager ATen on meta tensors vs on real ones, and pyfuser's override, for several layouts.
    from pyfuser.ops import registry

    opdef = registry.get("embedding_fwd")
    for w in (make((10, 4)), transposed((10, 4)), expanded((10, 4), 0)):
        for i in (rand_index((5, 3), 10), rand_index((3, 5), 10).t()):
            real = F.embedding(i, w)
            meta = opdef.meta(None, torch.empty_strided(i.shape, i.stride(), dtype=i.dtype, device="meta"),
                              torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device="meta"))
            assert meta.device.type == "meta"
            assert (meta.shape, meta.stride(), meta.dtype) == (real.shape, real.stride(), real.dtype)


@pytest.mark.parametrize(
    "options",
    [
        dict(padding_idx=2),
        dict(padding_idx=-1),
        dict(scale_grad_by_freq=True, sparse=True),
        dict(max_norm=0.5),
        dict(max_norm=1.0, norm_type=1.0),
    ],
)
def test_embedding_fwd_options(options):
    w, i = make((10, 4)), rand_index((6,), 10)

    def fn(fd):
        fd.add_output(fd.ops.embedding_fwd(fd.from_pytorch(i), fd.from_pytorch(w), **options))

    check_fusion(fn, [i, w], lambda i, w: F.embedding(i, w, **options))


def test_embedding_fwd_max_norm_renormalizes_weight_in_place_like_eager():
    w, i = make((10, 4)) * 3, torch.tensor([1, 4, 4], device=DEVICE)
    w_eager = w.clone()
    ref = F.embedding(i, w_eager, max_norm=1.0)
    fd = define(lambda fd: fd.add_output(fd.ops.embedding_fwd(fd.from_pytorch(i), fd.from_pytorch(w), max_norm=1.0)))
    (out,) = fd.execute([i, w])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, w_eager)  # rows 1 and 4 renormalized, the rest untouched


def test_embedding_fwd_scalar_options():
    w, i = make((10, 4)) * 3, rand_index((6,), 10)

    def fn(fd):
        t0, t1 = fd.from_pytorch(i), fd.from_pytorch(w)
        pad, norm = fd.define_scalar(None, dtype=DataType.Int), fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.embedding_fwd(t0, t1, padding_idx=pad, max_norm=norm))

    check_fusion(fn, [i, w, 3, 1.5], lambda i, w, p, n: F.embedding(i, w, padding_idx=p, max_norm=n))


def test_embedding_fwd_feeds_pointwise():
    w, i = make((10, 4)), rand_index((2, 3), 10)

    def fn(fd):
        e = fd.ops.embedding_fwd(fd.from_pytorch(i), fd.from_pytorch(w))
        fd.add_output(fd.ops.mul(e, 2.0))

    check_fusion(fn, [i, w], lambda i, w: F.embedding(i, w) * 2.0, expected_segments=["ExprEval", "PointWise"])


def test_embedding_fwd_errors():
    def emb(fd, i_dtype=DataType.Int, w_shape=(-1, -1), **kw):
        return fd.ops.embedding_fwd(fd.define_tensor([-1], dtype=i_dtype), fd.define_tensor(list(w_shape)), **kw)

    with pytest.raises(FusionDtypeError, match=r"fd.ops.embedding_fwd: argument 'input' must be an Int or Int32 tensor, got DataType.Float"):
        define(lambda fd: emb(fd, DataType.Float))
    with pytest.raises(FusionDefinitionError, match=r"embedding_fwd: argument 'weight' must be a 2-D tensor, got rank 3"):
        define(lambda fd: emb(fd, w_shape=(-1, -1, -1)))
    with pytest.raises(FusionDefinitionError, match=r"embedding_fwd: argument 'padding_idx'=10 is out of range for a weight with 10 rows"):
        define(lambda fd: emb(fd, w_shape=(10, 4), padding_idx=10))
    with pytest.raises(FusionDtypeError, match=r"embedding_fwd: argument 'padding_idx' must be an int"):
        define(lambda fd: emb(fd, padding_idx=1.5))
    with pytest.raises(FusionDtypeError, match=r"embedding_fwd: argument 'max_norm' must be a float"):
        define(lambda fd: emb(fd, max_norm=True))
    with pytest.raises(FusionDtypeError, match=r"embedding_fwd: argument 'sparse' must be a bool"):
        define(lambda fd: emb(fd, sparse=1))
