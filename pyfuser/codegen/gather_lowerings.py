"""Triton lowering of index_select: an indexed load, attached to the registry by name.

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
"""

from __future__ import annotations

import torch

from ..ops.registry import attach
from .memory_views import Access, MemoryReadLowering, View, complex_refusal, require_gpu_tensor, view_strides


class IndexRangeCheck:
    """One index_select's run-time check: its messages for a set flag (``runtime/device_errors.py``)."""

    def __init__(self, op: str, index_name: str, source_name: str, dim: int, extent: int):
        self.op, self.index_name, self.source_name, self.dim, self.extent = op, index_name, source_name, dim, extent

    def messages(self, bits: int) -> list[str]:
        return [f"fd.ops.{self.op}: index {self.index_name} holds a value outside [0, {self.extent}), the extent of "
                f"dim {self.dim} of {self.source_name} (negative indices are out of range too, as in ATen's "
                f"index_select)"]


def _index_select_refusal(node):
    if node.inputs[1].ndim != 1:
        return "fd.ops.index_select with a 0-D index runs on ATen"
    return complex_refusal(node)


def _index_select_operands(node):
    return [node.args[0]]


def _index_select_loop_map(node):
    return [((node.outputs[0], node.kwargs["dim"]), (node.inputs[1], 0))]


def _plan_index_select(node, metas, relocated=None):
    src, out, dim = node.args[0], node.outputs[0], node.kwargs["dim"]
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    strides, sizes = list(view_strides(meta)), [int(n) for n in meta.sizes]
    gathered = int(meta.strides[dim])
    strides[dim], sizes[dim] = 0, 1  # the coordinate along ``dim`` comes from the index, not the loop
    check = IndexRangeCheck("index_select", node.inputs[1].name, src.name, dim, int(meta.sizes[dim]))
    return Access([View(src, out, tuple(sizes), tuple(strides), gathers=(gathered,))], [], {"check": check})


def _emit_index_select(node, kb, access, arg, index, dim):
    check = access.info["check"]
    i64 = torch.int64
    idx = kb.cast(index, i64)
    bad = kb.op("({0} < 0) | ({0} >= {1})", [idx, kb.fixed_int(check.extent)], torch.bool)
    flag = kb.error_flag(bad, check)
    safe = kb.op("tl.where({0}, 0, {1})", [bad, idx, flag], i64)  # (the flag is set before the load)
    return kb.load(access.views[0].param, indices=(safe,))


attach("index_select", lower=MemoryReadLowering(_index_select_operands, _plan_index_select, _emit_index_select,
                                                _index_select_refusal, _index_select_loop_map))
