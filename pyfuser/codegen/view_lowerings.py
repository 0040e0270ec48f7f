"""Triton lowerings of the view ops, attached to the registry by name.

- broadcast, expand, permute, squeeze, stride_order: inside a kernel such a view changes nothing but which loop
  dims its value is indexed by (the op's ``loop_map`` says which); the value itself passes through;
- select and reshape: memory reads (memory_views.py) of their input through a view: select drops a dim at a
  fixed position (``base`` = index * stride), reshape re-strides the input where ``Tensor.view`` can (the strides
  torch's own view computes, on the actual layout). Where it cannot (eager copies), each element's input offset
  is computed from its row-major position by division and remainder over the input's extents;
- full and iota: no operands; full is its fill value (converted as ``torch.full`` converts it), iota is
  ``start + i * step`` in the compute dtype from the coordinate ``i`` of its dim.

A select or reshape returned as a fusion output is not lowered: the segmenter keeps it an ATen view of its
input, as eager returns it.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType, compute_dtype, to_torch_dtype
from ..ops.registry import attach
from ..segment.loop_domain import NotFusable
from .lowering import _operand, identity_view, out_dtype
from .memory_views import (
    Access,
    MemoryReadLowering,
    View,
    complex_refusal,
    first_operand,
    no_operands,
    require_gpu_tensor,
    static_int,
    view_strides,
)

for _name in ("broadcast", "broadcast_in_dim", "expand", "permute", "squeeze", "stride_order"):
    attach(_name, lower=identity_view)


# --- select ------------------------------------------------------------------------------------------------


def _select_refusal(node):
    if static_int(node.args[1]) is None:
        return "fd.ops.select with an index known only at run time runs on ATen"
    return complex_refusal(node)


def _plan_select(node, metas, relocated=None):
    src, out, dim = node.args[0], node.outputs[0], node.kwargs["dim"]
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    n, index = int(meta.sizes[dim]), static_int(node.args[1])
    if not -n <= index < n:  # ATen raises the op's own error
        raise NotFusable(f"fd.ops.select index {index} out of range for dim {dim} of extent {n}")
    index += n if index < 0 else 0
    keep = [d for d in range(src.ndim) if d != dim]
    strides = view_strides(meta)
    sizes = tuple(int(meta.sizes[d]) for d in keep)
    return Access([View(src, out, sizes, tuple(strides[d] for d in keep), index * int(meta.strides[dim]))])


def _emit_view(node, kb, access, *args, **kwargs):
    return kb.load(access.views[0].param)


# --- reshape -----------------------------------------------------------------------------------------------


def _reshape_refusal(node):
    if any(static_int(s) is None for s in node.kwargs["new_shape"]):
        return "fd.ops.reshape to a shape known only at run time runs on ATen"
    return complex_refusal(node)


def _plan_reshape(node, metas, relocated=None):
    src, out = node.args[0], node.outputs[0]
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    shape = [static_int(s) for s in node.kwargs["new_shape"]]
    probe = torch.empty_strided(tuple(meta.sizes), tuple(meta.strides), device="meta")
    try:
        viewed = probe.view(shape)
    except RuntimeError:
        # Not a view on this layout: each element's source offset is computed from its row-major position.
        sizes = tuple(probe.reshape(shape).shape)
        in_dims = [(int(n), int(st)) for n, st in zip(meta.sizes, meta.strides) if n != 1]
        view = View(src, out, sizes, (0,) * len(sizes), gathers=(1,))
        coords = [(out, d) for d, n in enumerate(sizes) if n != 1]
        return Access([view], coords, {"remap": (sizes, in_dims)})
    sizes = tuple(viewed.shape)
    strides = tuple(0 if n == 1 else s for n, s in zip(sizes, viewed.stride()))
    return Access([View(src, out, sizes, strides)])


def _emit_reshape(node, kb, access, *args, **kwargs):
    view = access.views[0]
    if "remap" not in access.info:
        return kb.load(view.param)
    sizes, in_dims = access.info["remap"]
    out, i64 = node.outputs[0], torch.int64
    flat, inner = kb.const(0, i64), 1  # the element's position in row-major order
    for d in reversed(range(len(sizes))):
        if sizes[d] != 1:
            c = kb.cast(kb.coordinate_of(out, d), i64)
            term = c if inner == 1 else kb.op("{0} * {1}", [c, kb.fixed_int(inner)], i64)
            flat = kb.op("{0} + {1}", [flat, term], i64)
        inner *= sizes[d]
    offset, inner = kb.const(0, i64), 1  # that position's offset in the input
    for n, stride in reversed(in_dims):
        q = flat if inner == 1 else kb.op("{0} // {1}", [flat, kb.fixed_int(inner)], i64)
        c = kb.op("{0} % {1}", [q, kb.fixed_int(n)], i64)
        offset = kb.op("{0} + {1} * {2}", [offset, c, kb.fixed_int(stride)], i64)
        inner *= n
    return kb.load(view.param, indices=(offset,))


# --- full, iota --------------------------------------------------------------------------------------------


def _plan_nothing(node, metas, relocated=None):
    return Access([])


def _emit_full(node, kb, access, shape, fill_value, dtype):
    target = out_dtype(node)
    return kb.cast(_operand(kb, fill_value, target), target)


def _plan_iota(node, metas, relocated=None):
    return Access([], [(node.outputs[0], 0)])


def _emit_iota(node, kb, access, length, start=None, step=None, dtype=DataType.Int):
    target = out_dtype(node)
    compute = to_torch_dtype(compute_dtype(node.outputs[0].dtype))
    i = kb.cast(kb.coordinate_of(node.outputs[0], 0), compute)
    if step is not None:
        i = kb.op("{0} * {1}", [i, _operand(kb, step, compute)], compute)
    if start is not None:
        i = kb.op("{0} + {1}", [i, _operand(kb, start, compute)], compute)
    return kb.cast(i, target)


attach("select", lower=MemoryReadLowering(first_operand, _plan_select, _emit_view, _select_refusal))
attach("reshape", lower=MemoryReadLowering(first_operand, _plan_reshape, _emit_reshape, _reshape_refusal))
attach("full", lower=MemoryReadLowering(no_operands, _plan_nothing, _emit_full, complex_refusal))
attach("iota", lower=MemoryReadLowering(no_operands, _plan_iota, _emit_iota, complex_refusal))
