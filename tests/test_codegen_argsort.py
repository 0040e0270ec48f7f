"""argsort over a small dim (<= 256) in generated kernels (codegen/sort_lowerings.py, KernelBuilder.argsort):
indices against eager's torch.argsort(stable=True) exactly, on inputs full of ties, NaN, ±inf and ±0, in every
dtype family, along either dim of non-contiguous and offset inputs; stable=False gives the stable order too
(eager's order among equal keys is then unspecified); what stays on ATen says why."""

import pytest
import torch

from harness import DEVICE, define, fd_softmax, make, transposed
from test_codegen_views import bits_equal


def _tied(shape, dtype, seed=0):
    """Values from a small set (many ties), with NaN, ±inf, +0 and -0 among them for floats."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool().to(DEVICE)
    if dtype.is_floating_point:
        pool = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.5, 2.25, 1e-3],
                            dtype=torch.float64)
        t = pool[torch.randint(0, len(pool), shape, generator=g)]
        return t.to(dtype).to(DEVICE)
    return torch.randint(-3, 4, shape, generator=g).to(dtype).to(DEVICE)


def _layout(x, layout):
    if layout == "transposed":
        return x.t().contiguous().t()
    if layout == "offset":
        return torch.cat([x[:1], x])[1:]
    return x


def _argsort_fusion(x, dim, descending, stable):
    def fn(fd):
        fd.add_output(fd.ops.argsort(fd.from_pytorch(x), dim=dim, descending=descending, stable=stable))

    fd = define(fn)
    (out,) = fd.execute([x])
    (report,) = fd.last_execution()
    assert "triton kernel" in str(report), report
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
                                   torch.int64, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_stable_argsort_matches_eager(dtype, descending, dim, layout):
    x = _layout(_tied((13, 21), dtype, seed=dim), layout)
    out = _argsort_fusion(x, dim, descending, True)
    # Against the CPU sort: torch 2.11's CUDA sort of BFloat16 puts NaN before -inf (ascending), against the
    # documented order (NaN above everything) that its CPU sort and its CUDA sort of every other dtype follow.
    bits_equal(out, torch.argsort(x.cpu(), dim=dim, descending=descending, stable=True).to(DEVICE))


@pytest.mark.parametrize("n", [1, 2, 7, 64, 256])
def test_extents(n):
    x = _tied((3, n), torch.float32, seed=n)
    out = _argsort_fusion(x, 1, False, True)
    bits_equal(out, torch.argsort(x, dim=1, stable=True))


@pytest.mark.parametrize("descending", [False, True])
def test_unstable_argsort(descending):
    # Distinct keys: one order, eager's. Tied keys: the kernel gives the stable order, eager any sorting order
    # (ATen's CPU sort with stable=False differs from the stable order from 32 elements on, torch 2.13).
    distinct = make((4, 40))
    out = _argsort_fusion(distinct, 1, descending, False)
    bits_equal(out, torch.argsort(distinct, dim=1, descending=descending))
    tied = _tied((4, 40), torch.float32, seed=5)
    out = _argsort_fusion(tied, 1, descending, False)
    bits_equal(out, torch.argsort(tied, dim=1, descending=descending, stable=True))
    eager = torch.argsort(tied, dim=1, descending=descending)
    ours, theirs = torch.gather(tied, 1, out), torch.gather(tied, 1, eager)  # both sort the row
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.all(ours.nan_to_num(0.0) == theirs.nan_to_num(0.0))


def test_argsort_fused_with_softmax_and_take_along_axis():
    # A row sorted by its softmax weights, and the weights in that order: one persistent kernel.
    x = make((6, 10))

    def fn(fd):
        w = fd_softmax(fd, fd.from_pytorch(x), 1)
        order = fd.ops.argsort(w, dim=1, descending=True, stable=True)
        fd.add_output(order)
        fd.add_output(fd.ops.take_along_axis(w, order, 1))

    fd = define(fn)
    order, sorted_w = fd.execute([x])
    w = torch.softmax(x, dim=1)
    assert torch.equal(order, torch.argsort(w, dim=1, descending=True, stable=True))
    assert torch.equal(sorted_w.isnan(), torch.zeros_like(sorted_w, dtype=torch.bool))
    assert torch.all(sorted_w[:, :-1] >= sorted_w[:, 1:])
    kinds = [s.kind.value for s in fd.segments()]
    assert len(kinds) <= 2, kinds
    assert all(r.runs_as == "triton" for r in fd.last_execution())


def test_3d_middle_dim():
    x = _tied((3, 17, 4), torch.bfloat16, seed=3)

    def fn(fd):
        fd.add_output(fd.ops.argsort(fd.ops.neg(fd.from_pytorch(x)), dim=1, stable=True))

    fd = define(fn)
    (out,) = fd.execute([x])
    bits_equal(out, torch.argsort(-x, dim=1, stable=True))
    assert "triton kernel" in str(fd.last_execution()[0])


def test_what_stays_on_aten():
    # A row wider than 256 (known only at run time here): the segment runs on ATen, saying why.
    # A 1-D argsort (one row: the MoE layer's permutation) is an ExprEval segment from the start.
    wide = make((2, 300))
    flat = make((50,))
    for x, dim in ((wide, 1), (flat, 0)):
        def fn(fd, x=x, dim=dim):
            fd.add_output(fd.ops.argsort(fd.ops.abs(fd.from_pytorch(x)), dim=dim, stable=True))

        fd = define(fn)
        (out,) = fd.execute([x])
        bits_equal(out, torch.argsort(x.abs(), dim=dim, stable=True))
        reports = fd.last_execution()
        if x is wide:
            assert "argsort over 300 elements" in reports[0].reason, reports
        else:
            assert [s.kind.value for s in fd.segments()] == ["PointWise", "ExprEval"], fd.segments()
