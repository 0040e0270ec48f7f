"""Triton lowering of scatter: a search, attached to the registry by name.

``scatter(arg, index, src, dim)`` (out-of-place torch.scatter) writes ``src[..j..]`` to ``out[..index[..j..]..]``
along ``dim``. Stored that way, a kernel would write at addresses it computes: a kernel of its own, after a copy
of ``arg``, whose readers could not fuse. Instead every output element is computed at its own coordinates ``c``
by a *search*: it is ``src`` at the last position ``j`` in ``[0, m)`` (``m = index.size(dim)``) whose
``index[c with c[dim] = j]`` equals ``c[dim]`` -- only where ``c`` lies inside the index's extents along the other
dims -- else ``arg`` at ``c``. With repeated indices that is the last write in index order, which is what ATen's
CPU scatter keeps (it writes in that order; torch documents the result as undefined and CUDA leaves it
unspecified). The search costs O(m) loads and compares per output element, O(n·m) per row of n along ``dim``,
and no registers beyond the tile, so it is limited to ``m <= MAX_EXTENT``: a larger index runs on ATen (known
when the fusion is defined: the scatter alone; else found when planning: the whole segment, with the reason).

- ``arg`` is an ordinary operand (each output dim is the same loop dim as arg's), so its producers and the
  readers of the output are one kernel with the scatter.
- ``index`` and ``src`` are read from global memory through views (codegen/memory_views.py) whose ``dim``
  coordinate is *gathered*: the load at position ``j`` adds ``j * stride``. Loads are masked to the index's
  extents (it may be smaller than arg along the other dims; src may be larger than the index anywhere). An index
  or src computed in the same kernel by elementwise ops over outside tensors (and views of them) is recomputed at
  the search position from gathered reads of those tensors (memory_views.Relocation.place_gathered): the index
  once per position searched, src once at the position found. Anything else on their way (a reduction, an
  argsort, another scatter) splits the kernel there and the value goes through memory (segment/loop_domain.py).
- A scalar ``src`` known when the fusion is defined (or folded from constants) becomes the value ATen's own
  conversion gives (``torch.scatter`` into one element: ints truncate, any non-zero is True), written by its bits
  (NaN payloads, -0.0). A value ATen cannot convert (1e10 into Int32) runs on ATen, which raises. A scalar known only
  at run time is taken for Int/Bool scalars into Int, Float, Double and Bool tensors (conversions that never
  overflow and round once); others run on ATen (Double scalars would reach the kernel as fp32).

Out-of-range indices (negative ones too: ATen's CPU scatter raises for both) are never a silent wrong result and
never a host synchronization: no address depends on an index value here (an out-of-range index simply matches
nothing), and the kernel sets its slot of the call's device error flags (as index_select and gather do,
runtime/device_errors.py): on CPU the call raises :class:`FusionExecutionError` naming the op, on CUDA the next
call of the fusion does.

Runs on ATen, with the reason: complex values, dtypes other than the float, int and Bool ones below, an ``arg``
that is also the index or src, shapes ATen refuses (the index larger than arg along another dim or than src
anywhere: ATen raises its own error), empty tensors, an output that stays in the kernel while arg is computed there
from extents known only at run time (symbolic sizes: the plan cannot size the loop).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ir.dtypes import DataType, to_torch_dtype
from ..ir.nodes import Scalar, TensorView, Vector
from ..ops.registry import attach
from ..segment.loop_domain import NotFusable
from .kernel_builder import TL_DTYPE, KValue
from .memory_views import (Access, MemoryReadLowering, Relocation, View, and_masks, complex_refusal,
                           require_gpu_tensor, view_strides)
from .plan import folded_constant

# Most positions searched per output element (index.size(dim)). H200 (benchmarks/results/2026-12-02-scatter.md):
# a search costs ~1.3 ps per output element and position, so at 128 positions a [16384, 128] scatter took 0.35 ms
# against eager's 0.06 ms, while at 8 it beat eager (0.021 vs 0.037 ms): past about 16 the split at an ATen
# scatter is cheaper than the search.
MAX_EXTENT = 16
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
# Run-time scalars taken: Int/Bool values into these dtypes convert without overflow and with one rounding.
_RUNTIME_SCALAR_DTYPES = (DataType.Int, DataType.Int32, DataType.Bool)
_RUNTIME_SCALAR_TARGETS = (torch.int64, torch.float32, torch.float64, torch.bool)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class ScatterIndexCheck:
    """One scatter's run-time check of its index values: its message for a set flag (runtime/device_errors.py)."""

    def __init__(self, index_name: str, arg_name: str, dim: int, extent: int):
        self.index_name, self.arg_name, self.dim, self.extent = index_name, arg_name, dim, extent

    def messages(self, bits: int) -> list[str]:
        return [f"fd.ops.scatter: index {self.index_name} holds a value outside [0, {self.extent}), the extent of "
                f"dim {self.dim} of {self.arg_name} (negative indices are out of range too, as in ATen's scatter)"]


# --------------------------------------------------------------------------------------------------------------
# what the kernel takes


def _static_size(tv: TensorView, d: int) -> Optional[int]:
    dom = tv.logical[d]
    return 1 if dom.is_broadcast and not dom.expanded else dom.extent


def _constant(src):
    """``src``'s value when it is known before the launch (a number, a constant Scalar or one folded from
    constants), else None."""
    return folded_constant(src) if isinstance(src, Scalar) else src


def _converted(value, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as ATen's scatter writes it into a ``dtype`` tensor: its own conversion, by running it (raises
    where ATen raises: a value that overflows the dtype)."""
    return torch.scatter(torch.zeros(1, dtype=dtype), 0, torch.zeros(1, dtype=torch.int64), value)


def _scalar_refusal(src, dtype: torch.dtype) -> Optional[str]:
    value = _constant(src)
    if value is not None:
        try:
            _converted(value, dtype)
        except (RuntimeError, TypeError) as e:  # (ATen raises it again when the segment runs)
            return f"fd.ops.scatter of {value!r} into {dtype} runs on ATen ({e})"
        return None
    if src.dtype not in _RUNTIME_SCALAR_DTYPES or dtype not in _RUNTIME_SCALAR_TARGETS:
        return (f"fd.ops.scatter of a {src.dtype!r} scalar known only at run time into {dtype} runs on ATen (its "
                "conversion may overflow, which ATen reports, or round differently in the kernel)")
    return None


def _scatter_refusal(node) -> Optional[str]:
    arg, index, src, dim = node.args[0], node.args[1], node.args[2], node.kwargs["dim"]
    why = complex_refusal(node)
    if why is not None:
        return why
    dtype = to_torch_dtype(arg.dtype)
    if dtype not in _DTYPES:
        return f"fd.ops.scatter on {dtype} runs on ATen"
    if index is arg or src is arg:
        # The kernel reads arg at its own coordinates and index/src through views: one tensor cannot be both.
        return "fd.ops.scatter whose index or src is its arg runs on ATen"
    m = _static_size(index, dim)
    if m is not None and m > MAX_EXTENT:
        return (f"fd.ops.scatter with an index of {m} along dim {dim} runs on ATen (generated kernels search at "
                f"most {MAX_EXTENT} positions per element)")
    return None if isinstance(src, TensorView) else _scalar_refusal(src, dtype)


def _memory_operands(node) -> list:
    index, src = node.args[1], node.args[2]
    return [index] + ([src] if isinstance(src, TensorView) else [])


def _loop_map(node):
    out, arg = node.outputs[0], node.args[0]
    return [((out, d), (arg, d)) for d in range(out.ndim)]


# --------------------------------------------------------------------------------------------------------------
# planning: the views and the coordinates the search reads


def _output_sizes(node, metas) -> list:
    """The output's extents for this signature (arg's): its own layout if it leaves the kernel, else arg's."""
    out, arg = node.outputs[0], node.args[0]
    if id(out) in metas:
        return [int(n) for n in metas[id(out)].sizes]
    return [int(n) for n in _on_meta(arg, metas, {}).shape]


def _on_meta(tv: TensorView, metas: dict, memo: dict) -> torch.Tensor:
    """A meta tensor of ``tv``'s layout for this signature: a boundary tensor's own, else what the ops computing
    it in the kernel give when run on meta tensors (as meta inference runs them). NotFusable where that needs a
    value known only at run time."""
    if id(tv) in memo:
        return memo[id(tv)]
    if id(tv) in metas:
        m = metas[id(tv)]
        memo[id(tv)] = torch.empty_strided(tuple(m.sizes), tuple(m.strides), dtype=m.dtype, device="meta")
        return memo[id(tv)]
    e = tv.defined_by
    why = f"fd.ops.scatter: the extents of {tv.name} are unknown when planning"

    def value(a):
        if isinstance(a, TensorView):
            return _on_meta(a, metas, memo)
        if isinstance(a, Scalar):
            v = folded_constant(a)
            if v is None:  # (a symbolic extent, computed on the host before the launch)
                raise NotFusable(f"{why} (they depend on {a.name}, known only at run time)")
            return v
        if isinstance(a, Vector):
            return [value(x) for x in a.elements]
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return a

    if e is None:
        raise NotFusable(why)
    args, kwargs = value(tuple(e.args)), {k: value(v) for k, v in e.kwargs.items()}
    try:
        result = e.op.run(e, args, kwargs, on_meta=True)
    except Exception as err:  # (whatever stops it, the segment runs on ATen, which reports real errors)
        raise NotFusable(f"{why} ({type(err).__name__}: {err})") from err
    memo[id(tv)] = result[e.outputs.index(tv)] if len(e.outputs) > 1 else result
    return memo[id(tv)]


def _operand_views(node, tv, metas, relocated, sizes, dim):
    """(views, Relocation or None, extents) of index or src: read from memory, or, when computed in the kernel
    by elementwise ops, recomputed at the search position from reads of what it is computed from."""
    out = node.outputs[0]
    view_sizes = list(sizes)
    view_sizes[dim] = 1
    if relocated and id(tv) in relocated:
        reloc = Relocation(tv, relocated[id(tv)], out, metas)
        return reloc.place_gathered(dim, view_sizes), reloc, list(reloc.shape)
    require_gpu_tensor(node, tv)
    meta = metas[id(tv)]
    strides = list(view_strides(meta))
    gathered = strides[dim]  # (0 if tv has one element along dim: position 0 is the only one searched)
    strides[dim] = 0
    view = View(tv, out, tuple(view_sizes), tuple(strides), gathers=(gathered,))
    return [view], None, [int(n) for n in meta.sizes]


def _plan_scatter(node, metas, relocated=None):
    arg, index, src, out, dim = node.args[0], node.args[1], node.args[2], node.outputs[0], node.kwargs["dim"]
    sizes = _output_sizes(node, metas)
    views, index_reloc, idx_sizes = _operand_views(node, index, metas, relocated, sizes, dim)
    if idx_sizes[dim] > MAX_EXTENT:
        raise NotFusable(f"fd.ops.scatter with an index of {idx_sizes[dim]} along dim {dim} (generated kernels "
                         f"search at most {MAX_EXTENT} positions per element)")
    for d, (i, a) in enumerate(zip(idx_sizes, sizes)):
        if d != dim and i > a:  # ATen raises its own error for it
            raise NotFusable(f"fd.ops.scatter: {index.name} is larger than {arg.name} in dim {d} ({i} > {a})")
    info = {"index": (views, index_reloc)}
    if isinstance(src, TensorView):
        src_views, src_reloc, src_sizes = _operand_views(node, src, metas, relocated, sizes, dim)
        for d, (i, s) in enumerate(zip(idx_sizes, src_sizes)):
            if i > s:
                raise NotFusable(f"fd.ops.scatter: {index.name} is larger than {src.name} in dim {d} ({i} > {s})")
        info["src"] = (src_views, src_reloc)
        views = views + src_views
    # Dims along which the index stops short of the output: the search runs only below the index's extent there.
    clipped = {d: idx_sizes[d] for d in range(out.ndim) if d != dim and idx_sizes[d] < sizes[d]}
    coords = [(out, d) for d in [dim, *clipped]]
    info.update(check=ScatterIndexCheck(index.name, arg.name, dim, sizes[dim]), positions=idx_sizes[dim],
                clipped=clipped)
    return Access(views, coords, info)


def _read(kb, operand, position, mask) -> KValue:
    """index or src at the output's coordinates with the scattered one replaced by ``position``."""
    views, reloc = operand
    if reloc is not None:
        return reloc.emit(kb, mask, position)
    return kb.load(views[0].param, mask=mask, indices=(position,))


# --------------------------------------------------------------------------------------------------------------
# the kernel IR


def _literal(kb, t: torch.Tensor) -> KValue:
    """The one element of ``t`` as a constant of its dtype; floats by their bits (NaN payloads, -0.0)."""
    dtype = t.dtype
    if dtype.is_floating_point:
        bits_dtype = _BITS[dtype.itemsize]
        bits = int(t.view(bits_dtype)[0])
        v = kb.op(f"tl.full([], {bits}, {TL_DTYPE[bits_dtype]}).to({TL_DTYPE[dtype]}, bitcast=True)", [], dtype)
        v.value = float(t[0])  # (KValue.value: a NaN constant's narrowing takes eager's bits, kernel_builder)
        return v
    return kb.op(f"tl.full([], {int(t[0])}, {TL_DTYPE[dtype]})", [], dtype)


def _scalar_value(kb, src, dtype: torch.dtype) -> KValue:
    if not isinstance(src, KValue):  # known now (a constant, or folded from constants)
        return _literal(kb, _converted(src, dtype))
    if dtype == torch.bool:  # (as ATen converts a number to Bool: any non-zero is True)
        return kb.op("({0} != 0)", [src], torch.bool)
    return kb.cast(src, dtype)


def _emit_scatter(node, kb, access, arg, index, src, dim):
    out = node.outputs[0]
    dtype = to_torch_dtype(out.dtype)
    info = access.info
    key = kb.cast(kb.coordinate_of(out, dim), torch.int64)
    masks = [kb.op("{0} < {1}", [kb.coordinate_of(out, d), kb.fixed_int(n)], torch.bool)
             for d, n in info["clipped"].items()]
    inside = and_masks(kb, masks) if masks else None
    j = kb.loop_var()
    position = kb.op("tl.full([], {0}, tl.int32)", [j], torch.int32)  # (a tensor: the load widens it to int64)
    idx = kb.cast(_read(kb, info["index"], position, inside), torch.int64)
    hit = kb.op("({0} == {1})", [idx, key], torch.bool)
    bad = kb.op("({0} < 0) | ({0} >= {1})", [idx, kb.fixed_int(info["check"].extent)], torch.bool)
    if inside is not None:  # (outside the index, loads read 0: a value computed from them may be anything)
        hit = kb.op("{0} & {1}", [hit, inside], torch.bool)
        bad = kb.op("{0} & {1}", [bad, inside], torch.bool)
    invariants = (key,) + ((inside,) if inside is not None else ())
    found = kb.search_last(j, kb.fixed_int(info["positions"]), hit, bad, invariants)
    flag = kb.error_flag(kb.op("({0} == -2)", [found], torch.bool), info["check"])
    took = kb.op("({0} >= 0)", [found], torch.bool)
    if isinstance(node.args[2], TensorView):  # (``src`` itself is only a placeholder then: it is read by view)
        safe = kb.op("tl.maximum({0}, 0)", [found], torch.int32)
        value = _read(kb, info["src"], safe, took)
    else:
        value = _scalar_value(kb, src, dtype)
    # (the flag is an operand, so it is set before the value exists)
    return kb.op("tl.where({0}, {1}, {2})", [took, value, kb.cast(arg, dtype), flag], dtype)


attach("scatter", lower=MemoryReadLowering(_memory_operands, _plan_scatter, _emit_scatter, _scatter_refusal,
                                           _loop_map))
