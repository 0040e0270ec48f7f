"""Memory reads: ops whose output element at some coordinates is an input element at other coordinates.

slice, pad, cat (and the indexing ops built on the same pieces) cannot be computed from a value the kernel holds
at its own coordinates; they read their input straight from global memory instead. Each such read is a
:class:`View`: the element at output coordinates ``c`` lives at ``base + sum(c[d] * strides[d])`` of the source
tensor (plus ``index * stride`` per gathered dim), possibly under a mask the lowering builds from coordinates:

- slice: the source's strides, ``base`` = the offset of the first element kept;
- pad: the source's strides, ``base`` shifted back by the left widths, loads masked to the source's extent and
  the pad value where the mask is off;
- cat: one view per input, each shifted back by its offset along the cat dim and masked to its own range; the
  result selects among them by the coordinate.

The planner (plan.py) turns every view into a kernel tensor argument indexed like any other tensor (so views
take part in merging contiguous dims and in the one-alignment-constant-per-coordinate rule), and gives each dim
whose coordinate a lowering reads a loop dim of its own (never merged). A memory-read operand must come from
outside the segment (segment/loop_domain.py enforces it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..ir.dtypes import is_complex
from ..ir.nodes import Scalar, TensorView, Vector
from ..segment.loop_domain import CHAIN_VIEWS, NotFusable


@dataclass
class View:
    """``source`` read at the coordinates of ``target``'s dims (the op's output)."""

    source: TensorView
    target: TensorView
    sizes: tuple  # extent per target dim
    strides: tuple  # element stride into ``source`` per target dim (0: constant along it)
    base: int = 0  # element offset of target coordinate 0 (may be negative: pad, cat; masked lanes only)
    gathers: tuple = ()  # element strides multiplied by index values the lowering gives the load
    param: object = None  # the kernel's TensorParam, filled by the planner


@dataclass
class Access:
    views: list
    coords: list = field(default_factory=list)  # (tv, dim) whose coordinate the lowering reads
    info: dict = field(default_factory=dict)  # whatever the lowering computed while planning


class MemoryReadLowering:
    """A lowering (``OpDef.lower``) of a memory-read op, in three parts:
    ``memory_operands(node)``: the tensors read from memory; ``plan_access(node, metas)``: their views for the
    actual layouts (metas: id(tv) -> TensorMeta); ``emit(node, kb, access, *args, **kwargs)``: the kernel IR.
    ``refusal(node)``: why a call cannot be lowered at all (None if it can); ``loop_map``: output dims that
    are loop dims of non-memory operands (index tensors)."""

    def __init__(self, memory_operands: Callable, plan_access: Callable, emit: Callable,
                 refusal: Optional[Callable] = None, loop_map: Optional[Callable] = None):
        self.memory_operands = memory_operands
        self.plan_access = plan_access
        self.emit = emit
        self.refusal = refusal or (lambda node: None)
        self.loop_map = loop_map

    def __call__(self, node, kb, *args, **kwargs):
        return self.emit(node, kb, kb.access[id(node)], *args, **kwargs)


def first_operand(node) -> list:
    """``memory_operands`` of ops that read their first argument (slice, pad, select, reshape)."""
    return [node.args[0]]


def no_operands(node) -> list:
    return []


def complex_refusal(node) -> Optional[str]:
    """Complex values have no Triton form."""
    if is_complex(node.outputs[0].dtype):
        return f"fd.ops.{node.op.name} on complex values has no Triton lowering"
    return None


def static_int(x) -> Optional[int]:
    """The value of an int argument known when the fusion is defined (a literal or constant Scalar), else None."""
    if isinstance(x, Scalar):
        return int(x.value) if x.is_constant else None
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    return None


def view_strides(meta) -> tuple:
    """The source's strides, 0 along size-1 dims (there only coordinate 0 is ever read)."""
    return tuple(0 if n == 1 else int(s) for n, s in zip(meta.sizes, meta.strides))


def require_gpu_tensor(node, tv) -> None:
    if tv.is_cpu:
        raise NotFusable(f"fd.ops.{node.op.name} reads the CPU scalar tensor {tv.name}")


def bounds_mask(kb, coord, lo, hi):
    """``lo <= coord < hi`` (lo, hi: launch-time ints)."""
    lo_v, hi_v = kb.fixed_int(lo), kb.fixed_int(hi)
    return kb.op("({0} >= {1}) & ({0} < {2})", [coord, lo_v, hi_v], torch.bool)


def and_masks(kb, masks: list):
    out = masks[0]
    for m in masks[1:]:
        out = kb.op("{0} & {1}", [out, m], torch.bool)
    return out


def _right_aligned(own: list, rank: int) -> list:
    """An operand's strides over the last ``len(own)`` of ``rank`` output dims (it broadcasts along the others)."""
    return [0] * (rank - len(own)) + list(own)


class Relocation:
    """An operand made in the kernel (``value``), recomputed by its reader at the reader's output coordinates
    shifted by constants: the exprs computing it (elementwise ops over outside tensors and over slices/selects of
    them, segment/loop_domain.py) are lowered again with every outside tensor read through a view shifted
    accordingly. Tensors of lower rank align to the output's last dims, as elementwise ops do. ``shape`` is the
    operand's actual shape; ``place`` then fixes the shift and the reader's output extents."""

    def __init__(self, value, closure: list, target, metas: dict):
        self.value, self.closure, self.target = value, closure, target
        made = {id(o) for e in closure for o in e.outputs}
        self.views: dict = {}  # id(outside tensor, or view expr) -> View
        self._own: dict = {}  # same keys -> (strides of its own dims, base before the shift, source)
        shapes: dict = {}
        chained: dict = {}  # id(view output) -> (source, sizes, strides, offset)
        for e in closure:
            if e.op.name in CHAIN_VIEWS:
                src = e.args[0]
                if id(src) in chained:
                    root, sizes, strides, offset = chained[id(src)]
                else:
                    require_gpu_tensor(e, src)
                    root, m = src, metas[id(src)]
                    sizes, strides, offset = tuple(m.sizes), tuple(m.strides), 0
                out = _view_on_meta(e, sizes, strides, offset)
                chained[id(e.outputs[0])] = (root, tuple(out.shape), tuple(out.stride()), out.storage_offset())
                self._own[id(e)] = (view_strides(_Layout(out.shape, out.stride())), out.storage_offset(), root)
                shapes[id(e.outputs[0])] = tuple(out.shape)
                continue
            for t in e.inputs:
                if not isinstance(t, TensorView) or id(t) in made or id(t) in self._own or t.is_cpu:
                    continue  # (a 0-dim CPU scalar is passed by value: the same at every coordinate)
                meta = metas[id(t)]
                self._own[id(t)] = (view_strides(meta), 0, t)
                shapes[id(t)] = tuple(int(n) for n in meta.sizes)
            shapes[id(e.outputs[0])] = _broadcast_shapes([shapes.get(id(t), ()) for t in e.inputs
                                                          if isinstance(t, TensorView)])
        self.shape = shapes[id(value)]
        # Only the views the elementwise ops (or the reader itself) read become kernel arguments.
        read = {id(t) for e in closure if e.op.name not in CHAIN_VIEWS for t in e.inputs} | {id(value)}
        for e in closure:
            if e.op.name in CHAIN_VIEWS and id(e.outputs[0]) not in read:
                del self._own[id(e)]

    def place(self, shift: list, target_sizes) -> list:
        """Views reading at output coordinate c the operand's element at c + shift; returns them."""
        rank = self.target.ndim
        for key, (own, base, source) in self._own.items():
            strides = _right_aligned(own, rank)
            base += sum(sh * st for sh, st in zip(shift, strides))
            self.views[key] = View(source, self.target, tuple(target_sizes), tuple(strides), base)
        return list(self.views.values())

    def place_gathered(self, dim: int, target_sizes) -> list:
        """Views reading at output coordinate c the operand's element at c with c[dim] replaced by a position
        given to ``emit`` (scatter's search: codegen/scatter_lowerings.py); returns them. A tensor constant along
        ``dim`` (broadcast, or of lower rank) gathers nothing."""
        rank = self.target.ndim
        for key, (own, base, source) in self._own.items():
            strides = _right_aligned(own, rank)
            gathered, strides[dim] = strides[dim], 0
            self.views[key] = View(source, self.target, tuple(target_sizes), tuple(strides), base,
                                   gathers=(gathered,) if gathered else ())
        return list(self.views.values())

    def emit(self, kb, mask=None, position=None):
        """The value at the reader's coordinates; ``mask`` limits every load (lanes the reader discards);
        ``position``: the gathered coordinate of views placed by ``place_gathered``."""
        local: dict = {}

        def load(view):
            return kb.load(view.param, mask=mask, indices=(position,) if view.gathers else ())

        for e in self.closure:
            if e.op.name in CHAIN_VIEWS:  # read through its composed view (intermediate views are never read)
                if id(e) in self.views:
                    local[id(e.outputs[0])] = load(self.views[id(e)])
                continue
            for t in e.inputs:
                if isinstance(t, TensorView) and id(t) in self.views and id(t) not in local:
                    local[id(t)] = load(self.views[id(t)])
            args = kb.resolve(e.args, local)
            kwargs = {k: kb.resolve(v, local) for k, v in e.kwargs.items()}
            local[id(e.outputs[0])] = e.op.lower(e, kb, *args, **kwargs)
        return local[id(self.value)]


class _Layout:
    def __init__(self, sizes, strides):
        self.sizes, self.strides = tuple(sizes), tuple(strides)


def _view_on_meta(node, sizes, strides, offset):
    """The view op ``node`` applied by its ATen evaluator to a meta tensor of this layout: the composed view's
    sizes, strides and storage offset. Arguments must be known when the fusion is defined, and the result must
    be a view (a reshape may need a copy)."""
    from ..segment.loop_domain import CHAIN_VIEWS, NotFusable

    def value(x):
        if isinstance(x, Scalar):
            if not x.is_constant:
                raise NotFusable(f"fd.ops.{node.op.name} with arguments known only at run time")
            return x.value
        if isinstance(x, Vector):
            return [value(el) for el in x.elements]
        if isinstance(x, (list, tuple)):
            return type(x)(value(el) for el in x)
        return x

    extent = offset + sum((n - 1) * st for n, st in zip(sizes, strides) if n > 0) + 1
    base = torch.empty(max(extent, 1), device="meta").as_strided(sizes, strides, offset)
    out = node.op.evaluate(node, base, *[value(a) for a in node.args[1:]],
                           **{k: value(v) for k, v in node.kwargs.items()})
    if out is not base and not out._is_view():
        raise NotFusable(f"fd.ops.{node.op.name} of {node.args[0].name} needs a copy on this layout")
    return out


def _broadcast_shapes(shapes: list) -> tuple:
    """Elementwise broadcasting (right-aligned, extent 1 stretches)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for j, n in enumerate(s):
            d = rank - len(s) + j
            out[d] = n if out[d] == 1 else out[d]
    return tuple(out)
