"""top-k over a small dim in generated kernels (codegen/sort_lowerings.py): the MoE router's softmax, top-k and
renormalisation are one kernel; values and indices bit for bit against eager wherever the selected values are
distinct (NaN, +-inf, +-0 and negatives included), on contiguous, transposed and offset inputs, any dim, largest
and smallest; ties take the lowest index first (eager's tie order is unspecified and differs by device)."""

import pytest
import torch

from harness import DEVICE, check_fusion, define, fd_softmax, sliced, transposed
from pyfuser import DataType

from test_codegen_views import bits_equal


def distinct_specials(shape, dtype=torch.float32, layout="contiguous", seed=0):
    """Distinct values per row along the last dim (a random permutation), with NaN, +-inf, -0.0 (one zero per
    row, never both signs) and negatives spread in: no two candidates tie."""
    g = torch.Generator().manual_seed(seed)
    rows, n = int(torch.tensor(shape[:-1]).prod()), shape[-1]
    base = torch.stack([torch.randperm(n, generator=g) for _ in range(rows)]).to(torch.float64) - n // 2
    base = base * 0.25  # exact in bf16 for n <= 256
    specials = [float("nan"), float("inf"), float("-inf")]
    for r in range(rows):
        col = torch.randperm(n, generator=g)[:3]
        for c, v in zip(col.tolist(), specials):
            if r % 4 != 3:  # some rows keep only finite values
                base[r, c] = v
        zero = (base[r] == 0).nonzero()
        if zero.numel() and r % 2:
            base[r, zero[0, 0]] = -0.0
    x = base.reshape(shape).to(dtype)
    if layout == "transposed":
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout == "sliced":
        x = torch.cat([x, torch.zeros(*shape[:-1], 3, dtype=dtype)], -1)[..., :n]
    elif layout == "offset":
        x = torch.cat([torch.zeros(1, dtype=dtype), x.reshape(-1)])[1:].view(shape)
    return x.to(DEVICE)


def _topk_fusion(k, dim, largest, renormalise=False, like=None):
    def fn(fd):
        t = fd.from_pytorch(like) if like is not None else fd.define_tensor([-1, -1])
        v, i = fd.ops.topk(t, k, dim=dim, largest=largest, sorted=True)
        if renormalise:
            v = fd.ops.div(v, fd.ops.sum(v, dims=[dim], keepdim=True))
        fd.add_output(v)
        fd.add_output(i)

    return fn


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_special_values_bitwise(layout, dtype, largest):
    x = distinct_specials((13, 20), dtype, layout)
    fd = define(_topk_fusion(3, 1, largest, like=x))
    v, i = fd.execute([x])
    rv, ri = torch.topk(x, 3, dim=1, largest=largest, sorted=True)
    # NaN payloads aside: ATen's CPU topk returns bf16 NaN as 0x7fc0 whatever its input bits (the kernel returns
    # the input's own bits).
    bits_equal(v, rv, nan_bits=False)
    bits_equal(i, ri)
    assert [s.kind.value for s in fd.segments()] == ["Reduction"]
    assert "triton kernel" in str(fd.last_execution()[0])


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("k", [2, 3])
def test_topk_renormalised_one_kernel(dim, k):
    # The k-wide result is reduced again in the same kernel: only its k lanes take part in the sum.
    g = torch.Generator().manual_seed(dim)
    x = ((torch.randperm(144, generator=g).view(12, 12) + 1) * 0.125).to(DEVICE)  # no two values equal
    fd = define(_topk_fusion(k, dim, True, renormalise=True))
    v, i = fd.execute([x])
    rv, ri = torch.topk(x, k, dim=dim, sorted=True)
    bits_equal(v, rv / rv.sum(dim, keepdim=True))
    bits_equal(i, ri)
    assert [s.kind.value for s in fd.segments()] == ["InnerPersistent"]


def test_router_softmax_topk_renormalise_one_kernel():
    """The MoE router: softmax over experts in fp32, top-2, weights renormalised; one kernel, equal to the same
    fusion with top-k on ATen bit for bit (both compute the softmax in a generated kernel)."""
    x = (torch.randn(33, 8, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16).to(DEVICE)
    x[5, 3] = float("-inf")  # a zero probability (a NaN or +inf logit would make every candidate tie)

    def fn(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        probs = fd_softmax(fd, fd.ops.cast(t, DataType.Float), 1)
        w, i = fd.ops.topk(probs, 2, dim=1, largest=True, sorted=True)
        fd.add_output(fd.ops.div(w, fd.ops.sum(w, dims=[1], keepdim=True)))
        fd.add_output(i)

    fd = define(fn)
    w, i = fd.execute([x])
    assert [s.kind.value for s in fd.segments()] == ["InnerPersistent"]
    # Reference: the same softmax kernel, then eager top-k and renormalisation on its probabilities.
    def probs_fn(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        logits = fd.ops.cast(t, DataType.Float)
        e = fd.ops.exp(fd.ops.sub(logits, fd.ops.max(logits, dims=[1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)))

    (probs,) = define(probs_fn).execute([x])
    rw, ri = torch.topk(probs, 2, dim=1, sorted=True)
    bits_equal(w, rw / rw.sum(1, keepdim=True))
    bits_equal(i, ri)
    torch.testing.assert_close(probs, torch.softmax(x.float(), 1), atol=1e-6, rtol=1e-5, equal_nan=True)


def test_topk_int_and_narrow_outside_operand():
    # An outside [T, k] tensor added to the k-wide values is read only in its k lanes (masked loads).
    x = torch.stack([torch.randperm(40, generator=torch.Generator().manual_seed(r)) - 20 for r in range(9)])
    x = x.to(torch.int32).to(DEVICE)
    b = torch.arange(9 * 4, dtype=torch.int32, device=DEVICE).view(9, 4) * 7

    def fn(fd):
        t = fd.from_pytorch(x)
        tb = fd.from_pytorch(b)
        v, i = fd.ops.topk(t, 4, dim=1, largest=False, sorted=True)
        fd.add_output(fd.ops.add(v, tb))
        fd.add_output(i)

    out = check_fusion(fn, [x, b], lambda x, b: [torch.topk(x, 4, dim=1, largest=False).values + b,
                                                 torch.topk(x, 4, dim=1, largest=False).indices],
                       expected_segments=["InnerPersistent"])
    assert out[1].dtype == torch.int64


def test_topk_ties_lowest_index_first():
    """Equal candidates: values as eager's bit for bit (no tied zeros here), indices lowest first, and they
    point at the values. (ATen's CPU topk gives [2, 4, 1] for the first row; its order is unspecified.)"""
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.5],
                      [float("nan"), 1.0, float("nan"), 5.0, 2.0, 5.0],
                      [4.0, 4.0, 4.0, 4.0, 4.0, 4.0]], device=DEVICE)
    fd = define(_topk_fusion(3, 1, True))
    v, i = fd.execute([x])
    rv, _ = torch.topk(x, 3, dim=1, sorted=True)
    bits_equal(v, rv)
    assert i.tolist() == [[1, 2, 4], [0, 2, 3], [0, 1, 2]]
    bits_equal(torch.gather(x, 1, i), v)
    fd = define(_topk_fusion(3, 1, False))
    v, i = fd.execute([x])
    assert i.tolist() == [[5, 0, 3], [1, 4, 3], [0, 1, 2]]
    bits_equal(v, torch.topk(x, 3, dim=1, largest=False, sorted=True).values)
    # Only NaNs left for the smallest: they come last, in index order.
    y = torch.tensor([[float("nan"), 2.0, float("nan"), float("nan")]], device=DEVICE)
    v, i = define(_topk_fusion(3, 1, False)).execute([y])
    assert i.tolist() == [[1, 0, 2]] and v[0, 0].item() == 2.0 and v[0, 1:].isnan().all()


def test_topk_stays_on_aten_when_not_lowered():
    x = distinct_specials((4, 8)).nan_to_num(0.0, posinf=9.0, neginf=-9.0)
    for kwargs, k in (({"sorted": False}, 3), ({"sorted": True}, 1)):
        def fn(fd, kwargs=kwargs, k=k):
            v, i = fd.ops.topk(fd.from_pytorch(x), k, dim=1, **kwargs)
            fd.add_output(fd.ops.mul(v, 2.0))
            fd.add_output(i)

        fd = define(fn)
        out = fd.execute([x])
        assert fd.segments()[0].kind.value == "ExprEval"
        rv, ri = torch.topk(x, k, dim=1, **kwargs)
        if kwargs["sorted"]:
            bits_equal(out[0], rv * 2.0)
            bits_equal(out[1], ri)
    # A selected dim wider than 256 (known only at run time) runs the segment on ATen, saying why.
    wide = torch.randn(3, 300, device=DEVICE)
    fd = define(_topk_fusion(2, 1, True))
    v, i = fd.execute([wide])
    rv, ri = torch.topk(wide, 2, dim=1)
    bits_equal(v, rv)
    bits_equal(i, ri)
    assert "topk over 300 elements" in str(fd.last_execution()[0])


def test_moments_of_a_topk_result_count_only_its_lanes():
    # var over the k selected values divides by k (their lanes), not by the n columns the kernel iterates.
    x = ((torch.randperm(60, generator=torch.Generator().manual_seed(5)).view(6, 10) - 30) * 0.5).to(DEVICE)

    def fn(fd):
        v, _ = fd.ops.topk(fd.from_pytorch(x), 3, dim=1, sorted=True)
        var, mean = fd.ops.var_mean(v, dims=[1], correction=1)
        fd.add_output(var)
        fd.add_output(mean)

    fd = define(fn)
    var, mean = fd.execute([x])
    rv = torch.topk(x, 3, dim=1).values
    torch.testing.assert_close(var, rv.var(1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mean, rv.mean(1), atol=1e-6, rtol=1e-6)
    assert [s.kind.value for s in fd.segments()] == ["Reduction"]


def test_topk_of_a_topk_result_in_one_kernel():
    # The second top-k selects among the first one's k lanes only (not the n columns the kernel iterates).
    x = ((torch.randperm(72, generator=torch.Generator().manual_seed(6)).view(6, 12) - 36) * 0.5).to(DEVICE)

    def fn(fd):
        v, _ = fd.ops.topk(fd.from_pytorch(x), 4, dim=1, largest=False, sorted=True)
        w, i = fd.ops.topk(fd.ops.neg(v), 2, dim=1, sorted=True)
        fd.add_output(w)
        fd.add_output(i)

    fd = define(fn)
    w, i = fd.execute([x])
    rw, ri = torch.topk(-torch.topk(x, 4, dim=1, largest=False).values, 2, dim=1)
    bits_equal(w, rw)
    bits_equal(i, ri)
    assert len(fd.segments()) == 1
