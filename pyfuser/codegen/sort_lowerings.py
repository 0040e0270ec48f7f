"""Triton lowering of top-k over a small dim (the MoE router's experts), attached to the registry by name.

``topk(x, k, dim, largest, sorted=True)`` with ``k`` known when the fusion is defined (2 <= k <= 16) and the
selected dim at most 256 wide becomes part of a persistent kernel: the selected dim is one of the kernel's column
dims (like a reduction's), every row sits in registers, and the k results are picked one after the other, each a
few row reductions:

1. the best remaining value (``max``, NaN above everything, as torch orders it; for ``largest=False`` the
   smallest non-NaN value, NaN only once nothing else is left);
2. the lowest column index holding it (-0.0 and +0.0 are equal, as torch compares them);
3. the value at that index, picked by its bit pattern (exact: NaN payloads, the sign of zero);
4. that index is taken out for the next round.

The two outputs are k wide along a loop dim of the input's n: *narrow* tensors (segment/loop_domain.py,
``narrowing_dims``). Their values carry a lane mask (``KValue.valid``), so reductions fold only the k lanes and
stores write only them.

Ties: the kernel takes the lowest index first. Eager's order among equal values is not specified and differs by
device: ATen's CPU topk is a partial sort (``[1, 3, 3, 2, 3]``, k=3 gives indices ``[2, 4, 1]`` on torch 2.13),
and its CUDA topk gathers candidates in index order and then sorts them with an unstable bitonic network for
k <= 32. So values always agree with eager bit for bit except the sign of a zero chosen among tied zeros, and
indices agree wherever the selected values are distinct (docs/codegen.md).

``sorted=False`` (an order torch leaves unspecified) and ``k`` known only at run time stay on ATen.

Why not Triton's own ``tl.topk`` / ``tl.sort`` (Triton 3.6): both are a bitonic network over a power-of-two
extent that returns the sorted *values* only (``tl.topk(x, k)`` is the first k of a descending sort), and it
compares with ``>``, which leaves NaN unordered where torch puts it above everything. Indices would have to be
packed into the sort key (value bits and index in one integer, with NaN and -0.0 mapped by hand) and the extent
padded; for the k <= 16 of a router, k selection passes over registers are simpler and exact.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import to_torch_dtype
from ..ops.registry import attach
from ..segment.loop_domain import NotFusable
from .kernel_builder import TL_DTYPE
from .memory_views import Access, MemoryReadLowering, no_operands, static_int
from .plan import TUNING, row_tiles

MAX_EXTENT = 256  # widest selected dim: whole rows in registers, k passes over them
MAX_K = 16  # each result costs four row reductions
_FLOAT_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _topk_refusal(node):
    dtype = to_torch_dtype(node.inputs[0].dtype)
    k = static_int(node.args[1])
    if not node.kwargs.get("sorted", False):
        return "fd.ops.topk with sorted=False runs on ATen"
    if k is None:
        return "fd.ops.topk with k known only at run time runs on ATen"
    if not 2 <= k <= MAX_K:
        return f"fd.ops.topk with k={k} runs on ATen (generated kernels select 2 to {MAX_K} values)"
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64):
        return f"fd.ops.topk on {dtype} runs on ATen"
    extent = node.inputs[0].logical[node.kwargs["dim"]].extent
    if extent is not None and extent > MAX_EXTENT:
        return f"fd.ops.topk over {extent} elements runs on ATen (generated kernels select among <= {MAX_EXTENT})"
    return None


def _plan_topk(node, metas, relocated=None):
    return Access([], [(node.inputs[0], node.kwargs["dim"])])  # the selected dim's coordinate: the index


def _column_dims(node):
    return [node.kwargs["dim"]]


def _narrowing_dims(node):
    return [(o, node.kwargs["dim"]) for o in node.outputs]


def _emit_topk(node, kb, access, x, k, dim, largest=True, sorted=False):
    if not x.full:
        raise NotFusable("fd.ops.topk over a dim its input is broadcast along")
    inp = node.inputs[0]
    k = static_int(node.args[1])
    if kb.n_cols > MAX_EXTENT:  # the selected dim is the kernel's only column dim
        raise NotFusable(f"fd.ops.topk over {kb.n_cols} elements (generated kernels select among <= {MAX_EXTENT})")
    dtype = x.dtype
    c = kb.coordinate_of(inp, dim)
    is_float = dtype.is_floating_point
    # Comparisons in fp32 for 16-bit floats (exact and order-preserving); the value itself is picked by its bits.
    key = kb.cast(x, torch.float32) if is_float and dtype.itemsize == 2 else x
    kd = key.dtype
    if is_float:
        low, high = kb.const(float("-inf"), kd), kb.const(float("inf"), kd)
        bits_dtype = _FLOAT_BITS[dtype.itemsize]
        bits = kb.op(f"{{0}}.to({TL_DTYPE[bits_dtype]}, bitcast=True)", [x], bits_dtype)
    else:
        info = torch.iinfo(kd)
        low, high = kb.const(info.min, kd), kb.const(info.max, kd)
        bits_dtype, bits = dtype, x
    bits_low = kb.const(torch.iinfo(bits_dtype).min, bits_dtype)
    no_index = kb.const(2**30, c.dtype)
    taken = None
    out_v = out_i = None
    for j in range(k):
        # Candidates: not taken yet, and inside a narrow input (a top-k of a top-k result in the same kernel).
        avail = None if taken is None else kb.op("({0} == 0)", [taken], torch.bool)
        if x.valid is not None:
            avail = x.valid if avail is None else kb.op("{0} & {1}", [avail, x.valid], torch.bool)

        def among(v, other):
            return v if avail is None else kb.op("tl.where({0}, {1}, {2})", [avail, v, other], v.dtype)

        if largest or not is_float:
            kind = ("max" if largest else "min") + ("" if is_float else "_int")
            best = kb.reduce(kind, among(key, low if largest else high))
            is_best = kb.op("({0} == {1})", [key, best], torch.bool)
            if is_float:  # NaN is the largest value (two NaNs tie)
                is_best = kb.op("{0} | (({1} != {1}) & ({2} != {2}))", [is_best, key, best], torch.bool)
        else:
            number = kb.op("({0} == {0})", [key], torch.bool)
            if avail is not None:
                number = kb.op("{0} & {1}", [number, avail], torch.bool)
            best = kb.reduce("min", kb.op("tl.where({0}, {1}, {2})", [number, key, high], kd))
            any_number = kb.reduce("max_int", kb.cast(number, torch.int32))
            is_best = kb.op("tl.where({0} > 0, {1} == {2}, {1} != {1})", [any_number, key, best], torch.bool)
        if avail is not None:
            is_best = kb.op("{0} & {1}", [is_best, avail], torch.bool)
        index = kb.reduce("min_int", kb.op("tl.where({0}, {1}, {2})", [is_best, c, no_index], c.dtype))
        hit = kb.op("({0} == {1})", [c, index], torch.bool)
        value_bits = kb.reduce("max_int", kb.op("tl.where({0}, {1}, {2})", [hit, bits, bits_low], bits_dtype))
        # (Triton may widen a 16-bit max to int32: narrow it again before the bitcast)
        value = value_bits if not is_float else kb.op(
            f"{{0}}.to({TL_DTYPE[bits_dtype]}).to({TL_DTYPE[dtype]}, bitcast=True)", [value_bits], dtype)
        taken = hit if taken is None else kb.op("{0} | {1}", [taken, hit], torch.bool)
        lane = kb.op("({0} == {1})", [c, kb.const(j, c.dtype)], torch.bool)
        index64 = kb.cast(index, torch.int64)
        out_v = kb.op("tl.where({0}, {1}, {2})", [lane, value, value if out_v is None else out_v], dtype)
        out_i = kb.op("tl.where({0}, {1}, {2})", [lane, index64, index64 if out_i is None else out_i], torch.int64)
    valid = kb.op("({0} < {1})", [c, kb.const(k, c.dtype)], torch.bool)
    out_v.valid = out_i.valid = valid
    return out_v, out_i


# --------------------------------------------------------------------------------------------------------------
# argsort
#
# ``argsort(x, dim, descending, stable)`` over a dim of at most 256 joins a persistent kernel the same way: the
# sorted dim is a column dim, and the kernel computes each element's rank (the elements before it: smaller keys,
# or larger for descending; NaN after every number ascending and before it descending, as torch.sort orders it;
# equal keys, -0.0 == +0.0 and NaN == NaN, at lower indices) and then the inverse of that permutation
# (KernelBuilder.argsort: two loops over the columns, O(n) registers). The order is always the stable one, which
# is exactly stable=True's; stable=False leaves the order of equal keys unspecified, and the kernel gives the
# stable order there too (ATen's CPU sort with stable=False need not: docs/codegen.md).


def _argsort_refusal(node):
    dtype = to_torch_dtype(node.inputs[0].dtype)
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64,
                     torch.int16, torch.int8, torch.uint8, torch.bool):
        return f"fd.ops.argsort on {dtype} runs on ATen"
    if node.inputs[0].ndim <= 1:  # (a 0-D argsort is 0; ATen gives it)
        # One row: a kernel of one program doing O(n^2) work, and its result usually indexes the rows of other
        # tensors (the MoE layer's permutation), so it would split their kernels. ATen's sort it is.
        return "fd.ops.argsort of a 1-D tensor runs on ATen"
    extent = node.inputs[0].logical[node.kwargs["dim"]].extent
    if extent is not None and extent > MAX_EXTENT:
        return f"fd.ops.argsort over {extent} elements runs on ATen (generated kernels sort <= {MAX_EXTENT})"
    return None


def _emit_argsort(node, kb, access, x, dim, descending=False, stable=False):
    if x.valid is not None:
        raise NotFusable("fd.ops.argsort of a top-k result in the same kernel")
    if kb.n_cols > MAX_EXTENT:  # the sorted dim is the kernel's only column dim
        raise NotFusable(f"fd.ops.argsort over {kb.n_cols} elements (generated kernels sort <= {MAX_EXTENT})")
    if not kb.has_columns:  # the sorted dim has one element (dropped from the loops): its index is 0
        return kb.const(0, torch.int64)
    if kb.n_cols > TUNING["persistent_max_cols"] or row_tiles(kb.n_cols) is not None:
        raise NotFusable("fd.ops.argsort needs whole rows in registers (a persistent kernel), not this kernel mode")
    dtype = x.dtype
    # Keys compare exactly and in the same order in fp32 (16-bit floats) or int32 (narrow ints, Bool).
    if dtype.is_floating_point:
        key = kb.cast(x, torch.float32) if dtype.itemsize == 2 else x
    else:
        key = kb.cast(x, torch.int32) if dtype.itemsize < 4 else x
    c = kb.coordinate_of(node.inputs[0], dim)
    return kb.cast(kb.argsort(key, c, bool(descending)), torch.int64)


_argsort = MemoryReadLowering(no_operands, _plan_topk, _emit_argsort, _argsort_refusal)
_argsort.column_dims = _column_dims
attach("argsort", lower=_argsort)


_topk = MemoryReadLowering(no_operands, _plan_topk, _emit_topk, _topk_refusal)
_topk.column_dims = _column_dims
_topk.narrowing_dims = _narrowing_dims
attach("topk", lower=_topk)
