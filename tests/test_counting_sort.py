"""The counting sort (segment/counting_sort.py, kernels/counting_sort.py): a 1-D stable argsort of keys that the IR
proves small-range (top-k indices), its inverse, the one-hot count of its keys and the kernel work reading the
counts, in one CountingSort segment and one launch; every output against eager ATen run op by op (values bit for
bit, shapes, dtypes, strides). Argsorts outside the rule stay on ATen and still match torch.argsort."""

from __future__ import annotations

import pytest
import torch

from harness import DEVICE, assert_same, check_fusion, define, transposed
from pyfuser import DataType
from pyfuser.kernels.counting_sort import MAX_BINS, counting_sort
from pyfuser.ops.value_range import index_range
from pyfuser.runtime import counting_sort_step
from pyfuser.segment.loop_domain import NotFusable


def _routing_logits(t: int, e: int, seed: int = 0, winners=None) -> torch.Tensor:
    """[t, e] distinct float scores (top-k among distinct values is the same in every implementation). With
    ``winners``, those experts score above all others, so only they are picked (empty experts, all to one)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randperm(t * e, generator=g).reshape(t, e).float() / (t * e)
    if winners is not None:
        for rank, w in enumerate(winners):
            x[:, w] += 10.0 * (len(winners) - rank)
    return x.to(DEVICE)


def _moe_routing(fd, x, t: int, e: int, k: int, counts_dtype=DataType.Int32):
    """The MoE layer's routing bookkeeping (pyfuser/demo/moe_nvfp4.py) on [t, e] scores: expert ids per (token,
    slot), their stable argsort and its inverse, tokens per expert and the exclusive offsets."""
    m = t * k
    _, topi = fd.ops.topk(x, k, dim=1, largest=True, sorted=True)
    ids = fd.ops.reshape(topi, [m])
    perm = fd.ops.argsort(ids, dim=0, stable=True)
    inv = fd.ops.argsort(perm, dim=0)
    iota = fd.ops.broadcast_in_dim(fd.ops.iota(e, dtype=DataType.Int), shape=[m, e], broadcast_dims=[1])
    one_hot = fd.ops.eq(fd.ops.broadcast_in_dim(ids, shape=[m, e], broadcast_dims=[0]), iota)
    counts = fd.ops.sum(fd.ops.cast(one_hot, counts_dtype), dims=[0])
    starts = fd.ops.cast(fd.ops.sub(fd.ops.cumsum(counts, dim=0), counts), DataType.Int32)
    return perm, inv, counts, starts


def _eager_routing(x, k: int, e: int, counts_dtype=torch.int32):
    _, topi = torch.topk(x, k, dim=1, largest=True, sorted=True)
    ids = topi.reshape(-1)
    perm = torch.argsort(ids, dim=0, stable=True)
    inv = torch.argsort(perm, dim=0)
    one_hot = ids[:, None] == torch.arange(e, device=x.device)[None, :]
    counts = one_hot.to(counts_dtype).sum(0)
    starts = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    return perm, inv, counts, starts


def _segment_kinds(fd) -> list[str]:
    return [s.kind.value for s in fd.segments()]


@pytest.mark.parametrize("t,e,k", [(16, 8, 2), (13, 5, 3), (1, 4, 1), (37, 8, 2), (100, 3, 3)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_routing_is_one_counting_sort_segment(t, e, k, layout):
    """M = t * k not a power of two in most cases; many duplicate keys (t * k keys over e experts), so the
    argsort's stability decides the permutation."""
    x = _routing_logits(t, e, seed=t + e)
    if layout == "transposed":
        x = x.t().contiguous().t()

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True] if layout == "contiguous" else [True, True],
                              dtype=DataType.Float, stride_order=[1, 0] if layout == "contiguous" else [0, 1])
        for out in _moe_routing(fd, xs, t, e, k):
            fd.add_output(out)

    outs = check_fusion(fn, [x], lambda x: _eager_routing(x, k, e), atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x])
    if t * k == 1:  # (a sum over one row is a squeeze: no histogram to fuse, and top-1 runs on ATen)
        assert "CountingSort" in _segment_kinds(fd), _segment_kinds(fd)
        return
    assert _segment_kinds(fd) == ["Reduction", "CountingSort"], _segment_kinds(fd)
    report = fd.last_execution()[1]
    # One launch: the counting sort with the offsets scan as its epilogue (the reshape of the ids is a view).
    assert [st.kind for st in report.steps] == ["aten", "op kernel"], str(report)
    assert "counting_sort + epilogue pf_" in str(report), str(report)
    assert outs[0].dtype == torch.int64 and outs[2].dtype == torch.int64


@pytest.mark.parametrize("winners,k", [((3,), 1), ((6, 2), 2), ((0, 7), 1)])
def test_empty_experts_and_all_tokens_to_one(winners, k):
    t, e = 29, 8
    x = _routing_logits(t, e, seed=4, winners=winners)

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        for out in _moe_routing(fd, xs, t, e, k):
            fd.add_output(out)

    outs = check_fusion(fn, [x], lambda x: _eager_routing(x, k, e), atol=0, rtol=0)
    assert (outs[2] == 0).sum() == e - len(winners) + (1 if k < len(winners) else 0)


def test_sixteen_thousand_keys():
    """The MoE layer's prefill shape: T = 8192 tokens, k = 2, so M = 16384 keys over E = 8 experts."""
    t, e, k = 8192, 8, 2
    x = _routing_logits(t, e, seed=1)

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        for out in _moe_routing(fd, xs, t, e, k):
            fd.add_output(out)

    fd = define(fn)
    outs = fd.execute([x])
    for i, (o, r) in enumerate(zip(outs, _eager_routing(x, k, e))):
        assert_same(o, r, atol=0, rtol=0, what=f"output {i}")
    assert _segment_kinds(fd) == ["Reduction", "CountingSort"]


def test_strided_keys_and_int32_keys_without_histogram():
    """Keys that are a column of the top-k indices (stride k), cast to Int32: the sort and its inverse alone."""
    t, e, k = 23, 6, 3
    x = _routing_logits(t, e, seed=9)

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        _, topi = fd.ops.topk(xs, k, dim=1, largest=True, sorted=True)
        keys = fd.ops.cast(fd.ops.select(topi, 1, 1), DataType.Int32)
        perm = fd.ops.argsort(keys, dim=0, stable=True)
        fd.add_output(perm)
        fd.add_output(fd.ops.argsort(perm, dim=0, stable=True))

    def ref(x):
        keys = torch.topk(x, k, dim=1, largest=True, sorted=True)[1].select(1, 1).to(torch.int32)
        perm = torch.argsort(keys, dim=0, stable=True)
        return perm, torch.argsort(perm, dim=0, stable=True)

    check_fusion(fn, [x], ref, atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x])
    assert "CountingSort" in _segment_kinds(fd)


@pytest.mark.parametrize("chained", [True, False])
def test_epilogue_of_the_counts(chained, monkeypatch):
    """The counting reduction's per-row epilogue (counts cast and broadcast to [E, 8192], read by a later kernel)
    runs at the end of the sort's launch; an epilogue that cannot (monkeypatched: as one that needs several
    programs) is launched on its own in the same segment, with the same results."""
    t, e, k = 40, 4, 2
    x = _routing_logits(t, e, seed=2)
    y = torch.randn(e, 8192, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    if not chained:
        def refuse(plan):
            raise NotFusable("needs several programs")

        monkeypatch.setattr(counting_sort_step, "plan_epilogue", refuse)

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        ys = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        perm, _, counts, _ = _moe_routing(fd, xs, t, e, k)
        fd.add_output(perm)
        c = fd.ops.broadcast_in_dim(fd.ops.cast(counts, DataType.Float), shape=[e, 8192], broadcast_dims=[0])
        fd.add_output(fd.ops.mul(ys, c))

    def ref(x, y):
        perm, _, counts, _ = _eager_routing(x, k, e)
        return perm, y * counts.float()[:, None]

    check_fusion(fn, [x, y], ref, atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x, y])
    kinds = _segment_kinds(fd)
    assert "CountingSort" in kinds, kinds
    report = fd.last_execution()[kinds.index("CountingSort")]
    launches = [st.kind for st in report.steps if st.kind != "aten"]
    if chained:
        assert launches == ["op kernel"] and "counting_sort + epilogue pf_" in str(report), str(report)
    else:
        assert launches == ["op kernel", "triton"], str(report)


def test_more_keys_than_bins_fall_back_to_aten():
    """Top-k over 2000 candidates: keys may take 2000 values, more than MAX_BINS; ATen sorts, same results."""
    t, n, k = 6, 2000, 3
    assert n > MAX_BINS
    x = _routing_logits(t, n, seed=5)

    def fn(fd):
        xs = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        _, topi = fd.ops.topk(xs, k, dim=1, largest=True, sorted=True)
        perm = fd.ops.argsort(fd.ops.reshape(topi, [t * k]), dim=0, stable=True)
        fd.add_output(perm)
        fd.add_output(fd.ops.argsort(perm, dim=0))

    def ref(x):
        perm = torch.argsort(torch.topk(x, k, dim=1, largest=True, sorted=True)[1].reshape(-1), stable=True)
        return perm, torch.argsort(perm)

    check_fusion(fn, [x], ref, atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x])
    report = fd.last_execution()[_segment_kinds(fd).index("CountingSort")]
    assert "more than the counting sort's" in str(report) and all(st.kind == "aten" for st in report.steps)


@pytest.mark.parametrize("case", ["float_nan", "negative_ints", "large_range", "unstable", "descending"])
def test_argsorts_outside_the_rule_stay_on_aten(case):
    """Keys without a proven small range (fusion inputs: floats with NaN, negative or large ints), an unstable or a
    descending sort: ATen's argsort, as before, against torch.argsort."""
    g = torch.Generator().manual_seed(11)
    stable, descending = case != "unstable", case == "descending"
    if case == "float_nan":
        x = torch.tensor([float("nan"), 1.0, -0.0, 0.0, float("-inf"), 1.0, float("nan"), 2.5] * 9)
    elif case == "negative_ints":
        x = torch.randint(-5, 5, (77,), generator=g)
    else:
        x = torch.randint(0, 1 << 40, (61,), generator=g) if case == "large_range" else \
            torch.randint(0, 3, (70,), generator=g)
    x = x.to(DEVICE)

    def fn(fd):
        xs = fd.from_pytorch(x)
        fd.add_output(fd.ops.argsort(xs, dim=0, stable=stable, descending=descending))

    fd = define(fn)
    (out,) = fd.execute([x])
    assert _segment_kinds(fd) == ["ExprEval"]
    ref = torch.argsort(x.cpu(), dim=0, stable=stable, descending=descending)
    if stable:
        assert torch.equal(out.cpu(), ref)
    else:  # ATen's order of equal keys is unspecified without stable=True: a permutation sorting the keys
        assert torch.equal(x.cpu()[out.cpu()], x.cpu()[ref])


def test_small_range_sort_of_non_index_keys_stays_on_aten():
    """An argsort of ids that a fusion input provides (no proven range) keeps ATen's sort."""
    ids = torch.randint(0, 4, (50,), generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def fn(fd):
        fd.add_output(fd.ops.argsort(fd.from_pytorch(ids), dim=0, stable=True))

    fd = define(fn)
    (out,) = fd.execute([ids])
    assert _segment_kinds(fd) == ["ExprEval"]
    assert torch.equal(out.cpu(), torch.argsort(ids.cpu(), stable=True))


def test_index_range_facts():
    def fn(fd):
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        vals, idx = fd.ops.topk(x, 2, dim=1)
        flat = fd.ops.reshape(idx, [6])
        assert index_range(flat).source is x and index_range(flat).dim == 1
        assert index_range(fd.ops.cast(flat, DataType.Int32)) is not None
        assert index_range(fd.ops.cast(flat, DataType.Float)) is None  # not an integer tensor
        assert index_range(fd.ops.add(flat, 1)) is None  # arithmetic leaves the range
        assert index_range(vals) is None
        assert index_range(fd.ops.argsort(vals, dim=0)).dim == 0
        fd.add_output(flat)

    define(fn)


@pytest.mark.parametrize("m,n_bins,n_counts", [(0, 4, 4), (1, 1, 1), (97, 7, 9), (3000, 8, 5), (129, MAX_BINS, 3)])
def test_kernel_against_torch(m, n_bins, n_counts):
    """The kernel alone: strided keys, counts with fewer or more bins than keys' values, M not a power of two."""
    g = torch.Generator().manual_seed(m)
    keys = torch.randint(0, n_bins, (2 * m,), generator=g).to(DEVICE)[::2]
    perm = torch.full((m,), -1, dtype=torch.int64, device=DEVICE)
    inv = torch.full((m,), -1, dtype=torch.int64, device=DEVICE)
    counts = torch.full((n_counts * 2,), -1, dtype=torch.int32, device=DEVICE)[::2]
    counting_sort(keys, n_bins, perm, inv, counts)
    ref = torch.argsort(keys.cpu(), stable=True)
    assert torch.equal(perm.cpu(), ref)
    assert torch.equal(inv.cpu(), torch.argsort(ref))
    want = torch.bincount(keys.cpu(), minlength=max(n_bins, n_counts))[:n_counts].to(torch.int32)
    assert torch.equal(counts.cpu(), want)
