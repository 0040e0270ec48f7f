"""Shape ops: broadcast, broadcast_in_dim, expand, reshape, permute, squeeze, slice, pad, cat, stride_order.

Every op is compared with an eager PyTorch reference (values, shapes, dtypes, strides) by ``check_fusion``.
View ops must also alias exactly as eager does: ``check_view`` runs the fusion on the original input and asserts
that the output shares the input's storage (same storage offset) iff the eager reference does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness import STRIDE_ORDER_3D, with_layout, kernel_kind, DEVICE, check_fusion, define, expanded, make, sliced, transposed

from pyfuser import DataType, FusionDefinitionError, FusionDtypeError, FusionExecutionError, UnsupportedOpError
from pyfuser.frontend.pytorch_utils import torch_dtype_to_nvfuser_dtype

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "stride_order"]

# The stride_order layout: dim 0 fastest, then dim 2, then dim 1 (allocation order [1, 2, 0]).
_STRIDE_ORDER_3D = STRIDE_ORDER_3D


# --- helpers ---------------------------------------------------------------------------------------------------


layout_input = with_layout  # a tensor of ``shape`` (rank 2 or 3) with the given memory layout


def define_input(fd, t: torch.Tensor, layout: str):
    """The stride_order layout is declared explicitly with define_tensor(stride_order=...); others via from_pytorch."""
    if layout == "stride_order":
        rank = t.dim()
        return fd.define_tensor(
            shape=[-1] * rank,
            contiguity=[True] * rank,
            dtype=torch_dtype_to_nvfuser_dtype(t.dtype),
            stride_order=_STRIDE_ORDER_3D if rank == 3 else [0, 1],
        )
    return fd.from_pytorch(t)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def check_view(fn, inputs, reference, *, expected_segments=("ExprEval",)):
    """check_fusion, then aliasing parity with eager: run on the inputs themselves (no copies) and require each
    output to alias inputs[0] (with the same storage offset) exactly when the eager reference does."""
    outs = check_fusion(fn, inputs, reference, expected_segments=expected_segments)
    fd = define(fn)
    outs = fd.execute(list(inputs))
    refs = reference(*inputs)
    refs = refs if isinstance(refs, (list, tuple)) else [refs]
    for o, r in zip(outs, refs):
        assert same_storage(o, inputs[0]) == same_storage(r, inputs[0]), "aliasing differs from eager"
        if same_storage(r, inputs[0]):
            assert o.storage_offset() == r.storage_offset()
    return outs


def assert_aliases(out: torch.Tensor, inp: torch.Tensor):
    assert same_storage(out, inp), "expected a view of the input"


def raises(exc, match, fn):
    """Defining ``fn`` raises ``exc`` whose message names the op."""
    with pytest.raises(exc, match=match):
        define(fn)


# --- broadcast ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_broadcast(layout, dtype):
    x = layout_input(layout, (4, 5, 3), dtype)

    def fn(fd):
        t0 = define_input(fd, x, layout)
        fd.add_output(fd.ops.broadcast(t0, [True, False, False, True, False]))

    outs = check_view(fn, [x], lambda x: x.unsqueeze(0).unsqueeze(3))
    assert outs[0].shape == (1, 4, 5, 1, 3)
    assert_aliases(outs[0], x)


def test_broadcast_domain_and_repr():
    fd = define(lambda fd: fd.add_output(fd.ops.broadcast(fd.define_tensor([-1, 3]), [False, True, False])))
    out = fd.fusion.outputs[0]
    assert [d.is_broadcast for d in out.logical_domain] == [False, True, False]
    assert out.static_shape() == [None, 1, 3]
    assert "fd.ops.broadcast(tv0, is_broadcast_dim=[False, True, False])" in repr(fd)


# --- broadcast_in_dim --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_broadcast_in_dim_new_dims(layout, dtype):
    x = layout_input(layout, (4, 5, 3), dtype)

    def fn(fd):
        t0 = define_input(fd, x, layout)
        fd.add_output(fd.ops.broadcast_in_dim(t0, shape=[2, 4, 5, 1, 3], broadcast_dims=[1, 2, 4]))

    outs = check_view(fn, [x], lambda x: x.unsqueeze(0).unsqueeze(3).expand(2, 4, 5, 1, 3))
    assert outs[0].stride()[0] == 0
    assert_aliases(outs[0], x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_in_dim_grows_size_one_dims(dtype):
    x = make((4, 1, 3), dtype)

    def fn(fd):
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.broadcast_in_dim(t0, shape=[4, 6, 3], broadcast_dims=[0, 1, 2]))

    outs = check_view(fn, [x], lambda x: x.expand(4, 6, 3))
    assert outs[0].stride()[1] == 0


def test_broadcast_in_dim_domain():
    def fn(fd):
        t0 = fd.define_tensor([-1, 1, 3])
        n = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.broadcast_in_dim(t0, shape=[7, 5, n, 3, 1], broadcast_dims=[1, 2, 3]))

    fd = define(fn)
    dom = fd.fusion.outputs[0].logical_domain
    # new dim to 7: expanded; input dim 0 (symbolic) promoted to 5; size-1 input dim to symbolic n: expanded
    # with unknown extent; 3 kept; new dim to 1: plain broadcast.
    assert [(d.extent, d.is_broadcast, d.expanded) for d in dom] == [
        (7, True, True),
        (5, False, False),
        (None, True, True),
        (3, False, False),
        (1, True, False),
    ]
    x = make((5, 1, 3))
    out = fd.execute([x, 6])[0]
    torch.testing.assert_close(out, x.unsqueeze(0).unsqueeze(4).expand(7, 5, 6, 3, 1))
    assert out.stride()[0] == 0 and out.stride()[2] == 0


@pytest.mark.parametrize("kind", ["scalars", "vector", "shape_of"])
def test_broadcast_in_dim_symbolic_shape(kind):
    x = make((4, 1))
    y = make((3, 4, 6))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        t1 = fd.from_pytorch(y)
        if kind == "scalars":
            shape = [t1.size(0), t1.size(1), t1.size(2)]
        elif kind == "vector":
            shape = fd.define_vector([fd.ops.size(t1, 0), fd.ops.size(t1, 1), fd.ops.size(t1, -1)])
        else:
            shape = fd.ops.shape(t1)
        t2 = fd.ops.broadcast_in_dim(t0, shape=shape, broadcast_dims=[1, 2])
        fd.add_output(t2)
        fd.add_output(fd.ops.add(t2, t1))

    def ref(x, y):
        v = x.unsqueeze(0).expand(3, 4, 6)
        return v, v + y

    outs = check_fusion(fn, [x, y], ref)
    assert outs[0].stride() == (0, 1, 0)


# --- expand ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "layout,shape,target",
    [
        ("contiguous", (4, 1, 5), [4, 3, 5]),
        ("contiguous", (4, 1, 5), [-1, 3, -1]),
        ("contiguous", (4, 1, 5), [2, 4, 3, 5]),  # a new leading dim
        ("transposed", (4, 1, 5), [4, 6, 5]),
        ("sliced", (1, 4, 5), [3, 4, 5]),
        ("expanded", (4, 2, 5), [-1, 2, 5]),  # an already-expanded dim kept
    ],
)
def test_expand(layout, shape, target, dtype):
    x = layout_input(layout, shape, dtype)

    def fn(fd):
        fd.add_output(fd.ops.expand(fd.from_pytorch(x), shape=target))

    outs = check_view(fn, [x], lambda x: x.expand(*target))
    assert 0 in outs[0].stride()
    assert_aliases(outs[0], x)


def test_expand_stride_order_input():
    x = layout_input("stride_order", (4, 5, 6))[:, :1, :]  # keep stride order [0, 2, 1] with a size-1 dim

    def fn(fd):
        t0 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[None, False, True], stride_order=_STRIDE_ORDER_3D)
        fd.add_output(fd.ops.expand(t0, shape=[4, 3, 6]))

    outs = check_view(fn, [x], lambda x: x.expand(4, 3, 6))
    assert outs[0].stride()[1] == 0


def test_expand_symbolic():
    x = make((1, 5))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        n = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.expand(t0, shape=[n, -1]))

    fd = define(fn)
    assert fd.fusion.outputs[0].logical_domain[0].expanded and fd.fusion.outputs[0].logical_domain[0].extent is None
    out = fd.execute([x, 7])[0]
    assert out.shape == (7, 5) and out.stride() == (0, 1)
    check_view(fn, [x, 7], lambda x, n: x.expand(n, -1))


# --- reshape -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "layout,shape,new_shape",
    [
        ("contiguous", (4, 6), [2, 2, 6]),  # view
        ("contiguous", (4, 6), [-1]),  # view, inferred extent
        ("transposed", (4, 6), [24]),  # not viewable: a copy, as in eager
        ("transposed", (4, 6), [4, 3, 2]),  # not viewable either
        ("sliced", (4, 6), [2, 2, 6]),  # splitting the outer dim of a sliced tensor is a view
        ("sliced", (4, 6), [4, 2, 3]),  # so is splitting its inner dim
        ("sliced", (4, 6), [24]),  # merging across the gap: copy
        ("expanded", (4, 6), [2, 2, 6]),  # splitting an expanded dim: a stride-0 view
        ("expanded", (4, 6), [-1, 3]),  # copy
        ("stride_order", (4, 5, 6), [4, 30]),  # copy
        ("stride_order", (4, 5, 6), [4, 5, 2, 3]),  # view
    ],
)
def test_reshape(layout, shape, new_shape, dtype):
    x = layout_input(layout, shape, dtype)

    def fn(fd):
        fd.add_output(fd.ops.reshape(define_input(fd, x, layout), new_shape=new_shape))

    check_view(fn, [x], lambda x: x.reshape(new_shape))


def test_reshape_static_domain():
    fd = define(lambda fd: fd.add_output(fd.ops.reshape(fd.define_tensor([4, 6]), new_shape=[2, 1, -1])))
    out = fd.fusion.outputs[0]
    assert out.static_shape() == [2, 1, 12]
    assert [d.is_broadcast for d in out.logical_domain] == [False, True, False]


def test_reshape_symbolic_vector():
    x = make((4, 6))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        v = fd.define_vector(3)
        fd.add_output(fd.ops.reshape(t0, new_shape=v))

    fd = define(fn)
    assert fd.fusion.outputs[0].static_shape() == [None, None, None]
    check_view(fn, [x, [2, 3, 4]], lambda x, *s: x.reshape(2, 3, 4))
    check_view(fn, [x, [3, -1, 2]], lambda x, *s: x.reshape(3, -1, 2))


def test_reshape_with_sizes_of_inputs():
    x = make((4, 6))
    y = make((2, 12))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        t1 = fd.from_pytorch(y)
        t2 = fd.ops.reshape(t0, new_shape=fd.ops.shape(t1))
        fd.add_output(fd.ops.mul(t2, t1))

    check_fusion(fn, [x, y], lambda x, y: x.reshape(2, 12) * y)


# --- permute -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dims", [[2, 0, 1], [-1, -3, 1]])
def test_permute(layout, dtype, dims):
    x = layout_input(layout, (4, 5, 3), dtype)

    def fn(fd):
        fd.add_output(fd.ops.permute(define_input(fd, x, layout), dims=dims))

    outs = check_view(fn, [x], lambda x: x.permute(*dims))
    assert_aliases(outs[0], x)


def test_permute_prints_non_negative_dims():
    fd = define(lambda fd: fd.add_output(fd.ops.permute(fd.define_tensor([-1, -1, -1]), [-1, 0, -2])))
    assert "fd.ops.permute(tv0, dims=[2, 0, 1])" in repr(fd)


# --- squeeze -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [[1], [-3], [1, -1], [3, 1]])
def test_squeeze(dtype, dims):
    x = make((4, 1, 5, 1), dtype)

    def fn(fd):
        fd.add_output(fd.ops.squeeze(fd.from_pytorch(x), dims=dims))

    outs = check_view(fn, [x], lambda x: x.squeeze(tuple(dims)))
    assert_aliases(outs[0], x)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "stride_order"])
def test_squeeze_non_contiguous(layout):
    base = layout_input(layout, (4, 5, 6))
    x = base[:, 2:3, :]  # a size-1 dim in a non-contiguous tensor, layout kept

    def fn(fd):
        fd.add_output(fd.ops.squeeze(fd.from_pytorch(x), dims=[1]))

    outs = check_view(fn, [x], lambda x: x.squeeze(1))
    assert outs[0].storage_offset() == x.storage_offset()


def test_squeeze_expanded():
    x = expanded((4, 3, 5), 1)

    def fn(fd):
        fd.add_output(fd.ops.squeeze(fd.from_pytorch(x), dims=[1], squeeze_expanded=True))

    fd = define(fn)
    assert "squeeze_expanded=True" in repr(fd)
    check_view(fn, [x], lambda x: x[:, 0])


def test_squeeze_after_broadcast_in_dim():
    x = make((4, 5))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.broadcast_in_dim(t0, shape=[4, 1, 5], broadcast_dims=[0, 2])
        fd.add_output(fd.ops.squeeze(t1, dims=[1]))

    check_view(fn, [x], lambda x: x.unsqueeze(1).squeeze(1))


# --- slice -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "starts,ends",
    [
        ([1, 0, 1], [3, 5, 3]),
        ([-3, 0, -2], [-1, 5, 3]),  # negative bounds wrap
        ([0, -100, 1], [100, 4, 100]),  # out-of-range bounds are clamped
        ([2, 3, 0], [2, 3, 3]),  # empty slices
        ([-1, 3, 0], [1, 3, 3]),  # an end below its start once wrapped: empty (constant ones are refused)
    ],
)
def test_slice(layout, dtype, starts, ends):
    x = layout_input(layout, (4, 5, 3), dtype)

    def fn(fd):
        fd.add_output(fd.ops.slice(define_input(fd, x, layout), start_indices=starts, end_indices=ends))

    def ref(x):
        return x[starts[0] : ends[0], starts[1] : ends[1], starts[2] : ends[2]]

    outs = check_view(fn, [x], ref)
    assert_aliases(outs[0], x)


def test_slice_static_normalization_prints_normalized_bounds():
    x = make((6, 7))

    def fn(fd):
        t0 = fd.from_pytorch(x, static_sizes=True)
        fd.add_output(fd.ops.slice(t0, [-4, 2], [-1, 100], strides=[1, 1]))

    fd = define(fn)
    text = repr(fd)
    assert "start_indices=[2, 2], end_indices=[5, 7], strides=[1, 1], manual_normalization=True" in text
    assert fd.fusion.outputs[0].static_shape() == [3, 5]
    check_view(fn, [x], lambda x: x[-4:-1, 2:100])


def test_slice_symbolic_extent_normalized_at_run_time():
    def fn(fd):
        t0 = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.slice(t0, [-4, 2], [-1, 100]))

    fd = define(fn)
    assert "manual_normalization" not in repr(fd)
    assert fd.fusion.outputs[0].static_shape() == [None, None]
    for shape in [(6, 7), (3, 2), (10, 1)]:
        x = make(shape)
        check_view(fn, [x], lambda x: x[-4:-1, 2:100])


def test_slice_scalar_bounds():
    x = make((6, 7))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        s = fd.define_scalar(None, dtype=DataType.Int)
        e = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.slice(t0, [s, 0], [e, fd.ops.size(t0, 1)]))

    for s, e in [(1, 4), (-3, -1), (-100, 100), (5, 2)]:
        # (fd.ops.size is a host op; where it lands is the segmenter's business, so only the segment that
        # produces the output is checked.)
        check_view(fn, [x, s, e], lambda x, s, e: x[s:e, :], expected_segments=None)
    fd = define(fn)
    fd.execute([x, 1, 4])
    assert [s.kind.value for s in fd.segments() if fd.fusion.outputs[0] in s.outputs] == ["ExprEval"]


def test_slice_manual_normalization():
    x = make((6, 7))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        e = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.slice(t0, [1, 0], [e, 7], manual_normalization=True))

    check_view(fn, [x, 4], lambda x, e: x[1:e, 0:7])
    fd = define(fn)
    with pytest.raises(FusionExecutionError, match="slice"):
        fd.execute([x, 9])  # beyond the extent: manual normalization does not clamp


def test_slice_of_expanded_dim_keeps_stride_zero():
    x = expanded((6, 5), 0)

    def fn(fd):
        fd.add_output(fd.ops.slice(fd.from_pytorch(x), [1, 0], [4, 5]))

    fd = define(fn)
    assert fd.fusion.outputs[0].logical_domain[0].expanded
    outs = check_view(fn, [x], lambda x: x[1:4])
    assert outs[0].stride()[0] == 0


# --- the #4888 view chain ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("last", ["broadcast_in_dim", "expand"])
def test_issue4888_view_chain(last):
    x = make((64, 65), torch.bfloat16)
    y = make((1, 4, 64, 64), torch.bfloat16)

    def fn(fd):
        t0 = fd.from_pytorch(x)
        t3 = fd.from_pytorch(y)
        t1 = fd.ops.broadcast_in_dim(t0, shape=[1, 1, 64, 65], broadcast_dims=[2, 3])
        t2 = fd.ops.slice(t1, start_indices=[0, 0, 0, 0], end_indices=[1, 1, 64, 64])
        if last == "expand":
            t49 = fd.ops.expand(t2, shape=[1, 4, 64, 64])
        else:
            t49 = fd.ops.broadcast_in_dim(t2, shape=[1, 4, 64, 64], broadcast_dims=[0, 1, 2, 3])
        fd.add_output(t49)
        # A kernel segment reads the non-contiguous view, as the softmax does in #4888.
        fd.add_output(fd.ops.add(fd.ops.mul(t3, 0.5), t49))

    def ref(x, y):
        v = x.unsqueeze(0).unsqueeze(0)[:, :, :, :64].expand(1, 4, 64, 64)
        return v, y.float() * 0.5 + v.float()

    check_fusion(fn, [x, y], ref, expected_segments=["ExprEval", "PointWise"])
    fd = define(fn)
    out = fd.execute([x, y], _enable_options=["check_layouts"])[0]
    assert_aliases(out, x)
    assert out.shape == (1, 4, 64, 64)
    assert out.stride()[1:] == (0, 65, 1)
    segment_of_out = next(s for s in fd.segments() if fd.fusion.outputs[0] in s.outputs)
    assert segment_of_out.kind.value == "ExprEval"
    layout = fd.last_runtime().layout(fd.fusion.outputs[0])
    assert layout.strides[1:] == (0, 65, 1)
    assert list(layout.contiguity) == [None, None, False, True]


# --- pad ---------------------------------------------------------------------------------------------------------

_PAD_VALUES = {torch.float32: 1.5, torch.bfloat16: -2.0, torch.int64: 7, torch.bool: True}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("widths", [[1, 2], [1, 0, 0, 2], [2, -1, 1, 1, 0, 3], [0, 0]])
@pytest.mark.parametrize("with_value", [False, True])
def test_pad(layout, dtype, widths, with_value):
    x = layout_input(layout, (4, 5, 3), dtype)
    value = _PAD_VALUES[dtype] if with_value else None

    def fn(fd):
        t0 = define_input(fd, x, layout)
        out = fd.ops.pad(t0, widths, value) if with_value else fd.ops.pad(t0, widths)
        fd.add_output(out)

    def ref(x):
        return F.pad(x, widths, value=value) if with_value else F.pad(x, widths)

    outs = check_fusion(fn, [x], ref, expected_segments=[kernel_kind("pad")])
    assert not same_storage(outs[0], x)
    if not with_value and widths[0] > 0:
        assert not outs[0][..., 0].any()  # default fill: 0 / False


def test_pad_static_extents_and_expanded_input():
    x = expanded((4, 5), 0)

    def fn(fd):
        fd.add_output(fd.ops.pad(fd.from_pytorch(x, static_sizes=True), [1, -2]))

    fd = define(fn)
    out_tv = fd.fusion.outputs[0]
    assert out_tv.static_shape() == [4, 4]
    assert not out_tv.logical_domain[0].is_broadcast  # written out in full, like F.pad does
    outs = check_fusion(fn, [x], lambda x: F.pad(x, [1, -2]))
    assert outs[0].stride() == (4, 1)


def test_pad_symbolic_width():
    x = make((3, 4))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        w = fd.define_scalar(None, dtype=DataType.Int)
        v = fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.pad(t0, [w, 1, 2, w], v))

    fd = define(fn)
    assert fd.fusion.outputs[0].static_shape() == [None, None]
    check_fusion(fn, [x, 2, 0.25], lambda x, w, v: F.pad(x, [w, 1, 2, w], value=v))


# --- cat ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(layout, dtype, dim):
    a = layout_input(layout, (4, 5, 3), dtype)
    shape_b = [4, 5, 3]
    shape_b[dim] = 2
    b = make(shape_b, dtype)

    def fn(fd):
        ta = define_input(fd, a, layout)
        tb = fd.from_pytorch(b)
        fd.add_output(fd.ops.cat([ta, tb], dim=dim))

    outs = check_fusion(fn, [a, b], lambda a, b: torch.cat([a, b], dim), expected_segments=[kernel_kind("cat")])
    assert not same_storage(outs[0], a)


def test_cat_three_inputs_static_extent_and_repr():
    xs = [make((2, 3)), make((4, 3)), make((1, 3))]

    def fn(fd):
        ts = [fd.from_pytorch(x, static_sizes=True) for x in xs]
        fd.add_output(fd.ops.cat(ts, -2))

    fd = define(fn)
    assert fd.fusion.outputs[0].static_shape() == [7, 3]
    assert "fd.ops.cat([tv0, tv1, tv2])"  # dim=0 is the default: not printed in repr(fd)
    check_fusion(fn, xs, lambda *xs: torch.cat(xs, 0))


def test_cat_channels_last():
    # torch.cat keeps a common channels-last layout; the evaluator is torch.cat, so does pyfuser.
    a = make((2, 3, 4, 5)).to(memory_format=torch.channels_last)
    b = make((2, 2, 4, 5)).to(memory_format=torch.channels_last)

    def fn(fd):
        fd.add_output(fd.ops.cat([fd.from_pytorch(a), fd.from_pytorch(b)], dim=1))

    check_fusion(fn, [a, b], lambda a, b: torch.cat([a, b], 1))


# --- stride_order ------------------------------------------------------------------------------------------------


def _eager_stride_order(x: torch.Tensor, order):
    """Eager reference: lay ``x`` out so that dim i's stride has rank order[i] (0 = fastest)."""
    rank = x.dim()
    alloc = sorted(range(rank), key=lambda d: -(order[d] % rank))  # outermost first
    inverse = [alloc.index(d) for d in range(rank)]
    return x.permute(alloc).contiguous().permute(inverse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 0, 2], [-1, 0, 1]])
def test_stride_order(layout, dtype, order):
    x = layout_input(layout, (4, 5, 3), dtype)

    def fn(fd):
        fd.add_output(fd.ops.stride_order(define_input(fd, x, layout), order))

    outs = check_fusion(fn, [x], lambda x: _eager_stride_order(x, order), expected_segments=["PointWise"])
    out = outs[0]
    assert not same_storage(out, x)
    # Strides follow the requested order: a larger order entry means a larger stride.
    rank = out.dim()
    by_order = sorted(range(rank), key=lambda d: order[d] % rank)
    strides = [out.stride(d) for d in by_order]
    assert strides == sorted(strides) and strides[0] == 1


def test_stride_order_tv_and_repr():
    fd = define(lambda fd: fd.add_output(fd.ops.stride_order(fd.define_tensor([-1, -1, -1]), [-3, 2, 1])))
    out = fd.fusion.outputs[0]
    assert out.stride_order() == [0, 2, 1]
    assert out.alloc_order == (1, 2, 0)
    assert "fd.ops.stride_order(tv0, stride_order=[0, 2, 1])" in repr(fd)


def test_stride_order_feeds_views():
    x = make((4, 5, 3))

    def fn(fd):
        t1 = fd.ops.stride_order(fd.from_pytorch(x), [0, 1, 2])
        t2 = fd.ops.permute(t1, [2, 1, 0])
        fd.add_output(fd.ops.slice(t2, [1, 0, 0], [3, 5, 4]))

    def ref(x):
        return _eager_stride_order(x, [0, 1, 2]).permute(2, 1, 0)[1:3]

    outs = check_fusion(fn, [x], ref, expected_segments=["PointWise", "ExprEval"])
    assert outs[0].is_contiguous()


# --- segmentation: views between kernels are not copies ----------------------------------------------------------


def test_views_inside_kernel_segment():
    x = make((4, 5))
    y = make((5, 4))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        t1 = fd.from_pytorch(y)
        t2 = fd.ops.permute(t0, [1, 0])
        t3 = fd.ops.reshape(fd.ops.add(t2, t1), [20])
        fd.add_output(fd.ops.mul(t3, 2.0))

    # permute is re-indexing inside the kernel; reshape reads its input through a view of memory, so the sum
    # it reshapes is written out by the first kernel and the second reads it re-strided.
    check_fusion(
        fn, [x, y], lambda x, y: ((x.t() + y).reshape(20)) * 2.0, expected_segments=["PointWise", "PointWise"]
    )


# --- definition-time errors --------------------------------------------------------------------------------------


def _t(fd, shape=(-1, -1, -1), dtype=DataType.Float):
    return fd.define_tensor(list(shape), dtype=dtype)


_ERRORS = {
    # broadcast
    "broadcast_count": (lambda fd: fd.ops.broadcast(_t(fd), [True, False]), FusionDefinitionError, "fd.ops.broadcast: .*rank 3"),
    "broadcast_type": (lambda fd: fd.ops.broadcast(_t(fd), [1, 0, 0, 0]), FusionDtypeError, "fd.ops.broadcast: .*bools"),
    # broadcast_in_dim
    "bid_dims_len": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [2, 3, 4, 5], [0, 1]),
        FusionDefinitionError,
        "fd.ops.broadcast_in_dim: argument 'broadcast_dims'.*rank 3",
    ),
    "bid_shape_short": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [2, 3], [0, 1, 2]),
        FusionDefinitionError,
        "fd.ops.broadcast_in_dim: argument 'shape'.*fewer",
    ),
    "bid_not_increasing": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [2, 3, 4, 5], [0, 2, 1]),
        FusionDefinitionError,
        "strictly increasing",
    ),
    "bid_dim_range": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [2, 3, 4, 5], [0, 1, 4]),
        FusionDefinitionError,
        "fd.ops.broadcast_in_dim: argument 'broadcast_dims'=4 is out of range",
    ),
    "bid_incompatible": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd, (3, 4)), [3, 5], [0, 1]),
        FusionDefinitionError,
        r"fd.ops.broadcast_in_dim: argument 'shape'\[1\].*extent 4 to 5",
    ),
    "bid_float_shape": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [2.0, 3, 4], [0, 1, 2]),
        FusionDtypeError,
        "fd.ops.broadcast_in_dim: argument 'shape'",
    ),
    "bid_new_dim_minus_one": (
        lambda fd: fd.ops.broadcast_in_dim(_t(fd), [-1, 3, 4, 5], [1, 2, 3]),
        FusionDefinitionError,
        "only allowed for dims mapped",
    ),
    # expand
    "expand_short": (lambda fd: fd.ops.expand(_t(fd), [3, 4]), FusionDefinitionError, "fd.ops.expand: argument 'shape'.*fewer"),
    "expand_incompatible": (
        lambda fd: fd.ops.expand(_t(fd, (3, 1)), [4, 5]),
        FusionDefinitionError,
        r"fd.ops.expand: argument 'shape'\[0\].*extent 3 to 4",
    ),
    "expand_negative": (lambda fd: fd.ops.expand(_t(fd, (3, 1)), [3, -2]), FusionDefinitionError, "negative"),
    "expand_new_minus_one": (lambda fd: fd.ops.expand(_t(fd, (3, 1)), [-1, 3, 1]), FusionDefinitionError, "new leading"),
    # reshape
    "reshape_count": (
        lambda fd: fd.ops.reshape(_t(fd, (3, 14)), [3, 2, 8]),
        FusionDefinitionError,
        "fd.ops.reshape: argument 'new_shape'.*48 elements but the input has 42",
    ),
    "reshape_two_inferred": (
        lambda fd: fd.ops.reshape(_t(fd, (3, 14)), [3, -1, -1]),
        FusionDefinitionError,
        "at most one",
    ),
    "reshape_indivisible": (lambda fd: fd.ops.reshape(_t(fd, (3, 14)), [4, -1]), FusionDefinitionError, "cannot infer"),
    "reshape_bad_extent": (lambda fd: fd.ops.reshape(_t(fd), [3, -2]), FusionDefinitionError, "new_shape'\\[1\\]=-2"),
    # permute
    "permute_len": (lambda fd: fd.ops.permute(_t(fd), [0, 1]), FusionDefinitionError, "fd.ops.permute: argument 'dims'.*rank 3"),
    "permute_dup": (lambda fd: fd.ops.permute(_t(fd), [0, 1, 1]), FusionDefinitionError, "repeats a dim"),
    "permute_range": (lambda fd: fd.ops.permute(_t(fd), [0, 1, 3]), FusionDefinitionError, "out of range"),
    "permute_float": (lambda fd: fd.ops.permute(_t(fd), [0.0, 1, 2]), FusionDtypeError, "fd.ops.permute: argument 'dims'"),
    # squeeze
    "squeeze_non_broadcast": (
        lambda fd: fd.ops.squeeze(_t(fd, (-1, 1, 4)), [2]),
        FusionDefinitionError,
        "fd.ops.squeeze: argument 'dims': dim 2 .*not a broadcast",
    ),
    # A symbolic extent may be squeezed (nvFuser allows it; it must be 1 at run time): test_conformance_ops.py.
    "squeeze_static_non_one": (lambda fd: fd.ops.squeeze(fd.define_tensor([3, -1]), [0]), FusionDefinitionError,
                               "not a broadcast"),
    "squeeze_expanded": (
        lambda fd: fd.ops.squeeze(fd.define_tensor([4, 3], contiguity=[True, None]), [1]),
        FusionDefinitionError,
        "squeeze_expanded=True",
    ),
    "squeeze_range": (lambda fd: fd.ops.squeeze(_t(fd, (1, 2)), [2]), FusionDefinitionError, "out of range"),
    # slice
    # (each message also carries nvFuser's own sentence for the check, which code written for nvFuser matches on)
    "slice_step": (lambda fd: fd.ops.slice(_t(fd), [0, 0, 0], [2, 2, 2], [1, 2, 1]), UnsupportedOpError,
                   r"fd.ops.slice: argument 'strides'\[1\]=2.*All slice operation strides must be of const size 1"),
    "slice_zero_step": (lambda fd: fd.ops.slice(_t(fd), [0, 0, 0], [2, 2, 2], [1, 0, 1]), FusionDefinitionError,
                        "must be positive.*All slice operation strides must be of const size 1"),
    "slice_rank": (lambda fd: fd.ops.slice(_t(fd), [0, 0], [2, 2]), FusionDefinitionError,
                   "fd.ops.slice: argument 'start_indices'.*rank 3.*Number of tensor dimensions does not match slice "
                   "dimensions!"),
    "slice_end_rank": (lambda fd: fd.ops.slice(_t(fd), [0, 0, 0], [2, 2]), FusionDefinitionError,
                       "argument 'end_indices'.*Slice indexing attribute dimensions don't match!"),
    "slice_strides_rank": (lambda fd: fd.ops.slice(_t(fd), [0, 0, 0], [2, 2, 2], [1, 1]), FusionDefinitionError,
                           "argument 'strides'.*Slice start_indices and strides don't match!"),
    # nvFuser checks the strides' count first, then the rank, then the ends' count
    "slice_strides_count_first": (lambda fd: fd.ops.slice(_t(fd), [0, 0], [2, 2], [1, 1, 1]), FusionDefinitionError,
                                  "Slice start_indices and strides don't match!"),
    "slice_end_before_start": (lambda fd: fd.ops.slice(_t(fd), [3, 0, 0], [1, 2, 2]), FusionDefinitionError,
                               r"'end_indices'\[0\]=1 is below start 3.*Slice operation end_indices must be greater "
                               "than or equal to start_indices"),
    "slice_manual_negative": (
        lambda fd: fd.ops.slice(_t(fd), [-1, 0, 0], [2, 2, 2], manual_normalization=True),
        FusionDefinitionError,
        "negative.*Slice operation start_indices must be greater than or equal to 0",
    ),
    "slice_manual_end": (
        lambda fd: fd.ops.slice(_t(fd, (4, 4)), [0, 0], [5, 2], manual_normalization=True),
        FusionDefinitionError,
        "exceeds the extent 4",
    ),
    "slice_float_bound": (lambda fd: fd.ops.slice(_t(fd), [0.5, 0, 0], [2, 2, 2]), FusionDtypeError, "start_indices"),
    # pad
    "pad_odd": (lambda fd: fd.ops.pad(_t(fd), [1, 1, 0]), FusionDefinitionError, "fd.ops.pad: argument 'pad_widths'"),
    "pad_too_many": (lambda fd: fd.ops.pad(_t(fd, (2, 2)), [1, 1, 1, 1, 1, 1]), FusionDefinitionError, "at most 2 \\* rank"),
    "pad_value_dtype": (lambda fd: fd.ops.pad(_t(fd), [1, 1], 1), FusionDtypeError, "fd.ops.pad: argument 'value' is DataType.Int"),
    "pad_value_bool": (
        lambda fd: fd.ops.pad(_t(fd, dtype=DataType.Int), [1, 1], True),
        FusionDtypeError,
        "argument 'value'",
    ),
    "pad_negative_extent": (lambda fd: fd.ops.pad(_t(fd, (2, 2)), [-3, 0]), FusionDefinitionError, "negative extent -1"),
    # cat
    "cat_ranks": (lambda fd: fd.ops.cat([_t(fd), _t(fd, (-1, -1))]), FusionDefinitionError, "fd.ops.cat: .*equal ranks"),
    "cat_dtypes": (
        lambda fd: fd.ops.cat([_t(fd), _t(fd, dtype=DataType.Half)]),
        FusionDtypeError,
        "fd.ops.cat: .*equal dtypes",
    ),
    "cat_extents": (
        lambda fd: fd.ops.cat([_t(fd, (2, 3)), _t(fd, (2, 4))], dim=0),
        FusionDefinitionError,
        "extents \\[3, 4\\] of dim 1",
    ),
    "cat_broadcast_vs_static": (
        lambda fd: fd.ops.cat([_t(fd, (2, 1)), _t(fd, (2, 4))], dim=0),
        FusionDefinitionError,
        "do not match",
    ),
    "cat_dim": (lambda fd: fd.ops.cat([_t(fd), _t(fd)], dim=3), FusionDefinitionError, "fd.ops.cat: argument 'dim'=3"),
    "cat_empty": (lambda fd: fd.ops.cat([]), FusionDefinitionError, "non-empty"),
    "cat_manual_padding": (lambda fd: fd.ops.cat([_t(fd), _t(fd)], manual_padding=True), UnsupportedOpError, "fd.ops.cat: manual_padding"),
    # stride_order
    "stride_order_len": (lambda fd: fd.ops.stride_order(_t(fd), [1, 0]), FusionDefinitionError, "fd.ops.stride_order: argument 'stride_order'.*rank 3"),
    "stride_order_dup": (lambda fd: fd.ops.stride_order(_t(fd), [0, 0, 1]), FusionDefinitionError, "duplicate"),
    "stride_order_range": (lambda fd: fd.ops.stride_order(_t(fd), [0, 1, 3]), FusionDefinitionError, "out of range"),
}


@pytest.mark.parametrize("case", sorted(_ERRORS))
def test_definition_errors(case, capsys):
    build, exc, match = _ERRORS[case]
    raises(exc, match, build)
    capsys.readouterr()  # the FusionDefinition prints the exception it re-raises


def test_arg_must_be_tensor():
    def fn(fd):
        fd.ops.permute(fd.define_scalar(1.0), [0])

    raises(FusionDtypeError, "fd.ops.permute: argument 'arg' must be a TensorView", fn)


def test_run_time_extent_mismatch():
    # Statically unknowable: the symbolic input extent 3 cannot be expanded to 4.
    def fn(fd):
        fd.add_output(fd.ops.expand(fd.define_tensor([-1, -1]), [4, -1]))

    fd = define(fn)
    with pytest.raises(FusionExecutionError, match="expand"):
        fd.execute([make((3, 2))])

