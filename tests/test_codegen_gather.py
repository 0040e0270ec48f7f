"""index_select in generated kernels (codegen/gather_lowerings.py): an indexed load fused with its neighbours,
values bit for bit against eager on special-valued, non-contiguous and offset inputs and indices; out-of-range
indices (negative ones included) are never a silent wrong result: the call's error flags are set and the fusion
raises (on CPU at once, on CUDA at its next call, without a host synchronization)."""

import pytest
import torch

from harness import DEVICE, check_fusion, define, make, transposed
from pyfuser import DataType
from pyfuser.errors import FusionExecutionError

from test_codegen_views import bits_equal, specials


def _index(n, m, dtype=torch.int64, layout="contiguous", seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (m if layout == "contiguous" else 2 * m,), generator=g, dtype=dtype)
    if layout == "strided":
        idx = idx[::2]
    elif layout == "offset":
        idx = idx[m:]
    return idx.to(DEVICE)


def _source(layout, shape, dtype):
    if layout == "transposed":
        return transposed(shape, dtype)
    if layout == "offset":
        return make((shape[0] + 1, *shape[1:]), dtype)[1:]
    x = specials(shape, dtype) if dtype.is_floating_point else make(shape, dtype)
    return x.to(DEVICE)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("index_layout", ["contiguous", "strided", "offset"])
def test_index_select_fused_with_pointwise_bitwise(layout, dtype, dim, index_layout):
    x = _source(layout, (9, 7), dtype)
    idx = _index(x.shape[dim], 11, torch.int32 if index_layout == "strided" else torch.int64, index_layout)

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        g = fd.ops.index_select(t, i, dim)
        fd.add_output(fd.ops.add(g, g))

    fd = define(fn)
    (out,) = fd.execute([x, idx])
    g = torch.index_select(x, dim, idx)
    if dtype == torch.bfloat16:  # nvFuser's add computes and returns reduced floats in fp32
        g = g.float()
    bits_equal(out, g + g, nan_bits=False)
    assert [s.kind.value for s in fd.segments()] == ["PointWise"]
    assert "triton kernel" in str(fd.last_execution()[0])


def test_index_select_3d_middle_dim_and_check_fusion():
    x = make((3, 6, 5))
    idx = torch.tensor([5, 0, 0, 2], device=DEVICE)

    def fn(fd):
        fd.add_output(fd.ops.mul(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(idx), 1), 3.0))

    check_fusion(fn, [x, idx], lambda x, i: torch.index_select(x, 1, i) * 3.0, atol=0, rtol=0,
                 expected_segments=["PointWise"])


def test_index_computed_in_the_kernel():
    # The MoE layer's permuted rows: token = flat (token, slot) index // k, gathered in the same kernel.
    x = specials((8, 16), torch.bfloat16).to(DEVICE)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def fn(fd):
        t, p = fd.from_pytorch(x), fd.from_pytorch(perm)
        fd.add_output(fd.ops.index_select(t, fd.ops.div(p, 2), 0))

    fd = define(fn)
    (out,) = fd.execute([x, perm])
    bits_equal(out, x[perm // 2])
    assert [s.kind.value for s in fd.segments()] == ["PointWise"]


def test_weighted_gathers_one_kernel():
    # The MoE combine: per slot, rows gathered by one column of the inverse permutation, weighted, summed.
    T, k, H = 6, 2, 8
    y = make((T * k, H), torch.bfloat16)
    inv = torch.randperm(T * k, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    w = make((T, k))

    def fn(fd):
        ty, ti, tw = fd.from_pytorch(y), fd.from_pytorch(inv), fd.from_pytorch(w)
        rows = fd.ops.reshape(ti, [T, k])
        total = None
        for s in range(k):
            g = fd.ops.cast(fd.ops.index_select(ty, fd.ops.select(rows, s, 1), 0), DataType.Float)
            term = fd.ops.mul(g, fd.ops.broadcast_in_dim(fd.ops.select(tw, s, 1), shape=[T, H], broadcast_dims=[0]))
            total = term if total is None else fd.ops.add(total, term)
        fd.add_output(total)

    fd = define(fn)
    (out,) = fd.execute([y, inv, w])
    ref = (y[inv].view(T, k, H).float() * w[..., None]).sum(1)
    bits_equal(out, ref)
    kinds = [s.kind.value for s in fd.segments()]
    assert kinds == ["ExprEval", "PointWise"], kinds  # the index reshape is a view; the rest one kernel


def test_gather_read_back_through_a_reshape_stays_aten():
    # Gathered rows that only a reshape reads would be a kernel of their own: ATen gathers them instead.
    x = make((6, 4))
    idx = torch.tensor([1, 5, 0, 2, 2, 3], device=DEVICE)

    def fn(fd):
        g = fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(idx), 0)
        fd.add_output(fd.ops.mul(fd.ops.reshape(g, [3, 8]), 2.0))

    check_fusion(fn, [x, idx], lambda x, i: torch.index_select(x, 0, i).reshape(3, 8) * 2.0, atol=0, rtol=0,
                 expected_segments=["ExprEval", "PointWise"])


@pytest.mark.parametrize("bad", [6, 100, -1, -6])
def test_out_of_range_index_raises(bad):
    x = make((6, 5))
    good = torch.tensor([0, 5, 3, 3], device=DEVICE)
    wrong = torch.tensor([0, bad, 3, 3], device=DEVICE)
    with pytest.raises(IndexError):
        torch.index_select(x.cpu(), 0, wrong.cpu())  # what eager does with it

    def fn(fd):
        fd.add_output(fd.ops.neg(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(good), 0)))

    fd = define(fn)
    (out,) = fd.execute([x, good])
    bits_equal(out, -x[good])
    message = r"fd.ops.index_select: index T1 holds a value outside \[0, 6\), the extent of dim 0 of T0"
    if DEVICE.type == "cuda":
        fd.execute([x, wrong])  # no host synchronization: the flag is read by the next call
        torch.cuda.synchronize()
        with pytest.raises(FusionExecutionError, match=message + r".*found on the device by an earlier call"):
            fd.execute([x, good])
    else:
        with pytest.raises(FusionExecutionError, match=message):
            fd.execute([x, wrong])
    (out,) = fd.execute([x, good])  # the flag was cleared: good calls work again
    bits_equal(out, -x[good])


def test_out_of_range_index_with_sync_checks_raises_at_once():
    # _enable_options=["sync_offset_checks"] reads the flags right after the launch, on CUDA too.
    x = make((4, 3))
    wrong = torch.tensor([1, 4], device=DEVICE)

    def fn(fd):
        fd.add_output(fd.ops.neg(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(wrong), 0)))

    fd = define(fn)
    with pytest.raises(FusionExecutionError, match=r"fd.ops.index_select: index T1 holds a value outside \[0, 4\)"):
        fd.execute([x, wrong], _enable_options=["sync_offset_checks"])


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("op", ["gather", "take_along_axis", "index_select"])
def test_index_that_is_its_arg_runs_on_aten(op, layout):
    # One tensor as both the source and the index (the kernel would read it through a view and as a loop operand
    # at once): the op runs on ATen and says why; it crashed the planner with an IndexError before.
    from pyfuser.segment.loop_domain import lowering_refusal

    t = torch.tensor([[0, 1, 1], [2, 0, 1], [1, 1, 0]], device=DEVICE)
    if layout == "transposed":  # (the same values in column-major memory; index_select's row: stride 3)
        t = t.t().contiguous().t()
    v = t[:, 0] if layout == "transposed" else t[0]
    eager = {"gather": lambda t: torch.gather(t, 1, t), "take_along_axis": lambda t: torch.take_along_dim(t, t, 1),
             "index_select": lambda t: torch.index_select(t, 0, t)}[op]
    x = v if op == "index_select" else t

    def fn(fd):
        a = fd.from_pytorch(x)
        y = getattr(fd.ops, op)(a, a, 0 if op == "index_select" else 1)
        fd.add_output(fd.ops.add(y, 1))

    check_fusion(fn, [x], lambda x: eager(x) + 1, atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x])
    reports = fd.last_execution()
    aten = [r for r in reports if r.kind == "ExprEval"]
    assert aten, [r.kind for r in reports]
    expr = next(e for e in fd.fusion.exprs if e.op.name == op)
    why = f"fd.ops.{op} whose index is its arg runs on ATen"
    assert lowering_refusal(expr) == why
    assert aten[0].reason == f"ExprEval segment: {why}"  # the report says why
