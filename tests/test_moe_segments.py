"""The NVFP4 MoE layer fusion's segments (pyfuser/demo/moe_nvfp4.py): which ops fuse, how many segments, and the
output bit for bit equal to the layer as it was defined before its combine and offsets were restructured for
fusion (a reshape of gathered rows summed over the slot dim; offsets scanned from the counts), and to the layer
run without load prologues (the gather and SiLU*up producers as kernels of their own)."""

from __future__ import annotations

import pytest
import torch
from harness import DEVICE

from pyfuser import DataType, FusionDefinition
from pyfuser.demo import moe_nvfp4 as moe
from pyfuser.segment import segmenter

TINY = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)

# What runs, segment by segment (kind, ops that must be in it). 15 segments before top-k, index_select and the
# offsets/tables merge, 12 before the quantize kernels took load prologues, 10 before the counting sort; the rest
# is bounded by the segmenter's rules (docs/codegen.md, "The MoE layer").
EXPECTED = [
    ("ExprEval", {"linear"}),
    ("InnerPersistent", {"max", "exp", "topk"}),  # softmax, top-k, renormalised weights: one kernel
    # both argsorts, tokens per expert, both offset scans and both problem-size tables: one launch
    ("CountingSort", {"argsort", "eq", "sum", "cumsum", "cat", "full"}),
    # permuted rows of x gathered by flat index // k inside the quantize kernel (its load prologue)
    ("PointWise", {"div", "index_select", "nv_grouped_block_quantize"}),
    ("ExprEval", {"cutlass_nvfp4_grouped_mm"}),
    ("PointWise", {"silu", "mul", "nv_grouped_block_quantize"}),  # SiLU(gate) * up: the quantize's prologue
    ("ExprEval", {"cutlass_nvfp4_grouped_mm"}),
    ("PointWise", {"index_select", "mul", "add"}),  # un-permute and weighted sum over the slots
]


def _old_offsets(fd, counts, E):
    starts = fd.ops.cast(fd.ops.sub(fd.ops.cumsum(counts, dim=0), counts), DataType.Int32)
    padded = fd.ops.mul(fd.ops.div(fd.ops.add(counts, 127), 128), 128)
    sf_starts = fd.ops.cast(fd.ops.sub(fd.ops.cumsum(padded, dim=0), padded), DataType.Int32)
    counts_col = fd.ops.broadcast_in_dim(fd.ops.cast(counts, DataType.Int32), shape=[E, 1], broadcast_dims=[0])
    return starts, sf_starts, counts_col


def _old_combine(fd, cfg, y_perm, inv_perm, topw, T):
    k, H = cfg.top_k, cfg.hidden
    y = fd.ops.cast(fd.ops.reshape(fd.ops.index_select(y_perm, inv_perm, 0), [T, k, H]), DataType.Float)
    wts = fd.ops.broadcast_in_dim(topw, shape=[T, k, H], broadcast_dims=[0, 1])
    return fd.ops.cast(fd.ops.sum(fd.ops.mul(y, wts), dims=[1]), DataType.BFloat16)


def _old_fusion(cfg, T):
    with FusionDefinition() as fd:
        E, k = cfg.experts, cfg.top_k
        M = T * k
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        w_router = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        experts = moe.define_expert_weights(fd)
        topw, topi = moe.define_router(fd, x, w_router, k)
        flat_ids, x_perm, inv_perm = moe.define_permutation(fd, x, topi, M, k)
        offsets = _old_offsets(fd, moe.define_counts(fd, flat_ids, M, E), E)
        y_perm = moe.define_experts(fd, cfg, x_perm, experts, offsets, M, E, "grouped")
        fd.add_output(_old_combine(fd, cfg, y_perm, inv_perm, topw, T))
    return fd


def test_moe_layer_segments_and_values_as_before(monkeypatch):
    T = 24
    weights = moe.quantize_weights(moe.make_weights(TINY, DEVICE, seed=3))
    layer = moe.MoENVFP4(TINY, weights)
    x = torch.randn(T, TINY.hidden, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.bfloat16)
    out = layer(x)
    fd = layer.fusion(T)
    reports = fd.last_execution()
    segments = fd.segments()
    assert len(segments) == len(EXPECTED), [s.kind.value for s in segments]
    for seg, report, (kind, ops) in zip(segments, reports, EXPECTED):
        names = {e.op.name for e in seg.exprs}
        assert seg.kind.value == kind and ops <= names, (seg.index, seg.kind.value, sorted(names))
        if kind == "CountingSort":  # the counting sort with the offsets kernel as its epilogue: one launch
            assert [st.kind for st in report.steps] == ["aten", "op kernel", "aten"], str(report)  # views around it
            assert "counting_sort + epilogue pf_persistent_" in str(report), str(report)
        elif kind != "ExprEval" and "nv_grouped_block_quantize" not in names:
            assert "triton kernel" in str(report), str(report)  # a generated kernel, not the ATen fallback
        if "nv_grouped_block_quantize" in names:  # the producer runs inside the kernel, not on ATen
            assert "+ load prologue pf_" in report.reason, str(report)
    (before,) = _old_fusion(TINY, T).execute(layer.inputs(x))
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))
    # Without the counting sort: the argsorts on ATen, counts and offsets as two kernels (10 segments), same bits.
    monkeypatch.setattr(segmenter, "merge_counting_sorts", lambda fusion, pieces, *kinds: (pieces, {}))
    unsorted = moe.MoENVFP4(TINY, weights)
    (aten_sort,) = unsorted.fusion(T).execute(unsorted.inputs(x))
    assert len(unsorted.fusion(T).segments()) == 10
    assert torch.equal(out.view(torch.int16), aten_sort.view(torch.int16))
    # Without prologues either: the gather and SiLU * up are kernels of their own (12 segments), same bits.
    monkeypatch.setattr(segmenter, "_merge_prologues", lambda fusion, pieces: (pieces, {}))
    unfused = moe.MoENVFP4(TINY, weights)
    (alone,) = unfused.fusion(T).execute(unfused.inputs(x))
    assert len(unfused.fusion(T).segments()) == 12
    assert torch.equal(out.view(torch.int16), alone.view(torch.int16))


@pytest.mark.parametrize("tokens", [16, 8192])
def test_moe_layer_segment_count_at_serving_shapes(tokens):
    """The layer's segments at the benchmark's token counts (T = 16 decode, T = 8192 prefill: M = 16384 keys for
    the counting sort, whose values tests/test_counting_sort.py checks at that size), with small H and I: 8."""
    cfg = moe.MoEConfig(hidden=128, intermediate=64, experts=8, top_k=2)
    with FusionDefinition() as fd:
        moe.define_moe(fd, cfg, tokens)
    segments = segmenter.segment_fusion(fd.fusion).segments
    assert [s.kind.value for s in segments] == [k for k, _ in EXPECTED], segments
    for seg, (kind, ops) in zip(segments, EXPECTED):
        assert ops <= {e.op.name for e in seg.exprs}, seg
