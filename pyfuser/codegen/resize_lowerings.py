"""Triton lowerings of slice, pad and cat: reads of a segment input at shifted coordinates (memory_views.py).

- slice: the input's strides from the first element kept; bounds are normalized against the actual extents
  exactly as the ATen evaluator does, so a bound out of range clamps the same way;
- pad: the input shifted by the left widths (negative widths crop), loaded only inside the input's extent, the
  pad value (cast to the tensor's dtype, as ``F.pad`` does) elsewhere;
- cat: each input shifted to its offset along the cat dim and loaded only there; the coordinate selects which.
  An input computed in the kernel by elementwise ops (over outside tensors and slices of them) is recomputed
  there from shifted reads instead (memory_views.Relocation), as a slice of such a value is: RoPE's
  ``cat([-x2, x1])`` of halves of ``x`` is part of one kernel.
  An input one element wide along the cat dim (a size-1 broadcast: a column of counts, a ``full``) is the same
  at every cat coordinate, so it may be computed in the same kernel instead of read from memory.

Only bounds and widths known when the fusion is defined are lowered; others (symbolic scalars) run on ATen.
"""

from __future__ import annotations

import torch

from ..ops.registry import attach
from ..ops.shape import _normalize_end, _normalize_start
from ..segment.loop_domain import NotFusable
from .lowering import _operand, out_dtype
from .memory_views import (
    Access,
    MemoryReadLowering,
    Relocation,
    View,
    and_masks,
    bounds_mask,
    complex_refusal,
    first_operand,
    require_gpu_tensor,
    static_int,
    view_strides,
)


# --- slice -------------------------------------------------------------------------------------------------


def _slice_refusal(node):
    bounds = list(node.kwargs["start_indices"]) + list(node.kwargs["end_indices"])
    if any(static_int(b) is None for b in bounds):
        return "fd.ops.slice with bounds known only at run time runs on ATen"
    return complex_refusal(node)


def _slice_bounds(node, sizes) -> list[tuple[int, int]]:
    """(start, end) per dim, normalized as the ATen evaluator normalizes them."""
    out = []
    for d, (s, e) in enumerate(zip(node.kwargs["start_indices"], node.kwargs["end_indices"])):
        s, e, n = static_int(s), static_int(e), int(sizes[d])
        if node.kwargs.get("manual_normalization", False):
            if not 0 <= s <= e <= n:  # ATen raises the op's own error for it
                raise NotFusable(f"fd.ops.slice bounds ({s}, {e}) outside dim {d} of extent {n}")
        else:
            s = _normalize_start(s, n)
            e = _normalize_end(e, n, s)
        out.append((s, e))
    return out


def _plan_slice(node, metas, relocated=None):
    src, out = node.args[0], node.outputs[0]
    if relocated and id(src) in relocated:  # computed in the kernel: recomputed from the first element kept
        reloc = Relocation(src, relocated[id(src)], out, metas)
        bounds = _slice_bounds(node, reloc.shape)
        sizes = tuple(e - s for s, e in bounds)
        return Access(reloc.place([s for s, _ in bounds], sizes), info={"relocation": reloc})
    require_gpu_tensor(node, src)
    meta = metas[id(src)]
    bounds = _slice_bounds(node, meta.sizes)
    strides = view_strides(meta)
    base = sum(s * st for (s, _), st in zip(bounds, meta.strides))
    sizes = tuple(e - s for s, e in bounds)
    return Access([View(src, out, sizes, strides, base)])


def _emit_slice(node, kb, access, *args, **kwargs):
    if "relocation" in access.info:
        return access.info["relocation"].emit(kb)
    return kb.load(access.views[0].param)


# --- pad ---------------------------------------------------------------------------------------------------


def _pad_widths(node) -> list:
    return [static_int(w) for w in node.args[1]]


def _pad_refusal(node):
    if any(w is None for w in _pad_widths(node)):
        return "fd.ops.pad with widths known only at run time runs on ATen"
    return complex_refusal(node)


def _padded_dims(node, ndim: int) -> dict:
    """dim -> (left, right) for every dim the widths touch (pairs run from the last dim)."""
    widths = _pad_widths(node)
    dims = {}
    for k in range(len(widths) // 2):
        lo, hi = widths[2 * k], widths[2 * k + 1]
        if lo or hi:
            dims[ndim - 1 - k] = (lo, hi)
    return dims


def _source(node, src, out, metas, relocated):
    """(Relocation or None, sizes) of an operand read by pad or cat: a value computed in the kernel is recomputed
    at the shifted coordinates; anything else is read from memory (a GPU tensor)."""
    if relocated and id(src) in relocated:
        reloc = Relocation(src, relocated[id(src)], out, metas)
        return reloc, reloc.shape
    require_gpu_tensor(node, src)
    return None, tuple(int(n) for n in metas[id(src)].sizes)


def _plan_pad(node, metas, relocated=None):
    src, out = node.args[0], node.outputs[0]
    padded = _padded_dims(node, src.ndim)
    reloc, in_sizes = _source(node, src, out, metas, relocated)
    sizes = list(in_sizes)
    for d, (lo, hi) in padded.items():
        sizes[d] = in_sizes[d] + lo + hi
    info = {"bounds": {d: (lo, lo + in_sizes[d]) for d, (lo, _) in padded.items()}}
    coords = [(out, d) for d in padded]
    if reloc is not None:
        info["relocation"] = reloc
        shift = [-padded[d][0] if d in padded else 0 for d in range(out.ndim)]
        return Access(reloc.place(shift, sizes), coords, info)
    strides = view_strides(metas[id(src)])
    base = -sum(lo * strides[d] for d, (lo, _) in padded.items())
    return Access([View(src, out, tuple(sizes), strides, base)], coords, info)


def _emit_pad(node, kb, access, arg, pad_widths, value=None):
    out = node.outputs[0]
    dtype = out_dtype(node)
    fill = _operand(kb, value if value is not None else (False if dtype == torch.bool else 0), dtype)
    fill = kb.cast(fill, dtype)
    reloc = access.info.get("relocation")

    def read(mask=None):
        return reloc.emit(kb, mask=mask) if reloc is not None else kb.load(access.views[0].param, mask=mask)

    masks = [bounds_mask(kb, kb.coordinate_of(out, d), lo, hi) for d, (lo, hi) in access.info["bounds"].items()]
    if not masks:  # widths of zero only: a copy
        return read()
    inside = and_masks(kb, masks)
    return kb.op("tl.where({0}, {1}, {2})", [inside, kb.cast(read(inside), dtype), fill], dtype)


# --- cat ---------------------------------------------------------------------------------------------------


def _constant_along(tv, dim: int) -> bool:
    """Whether ``tv`` is one element wide along ``dim`` (a size-1 broadcast dim): its value at any cat
    coordinate is its value at its own coordinates, so the kernel may compute it instead of reading it."""
    d = tv.logical[dim]
    return d.is_broadcast and not d.expanded


def _cat_operands(node):
    dim = node.kwargs["dim"]
    return [t for t in node.args[0] if not _constant_along(t, dim)]


def _plan_cat(node, metas, relocated=None):
    """Views for the inputs read from memory (or recomputed: Relocation); every input's [lo, hi) range along the
    cat dim."""
    out, dim = node.outputs[0], node.kwargs["dim"]
    views, parts, offset, out_sizes = [], [], 0, None
    relocations = []
    for src in node.args[0]:
        if _constant_along(src, dim):
            parts.append((None, offset, offset + 1))
            offset += 1
            continue
        reloc, sizes = _source(node, src, out, metas, relocated)
        n = int(sizes[dim])
        if out_sizes is None:
            out_sizes = list(sizes)
        if n == 0:  # contributes nothing (and an empty tensor cannot be read)
            continue
        if reloc is not None:
            shift = [0] * out.ndim
            shift[dim] = -offset
            relocations.append((reloc, shift))
            parts.append((reloc, offset, offset + n))
        else:
            strides = view_strides(metas[id(src)])
            views.append(View(src, out, (), strides, -offset * strides[dim]))
            parts.append((views[-1], offset, offset + n))
        offset += n
    if out_sizes is not None:  # (else every input is computed here: nothing to read)
        out_sizes[dim] = offset
        for v in views:
            v.sizes = tuple(out_sizes)
        for reloc, shift in relocations:
            views += reloc.place(shift, out_sizes)
    return Access(views, [(out, dim)], {"parts": parts})


def _emit_cat(node, kb, access, tensors, dim=0, manual_padding=False):
    out = node.outputs[0]
    coord = kb.coordinate_of(out, node.kwargs["dim"])
    dim = node.kwargs["dim"]
    # The inputs constant along the cat dim, computed in this kernel (by position: an input read through a view
    # may also have a value here, when another op reads it at the kernel's own coordinates).
    computed = iter(t for t, tv in zip(tensors, node.args[0]) if _constant_along(tv, dim))
    parts = []
    for view, lo, hi in access.info["parts"]:
        inside = bounds_mask(kb, coord, lo, hi)
        if view is None:
            value = next(computed)
        elif isinstance(view, Relocation):
            value = view.emit(kb, mask=inside)
        else:
            value = kb.load(view.param, mask=inside)
        parts.append((inside, value))
    result = parts[-1][1]
    for inside, value in reversed(parts[:-1]):
        result = kb.op("tl.where({0}, {1}, {2})", [inside, value, result], out_dtype(node))
    return result


attach("slice", lower=MemoryReadLowering(first_operand, _plan_slice, _emit_slice, _slice_refusal))
attach("pad", lower=MemoryReadLowering(first_operand, _plan_pad, _emit_pad, _pad_refusal))
attach("cat", lower=MemoryReadLowering(_cat_operands, _plan_cat, _emit_cat, complex_refusal))
