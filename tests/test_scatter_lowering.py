"""scatter in generated kernels (codegen/scatter_lowerings.py): every output element searches the index for the
last position that writes it, so scatter fuses with the producers of arg, the elementwise ops computing index and
src, and the readers of its result, in one kernel. Compared with ATen's torch.scatter op by op: values bit for
bit (NaN payloads, ±0, ±inf), shapes, dtypes and strides; repeated indices keep the last write in index order,
as ATen's CPU scatter does (references are computed on CPU: CUDA's order is unspecified). What the kernel does
not take runs on ATen, with its reason; out-of-range indices raise FusionExecutionError naming the op."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import DEVICE, define, make, transposed
from pyfuser import DataType
from pyfuser.codegen.scatter_lowerings import MAX_EXTENT
from pyfuser.errors import FusionExecutionError
from pyfuser.segment.loop_domain import lowering_refusal

from test_codegen_views import bits_equal, specials

_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check(out, x, dim, idx, src):
    """``out`` against torch.scatter on CPU: dtype, shape, strides, values (NaN positions, the sign of zero)
    against ATen's result, and every bit against what ATen writes element by element. The kernel moves elements
    unchanged; ATen's own CPU scatter of 16-bit floats does not (torch 2.13, verified: every NaN of a BFloat16
    result, arg's included, becomes 0xFFFF; in a Half result arg's NaNs become 0x7FFF and a signalling NaN of src
    is quieted; Float and Double keep their bits), so bits are compared with the scatter of the bit patterns."""
    x, idx = x.cpu(), idx.cpu().long()
    src = src.cpu() if isinstance(src, torch.Tensor) else src
    ref = torch.scatter(x, dim, idx, src)
    out = out.cpu()
    bits_equal(out, ref, nan_bits=False)
    if not x.dtype.is_floating_point:
        bits_equal(out, ref)
        return
    iview = _BITS[x.element_size()]

    def bits(t):
        return t.resolve_neg().contiguous().view(iview)

    if isinstance(src, torch.Tensor):
        exact = torch.scatter(bits(x), dim, idx, bits(src))
    else:  # a scalar: ATen's converted value where written (the kernel's constant is that conversion)
        written = torch.scatter(torch.zeros(x.shape, dtype=torch.bool), dim, idx, True)
        exact = torch.where(written, bits(ref), bits(x))
    assert torch.equal(bits(out), exact), (bits(out), exact)


def one_kernel(fd):
    reports = fd.last_execution()
    assert len(reports) == 1 and reports[0].runs_as == "triton", [str(r).splitlines()[0] for r in reports]


def scatter_refusal(fd):
    (e,) = [e for e in fd.fusion.exprs if e.op.name == "scatter"]
    return lowering_refusal(e)


def _values(shape, dtype, seed=0):
    """Random values of ``dtype`` on CPU, floats with NaN, ±inf, ±0 and negatives spread in."""
    torch.manual_seed(seed)
    return (specials(shape, dtype) if dtype.is_floating_point else make(shape, dtype)).cpu()


def _index(shape, n, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_src_tensor_every_dim_bitwise(dim, dtype):
    # The index is smaller than arg along the other dims and src larger than the index everywhere.
    x = _values((4, 5, 6), dtype)
    ishape = [3, 4, 5]
    ishape[dim] = 7  # more positions than arg has along dim: repeated indices
    idx = _index(ishape, x.shape[dim], torch.int32 if dim == 1 else torch.int64, seed=dim)
    src = _values([n + 1 for n in ishape], dtype, seed=1)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(idx), fd.from_pytorch(src), dim))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), idx.to(DEVICE), src.to(DEVICE)])
    check(out, x, dim, idx, src)
    one_kernel(fd)


@pytest.mark.parametrize("dtype, value", [
    (torch.float32, 2.5), (torch.float32, float("nan")), (torch.float64, 0.1), (torch.float64, -0.0),
    (torch.bfloat16, 2.7), (torch.float16, float("-inf")), (torch.int32, 2.7), (torch.int64, -3),
    (torch.bool, 0), (torch.bool, 2.5), (torch.float32, True),
])
def test_scalar_src(dtype, value):
    # Converted as ATen converts it (2.7 into Int32 is 2, 2.5 into Bool is True), written by its bits.
    x = _values((4, 6), dtype)
    idx = _index((3, 2), 6)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(idx), value, 1))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), idx.to(DEVICE)])
    check(out, x, 1, idx, value)
    one_kernel(fd)


@pytest.mark.parametrize("dtype, sdtype, value", [
    (torch.float32, DataType.Int, 7), (torch.int64, DataType.Int, -9), (torch.bool, DataType.Bool, True),
    (torch.float64, DataType.Int32, 3),
])
def test_scalar_src_known_at_run_time(dtype, sdtype, value):
    x, idx = _values((3, 5), dtype), _index((3, 2), 5)

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        fd.add_output(fd.ops.scatter(t, i, fd.define_scalar(None, dtype=sdtype), 1))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), idx.to(DEVICE), value])
    check(out, x, 1, idx, value)
    one_kernel(fd)


def test_repeated_indices_keep_the_last_write():
    # ATen's CPU scatter writes in index order: [1, 1, 3, 1] writes 10, 20, 30, 40 and keeps 40 at 1.
    x = torch.zeros(5)
    idx, src = torch.tensor([1, 1, 3, 1]), torch.tensor([10.0, 20.0, 30.0, 40.0])

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(idx), fd.from_pytorch(src), 0))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), idx.to(DEVICE), src.to(DEVICE)])
    assert out.cpu().tolist() == [0.0, 40.0, 0.0, 30.0, 0.0]
    # Many repeats along each dim of a 3-D tensor, compared with ATen's CPU scatter.
    for dim in range(3):
        x = _values((3, 4, 5), torch.float32, seed=dim)
        ishape = [3, 4, 5]
        ishape[dim] = 9
        idx = _index(ishape, 2, seed=dim)  # only positions 0 and 1 written, each many times
        src = _values(ishape, torch.float32, seed=7)

        def fn(fd, x=x, idx=idx, src=src, dim=dim):
            fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(idx), fd.from_pytorch(src), dim))

        fd = define(fn)
        (out,) = fd.execute([x.to(DEVICE), idx.to(DEVICE), src.to(DEVICE)])
        check(out, x, dim, idx, src)


def _layout(t, kind):
    """``t``'s values in another layout: transposed in memory, at a storage offset, every other element, or a view
    with the negative bit set (memory holds -value)."""
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "offset":
        return torch.cat([t.reshape(-1)[:1], t.reshape(-1)]).narrow(0, 1, t.numel()).view(t.shape)
    if kind == "strided":
        return torch.stack([t, t], -1)[..., 0]
    if kind == "negbit" and t.dtype != torch.bool:
        return torch._neg_view(torch.neg(t))
    return t


@pytest.mark.parametrize("arg_layout, index_layout, src_layout", [
    ("transposed", "transposed", "transposed"), ("offset", "strided", "negbit"), ("negbit", "offset", "strided"),
    ("expanded", "contiguous", "transposed"),
])
def test_non_contiguous_operands(arg_layout, index_layout, src_layout):
    # Laid out on the device itself (a copy to CUDA would make them dense again).
    x = _values((5, 6), torch.float32).to(DEVICE)
    if arg_layout == "expanded":  # arg broadcast along dim 0: the output still varies along it
        x = x[:1].expand(5, 6)
    idx, src = _index((4, 5), 6, seed=3).to(DEVICE), _values((5, 7), torch.float32, seed=4).to(DEVICE)
    xs, idxs, srcs = _layout(x, arg_layout), _layout(idx, index_layout), _layout(src, src_layout)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.from_pytorch(xs), fd.from_pytorch(idxs), fd.from_pytorch(srcs), 1))

    fd = define(fn)
    (out,) = fd.execute([xs, idxs, srcs])
    check(out, xs, 1, idxs, srcs)
    one_kernel(fd)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_shapes_layouts_dtypes(data):
    draw = data.draw
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    dim = draw(st.integers(0, rank - 1))
    ishape = [draw(st.integers(1, n)) for n in shape]
    ishape[dim] = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
                                  torch.int64, torch.bool]))
    seed = draw(st.integers(0, 1000))
    # (laid out on the device itself: a copy to CUDA would make them dense again)
    x = _layout(_values(shape, dtype, seed).to(DEVICE),
                draw(st.sampled_from(["contiguous", "transposed", "offset", "negbit"])))
    idx = _layout(_index(ishape, shape[dim], draw(st.sampled_from([torch.int64, torch.int32])), seed).to(DEVICE),
                  draw(st.sampled_from(["contiguous", "transposed", "strided"])))
    if draw(st.booleans()):
        src = _values([n + draw(st.integers(0, 1)) for n in ishape], dtype, seed + 1).to(DEVICE)
        src = _layout(src, draw(st.sampled_from(["contiguous", "transposed", "offset", "negbit"])))
    else:
        src = draw(st.sampled_from([1.5, -2, 0, True]))

    def fn(fd):
        t, ti = fd.from_pytorch(x), fd.from_pytorch(idx)
        s = fd.from_pytorch(src) if isinstance(src, torch.Tensor) else src
        fd.add_output(fd.ops.scatter(t, ti, s, dim))

    fd = define(fn)
    (out,) = fd.execute([x, idx] + ([src] if isinstance(src, torch.Tensor) else []))
    check(out, x, dim, idx, src)
    one_kernel(fd)


def test_fused_with_producers_and_reader_one_kernel():
    # arg made by a producer, the index and src computed by elementwise ops (recomputed at each searched
    # position), the result read by another op: one kernel.
    x, i, s = make((6, 8), device="cpu"), _index((4, 5), 8, seed=5), make((6, 5), device="cpu")

    def fn(fd):
        t, ti, ts = fd.from_pytorch(x), fd.from_pytorch(i), fd.from_pytorch(s)
        out = fd.ops.scatter(fd.ops.mul(t, 2.0), fd.ops.sub(7, ti), fd.ops.neg(ts), 1)
        fd.add_output(fd.ops.add(out, 1.0))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), i.to(DEVICE), s.to(DEVICE)])
    bits_equal(out.cpu(), torch.scatter(x * 2.0, 1, 7 - i, -s) + 1.0, nan_bits=False)
    one_kernel(fd)
    assert sorted(fd.last_execution()[0].ops) == ["add", "mul", "neg", "scatter", "sub"]


def test_fused_with_a_row_reduction():
    # A softmax's rows with some columns overwritten, summed in the same persistent kernel (the scattered dim is
    # the kernel's column dim).
    x = make((5, 12), torch.bfloat16, device="cpu")
    i = _index((5, 3), 12, torch.int32, seed=6)

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        masked = fd.ops.scatter(t, fd.from_pytorch(i), float("-inf"), 1)
        fd.add_output(fd.ops.sum(fd.ops.exp(masked), dims=[1]))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), i.to(DEVICE)])
    ref = torch.scatter(x.float(), 1, i.long(), float("-inf")).exp().sum(1)
    torch.testing.assert_close(out.cpu(), ref)
    one_kernel(fd)


def test_index_made_by_another_kernel():
    # An argsort's indices are no elementwise value: they are written by their kernel and read back.
    k = make((3, 6), device="cpu")
    x, s = make((3, 6), device="cpu"), make((3, 6), device="cpu")

    def fn(fd):
        order = fd.ops.argsort(fd.from_pytorch(k), dim=1, stable=True)
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), order, fd.from_pytorch(s), 1))

    fd = define(fn)
    (out,) = fd.execute([k.to(DEVICE), x.to(DEVICE), s.to(DEVICE)])
    bits_equal(out.cpu(), torch.scatter(x, 1, torch.argsort(k, dim=1, stable=True), s))
    assert all(r.runs_as == "triton" for r in fd.last_execution()), fd.last_execution()


def test_more_positions_than_the_limit_run_on_aten():
    m = MAX_EXTENT + 44
    x, i, s = make((3, 10), device="cpu"), _index((3, m), 10, seed=8), make((3, m), device="cpu")
    for static in (True, False):
        def fn(fd, static=static):
            t = fd.from_pytorch(x, static_sizes=static)
            ti, ts = fd.from_pytorch(i, static_sizes=static), fd.from_pytorch(s, static_sizes=static)
            fd.add_output(fd.ops.add(fd.ops.scatter(fd.ops.abs(t), ti, ts, 1), 1.0))

        fd = define(fn)
        (out,) = fd.execute([x.to(DEVICE), i.to(DEVICE), s.to(DEVICE)])
        bits_equal(out.cpu(), torch.scatter(x.abs(), 1, i, s) + 1.0)
        if static:  # known when the fusion is defined: the scatter alone runs on ATen, its neighbours as kernels
            assert f"an index of {m} along dim 1 runs on ATen" in scatter_refusal(fd)
            assert [s.kind.value for s in fd.segments()] == ["PointWise", "ExprEval", "PointWise"], fd.segments()
        else:  # found when planning: the segment runs on ATen, saying why
            (report,) = fd.last_execution()
            assert report.runs_as == "aten" and f"an index of {m} along dim 1" in report.reason, report


def test_what_else_runs_on_aten():
    x, i, s = make((4, 6), device="cpu"), _index((3, 2), 6), make((3, 2), device="cpu")
    cases = {
        "whose index or src is its arg": (lambda fd, t, ti: fd.ops.scatter(t, ti, t, 1), [x, i]),
        "of a DataType.Double scalar known only at run time": (
            lambda fd, t, ti: fd.ops.scatter(t, ti, fd.define_scalar(None, dtype=DataType.Double), 1), [x, i, 2.5]),
    }
    xi = make((4, 6), torch.int32, device="cpu")
    cases["of a DataType.Int scalar known only at run time into torch.int32"] = (
        lambda fd, t, ti: fd.ops.scatter(t, ti, fd.define_scalar(None, dtype=DataType.Int), 1), [xi, i, 7])
    for why, (op, inputs) in cases.items():
        def fn(fd, op=op, inputs=inputs):
            fd.add_output(op(fd, fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])))

        fd = define(fn)
        (out,) = fd.execute([v.to(DEVICE) if isinstance(v, torch.Tensor) else v for v in inputs])
        scalar = inputs[2] if len(inputs) == 3 else inputs[0]
        bits_equal(out.cpu(), torch.scatter(inputs[0], 1, i, scalar))
        assert why in scatter_refusal(fd), scatter_refusal(fd)
        assert [s.kind.value for s in fd.segments()] == ["ExprEval"]

    # An index with no elements: nothing to search, ATen copies arg.
    empty = torch.zeros((3, 0), dtype=torch.int64)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.ops.abs(fd.from_pytorch(x)), fd.from_pytorch(empty), fd.from_pytorch(s), 1))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), empty.to(DEVICE), s.to(DEVICE)])
    bits_equal(out.cpu(), x.abs())
    assert "empty" in fd.last_execution()[0].reason


def test_what_aten_refuses_raises_its_own_error():
    # A constant ATen cannot convert, and an index larger than arg along another dim (known only at run time):
    # the scatter runs on ATen, which raises.
    xi, i = make((4, 6), torch.int32, device="cpu"), _index((3, 2), 6)

    def fn(fd):
        fd.add_output(fd.ops.scatter(fd.ops.abs(fd.from_pytorch(xi)), fd.from_pytorch(i), 1e10, 1))

    fd = define(fn)
    assert "runs on ATen (value cannot be converted" in scatter_refusal(fd)
    with pytest.raises(FusionExecutionError, match="value cannot be converted to type int without overflow"):
        fd.execute([xi.to(DEVICE), i.to(DEVICE)])

    x, big = make((4, 6), device="cpu"), _index((5, 2), 6)

    def fn(fd):
        t, ti, ts = fd.from_pytorch(x), fd.from_pytorch(big), fd.from_pytorch(make((5, 2), device="cpu"))
        fd.add_output(fd.ops.scatter(fd.ops.abs(t), ti, ts, 1))

    fd = define(fn)
    with pytest.raises(FusionExecutionError, match="Expected index .* to be no larger than self"):
        fd.execute([x.to(DEVICE), big.to(DEVICE), make((5, 2))])


def _raises_on_device(fd, good, bad, message):
    """A call with an out-of-range index raises (on CPU at once; on CUDA the next call does, without a host
    synchronization in the call that found it); later good calls work again."""
    if DEVICE.type == "cuda":
        fd.execute(bad)
        torch.cuda.synchronize()
        with pytest.raises(FusionExecutionError, match=message + r".*found on the device by an earlier call"):
            fd.execute(good)
    else:
        with pytest.raises(FusionExecutionError, match=message):
            fd.execute(bad)
    return fd.execute(good)


@pytest.mark.parametrize("bad", [6, 100, -1])
def test_out_of_range_index_raises(bad):
    x, s = make((4, 6), device="cpu"), make((3, 2), device="cpu")
    good = _index((3, 2), 6)
    wrong = good.clone()
    wrong[2, 1] = bad
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.scatter(x, 1, wrong, s)  # what eager does with it

    def fn(fd):
        fd.add_output(fd.ops.neg(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(good), fd.from_pytorch(s), 1)))

    fd = define(fn)
    message = r"fd.ops.scatter: index T1 holds a value outside \[0, 6\), the extent of dim 1 of T0"
    (out,) = _raises_on_device(fd, [x.to(DEVICE), good.to(DEVICE), s.to(DEVICE)],
                               [x.to(DEVICE), wrong.to(DEVICE), s.to(DEVICE)], message)
    bits_equal(out.cpu(), -torch.scatter(x, 1, good, s), nan_bits=False)
    one_kernel(fd)


def test_computed_index_out_of_range_raises_and_lanes_outside_the_index_never_do():
    # index = i - 1 over an index smaller than arg along dim 0: lanes outside it read nothing (0 - 1 would be out
    # of range), so only a real -1 raises.
    x, s = make((4, 6), device="cpu"), make((2, 3), device="cpu")
    good = _index((2, 3), 6, seed=9) + 1
    wrong = good.clone()
    wrong[1, 0] = 0

    def fn(fd):
        t, ti, ts = fd.from_pytorch(x), fd.from_pytorch(good), fd.from_pytorch(s)
        fd.add_output(fd.ops.scatter(t, fd.ops.sub(ti, 1), ts, 1))

    fd = define(fn)
    message = r"fd.ops.scatter: index T3 holds a value outside \[0, 6\)"
    (out,) = _raises_on_device(fd, [x.to(DEVICE), good.to(DEVICE), s.to(DEVICE)],
                               [x.to(DEVICE), wrong.to(DEVICE), s.to(DEVICE)], message)
    bits_equal(out.cpu(), torch.scatter(x, 1, good - 1, s))
    one_kernel(fd)


def test_transposed_arg_keeps_eager_strides():
    # The result takes eager's strides (those of a transposed arg here), and is read by a reader in the kernel.
    x = transposed((5, 7), device="cpu")
    i, s = _index((5, 3), 7, seed=10), make((5, 3), device="cpu")

    def fn(fd):
        out = fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(i), fd.from_pytorch(s), 1)
        fd.add_output(out)
        fd.add_output(fd.ops.mul(out, out))

    fd = define(fn)
    out, sq = fd.execute([x.to(DEVICE), i.to(DEVICE), s.to(DEVICE)])
    ref = torch.scatter(x, 1, i, s)
    bits_equal(out.cpu(), ref)
    bits_equal(sq.cpu(), ref * ref, nan_bits=False)
    one_kernel(fd)


def test_arg_made_by_views_in_the_kernel():
    # arg is a permute made in the kernel and the result is only read there (summed): the plan sizes the search
    # from arg's layout, run on meta tensors. An arg expanded to a size known only at run time cannot be sized
    # when planning: the segment runs on ATen, saying why.
    x, i, s = make((6, 4), device="cpu"), _index((3, 5), 6, seed=11), make((4, 7), device="cpu")

    def fn(fd):
        t, ti, ts = fd.from_pytorch(x), fd.from_pytorch(i), fd.from_pytorch(s)
        fd.add_output(fd.ops.sum(fd.ops.scatter(fd.ops.permute(t, [1, 0]), ti, ts, 1), dims=[1]))

    fd = define(fn)
    (out,) = fd.execute([x.to(DEVICE), i.to(DEVICE), s.to(DEVICE)])
    torch.testing.assert_close(out.cpu(), torch.scatter(x.t(), 1, i, s).sum(1))
    one_kernel(fd)

    row, y = make((1, 6), device="cpu"), make((4, 6), device="cpu")

    def fn(fd):
        t, ty, ti, ts = fd.from_pytorch(row), fd.from_pytorch(y), fd.from_pytorch(i), fd.from_pytorch(s)
        wide = fd.ops.expand(t, [fd.ops.size(ty, 0), 6])
        fd.add_output(fd.ops.mul(fd.ops.scatter(wide, ti, ts, 1), ty))

    fd = define(fn)
    (out,) = fd.execute([row.to(DEVICE), y.to(DEVICE), i.to(DEVICE), s.to(DEVICE)])
    bits_equal(out.cpu(), torch.scatter(row.expand(4, 6), 1, i, s) * y)
    (report,) = fd.last_execution()
    assert report.runs_as == "aten" and "unknown when planning" in report.reason, report


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_aten_path_keeps_the_last_write(dtype):
    # CUDA's own scatter leaves the winner among repeated indices unspecified; pyfuser's ATen path resolves them
    # as ATen's CPU scatter and the kernel do (ops/indexing._scatter_last_write), so every path agrees on every
    # device. Many repeats (9 positions into 3), the index smaller than arg and src larger, NaN payloads kept.
    from pyfuser.ops.indexing import _scatter_last_write

    iview = _BITS[torch.empty((), dtype=dtype).element_size()] if dtype.is_floating_point else dtype
    for dim, shape, ishape in ((1, (4, 3), (3, 9)), (0, (3, 5), (9, 4)), (2, (2, 3, 3), (2, 2, 9))):
        # (2-D args transposed in memory, laid out on the device: the result keeps torch.scatter's strides)
        x = _values(shape, dtype, seed=dim).to(DEVICE)
        x = _layout(x, "transposed")
        idx = _index(ishape, shape[dim], seed=dim).to(DEVICE)
        src = _values([n + 1 for n in ishape], dtype, seed=dim + 5).to(DEVICE)
        got = _scatter_last_write(x, dim, idx, src)
        want = torch.scatter(x.cpu().view(iview), dim, idx.cpu(), src.cpu().view(iview))  # moved by bits
        assert torch.equal(got.cpu().view(iview), want), (dim, got, want)
        assert got.stride() == torch.scatter(x, dim, idx, src).stride()
