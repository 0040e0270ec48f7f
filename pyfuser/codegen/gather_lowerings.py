"""Triton lowerings of index_select, gather and take_along_axis: indexed loads, attached to the registry by name.

``index_select(arg, index, dim)``: the output element at coordinates ``c`` is ``arg`` at ``c`` with ``c[dim]``
replaced by ``index[c[dim]]``. ``arg`` is read from global memory through a view (codegen/memory_views.py) whose
``dim`` stride is a *gathered* stride: the load adds ``index * stride``. The index tensor is an ordinary operand of
the kernel: the output's ``dim`` is the same loop dim as the index's only dim, so the index may be computed in
the same kernel (the MoE layer's ``flat slot // k``).

Out-of-range indices (negative ones included: ATen's index_select raises for them on CPU and asserts on CUDA)
must be neither a silent wrong result nor a host synchronization. The kernel clamps the load to row 0 (it never
reads outside ``arg``) and sets an error flag of the call (runtime/device_errors.py, the sink the NVFP4 offset
checks use): on CUDA the next call of the fusion raises :class:`FusionExecutionError` naming the op and tensors
(the call that found it returned invalid values); on CPU (the interpreter) the flag is read right after the launch
and the call itself raises. A 0-D index (the dim kept with size 1) runs on ATen.

``gather(arg, index, dim)`` and ``take_along_axis(arg, index, dim)`` are the same load with an index of the
input's rank that varies per element: the output element at ``c`` is ``arg`` at ``c`` with ``c[dim]`` replaced by
``index[c]``; every output dim is the same loop dim as the index's dim at that position. gather's output has the
index's shape (``index.size(d) <= arg.size(d)`` for ``d != dim``: the arg is walked over the first elements only);
take_along_axis broadcasts index and arg along the other dims (a size-1 dim of either is read with stride 0).
Shapes ATen refuses (an index larger than arg for gather, extents that do not broadcast for take_along_axis) are
left to ATen, which raises its own error. Range checks as for index_select (ATen's gather and take_along_dim raise
for negative indices too: verified on CPU, torch 2.13).
"""

from __future__ import annotations

import torch

from ..ir.nodes import TensorView
from ..ops.registry import OpKind, attach
from ..segment.loop_domain import NotFusable
from .memory_views import Access, MemoryReadLowering, View, complex_refusal, require_gpu_tensor, view_strides

# The ATen function each op mirrors, named in the error message of an out-of-range index.
_ATEN_NAME = {"index_select": "index_select", "gather": "gather", "take_along_axis": "take_along_dim"}


class IndexRangeCheck:
    """One index_select's run-time check: its messages for a set flag (``runtime/device_errors.py``)."""

    def __init__(self, op: str, index_name: str, source_name: str, dim: int, extent: int):
        self.op, self.index_name, self.source_name, self.dim, self.extent = op, index_name, source_name, dim, extent

    def messages(self, bits: int) -> list[str]:
        return [f"fd.ops.{self.op}: index {self.index_name} holds a value outside [0, {self.extent}), the extent of "
                f"dim {self.dim} of {self.source_name} (negative indices are out of range too, as in ATen's "
                f"{_ATEN_NAME[self.op]})"]


def _index_is_arg_refusal(node):
    # The kernel reads arg through a view and the index as a loop operand: one tensor cannot be both.
    if node.args[1] is node.args[0]:
        return f"fd.ops.{node.op.name} whose index is its arg runs on ATen"
    return complex_refusal(node)


def _index_select_refusal(node):
    if node.args[1].ndim != 1:
        return "fd.ops.index_select with a 0-D index runs on ATen"
    return _index_is_arg_refusal(node)


def _index_select_operands(node):
    return [node.args[0]]


def _index_select_loop_map(node):
    return [((node.outputs[0], node.kwargs["dim"]), (node.args[1], 0))]


def _plan_index_select(node, metas, relocated=None):
    src, out, dim = node.args[0], node.outputs[0], node.kwargs["dim"]
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    strides, sizes = list(view_strides(meta)), [int(n) for n in meta.sizes]
    gathered = int(meta.strides[dim])
    strides[dim], sizes[dim] = 0, 1  # the coordinate along ``dim`` comes from the index, not the loop
    check = IndexRangeCheck("index_select", node.args[1].name, src.name, dim, int(meta.sizes[dim]))
    return Access([View(src, out, tuple(sizes), tuple(strides), gathers=(gathered,))], [], {"check": check})


def _emit_index_select(node, kb, access, arg, index, dim):
    check = access.info["check"]  # (gather and take_along_axis emit the same load)
    i64 = torch.int64
    idx = kb.cast(index, i64)
    bad = kb.op("({0} < 0) | ({0} >= {1})", [idx, kb.fixed_int(check.extent)], torch.bool)
    flag = kb.error_flag(bad, check)
    safe = kb.op("tl.where({0}, 0, {1})", [bad, idx, flag], i64)  # (the flag is set before the load)
    return kb.load(access.views[0].param, indices=(safe,))


attach("index_select", lower=MemoryReadLowering(_index_select_operands, _plan_index_select, _emit_index_select,
                                                _index_select_refusal, _index_select_loop_map))


def _elementwise_index_loop_map(node):
    out, index = node.outputs[0], node.args[1]
    return [((out, d), (index, d)) for d in range(out.ndim)]


# Ops whose output has their first input's extents (an index computed by them has its operand's shape).
_SAME_SHAPE_OPS = ("argsort", "cumsum", "cast", "neg", "abs")


def _extents(tv, metas, depth: int = 8):
    """``tv``'s extents for this signature: its layout if it is a segment boundary, else those of what it is
    computed from (elementwise ops broadcast their operands' extents; argsort, cumsum keep their input's); None
    when unknown."""
    if id(tv) in metas:
        return [int(n) for n in metas[id(tv)].sizes]
    e = tv.defined_by
    if e is None or depth == 0:
        return None
    if e.op.name in _SAME_SHAPE_OPS:
        return _extents(e.inputs[0], metas, depth - 1)
    if e.op.kind is not OpKind.POINTWISE or e.op.loop_map is not None or len(e.outputs) != 1:
        return None
    out = [1] * tv.ndim
    for t in e.inputs:
        if not isinstance(t, TensorView):
            continue
        sizes = _extents(t, metas, depth - 1)
        if sizes is None:
            return None
        for j, n in enumerate(sizes):  # right-aligned, as elementwise ops broadcast
            d = tv.ndim - len(sizes) + j
            out[d] = n if out[d] == 1 else out[d]
    return out


def _output_sizes(node, metas, src_sizes) -> list:
    """The output's extents for this signature: its own layout if it leaves the kernel, else from the index's
    (gather: the index's shape; take_along_axis: index and arg broadcast, the gathered dim the index's)."""
    out, index, dim = node.outputs[0], node.args[1], node.kwargs["dim"]
    if id(out) in metas:
        return [int(n) for n in metas[id(out)].sizes]
    idx = _extents(index, metas)
    if idx is None:
        raise NotFusable(f"fd.ops.{node.op.name}: the extents of {out.name} are unknown (its index {index.name} "
                         f"and itself are both made inside the kernel)")
    if node.op.name == "gather":
        return idx
    return [i if d == dim or i != 1 else a for d, (i, a) in enumerate(zip(idx, src_sizes))]


def _plan_elementwise_index(node, metas, relocated=None):
    src, index, out, dim = node.args[0], node.args[1], node.outputs[0], node.kwargs["dim"]
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    src_sizes = [int(n) for n in meta.sizes]
    sizes = _output_sizes(node, metas, src_sizes)
    idx_sizes = _extents(index, metas)
    for d, (n, a) in enumerate(zip(sizes, src_sizes)):
        if d == dim:
            continue
        # ATen's own error for shapes it refuses (the kernel would read outside arg or walk it wrongly).
        if node.op.name == "gather" and n > a:
            raise NotFusable(f"fd.ops.gather: {out.name} is larger than {src.name} in dim {d} ({n} > {a})")
        if node.op.name == "take_along_axis":
            if a not in (1, n) or (idx_sizes is not None and idx_sizes[d] not in (1, n)):
                raise NotFusable(f"fd.ops.take_along_axis: {src.name} and {index.name} do not broadcast in dim {d}")
    strides = list(view_strides(meta))
    gathered = int(strides[dim])  # (0 if arg has one element along dim: the only valid index is 0)
    strides[dim], sizes[dim] = 0, 1
    check = IndexRangeCheck(node.op.name, index.name, src.name, dim, src_sizes[dim])
    return Access([View(src, out, tuple(sizes), tuple(strides), gathers=(gathered,))], [], {"check": check})


for _name in ("gather", "take_along_axis"):
    attach(_name, lower=MemoryReadLowering(_index_select_operands, _plan_elementwise_index, _emit_index_select,
                                           _index_is_arg_refusal, _elementwise_index_loop_map))
