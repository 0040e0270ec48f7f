"""Layouts of segment-boundary tensors, and the contiguity/allocation reset from inferred strides.

meta_inference.md, "Resetting TV contiguity and allocation from the inferred strides":
1. use the logical dims without reductions (their count equals tensor.dim()); reduction dims get contiguity
   None and keep their place;
2. allocation order: stable-sort the dims with nonzero stride by decreasing stride, stride-0 dims keep their
   logical position (identity order is stored as None);
3. contiguity, innermost to outermost with expected = 1: broadcast/expanded dims get None (expected unchanged);
   a non-broadcast dim of size <= 1 gets True (expected unchanged); any other dim gets stride == expected,
   then expected = stride * size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..ir.tensor_layout import allocation_order_from_strides
from ..ir.nodes import TensorView


@dataclass(frozen=True)
class TensorLayout:
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    alloc_order: Optional[tuple[int, ...]]  # over the TV's full logical domain (reductions included)
    contiguity: tuple[Optional[bool], ...]  # one entry per allocation position

    def __repr__(self) -> str:
        order = "" if self.alloc_order is None else f", alloc_order={list(self.alloc_order)}"
        return (
            f"TensorLayout(sizes={list(self.sizes)}, strides={list(self.strides)}, "
            f"contiguity={list(self.contiguity)}{order})"
        )


def layout_from_strides(tv: TensorView, sizes, strides) -> TensorLayout:
    """The layout a kernel must assume for ``tv`` when its tensor has these sizes and strides."""
    sizes, strides = tuple(int(s) for s in sizes), tuple(int(s) for s in strides)
    full = tv.logical_domain
    logical_pos = [i for i, d in enumerate(full) if not d.is_reduction]
    if len(logical_pos) != len(sizes):
        raise ValueError(f"{tv.name} has {len(logical_pos)} logical dims but the tensor has rank {len(sizes)}")
    tensor_order = allocation_order_from_strides(sizes, strides)
    # Reductions keep their slot; the remaining slots take the tensor's allocation order.
    it = iter(logical_pos[t] for t in tensor_order)
    order = [i if full[i].is_reduction else next(it) for i in range(len(full))]
    tensor_dim = {p: t for t, p in enumerate(logical_pos)}

    contiguity: list[Optional[bool]] = [None] * len(full)
    expected = 1
    for pos in range(len(order) - 1, -1, -1):
        i = order[pos]
        dom = full[i]
        if dom.is_reduction or dom.is_broadcast:
            continue
        t = tensor_dim[i]
        if sizes[t] <= 1:
            contiguity[pos] = True
            continue
        contiguity[pos] = strides[t] == expected
        expected = strides[t] * sizes[t]
    alloc = None if order == list(range(len(full))) else tuple(order)
    return TensorLayout(sizes, strides, alloc, tuple(contiguity))


def layout_of(tv: TensorView, t: torch.Tensor) -> TensorLayout:
    return layout_from_strides(tv, t.shape, t.stride())


def contiguous_strides(tv: TensorView, sizes) -> tuple[int, ...]:
    """The old assumption for segment outputs: contiguous in the TV's allocation order, stride 0 for expanded
    broadcast dims."""
    full = tv.logical_domain
    logical_pos = [i for i, d in enumerate(full) if not d.is_reduction]
    tensor_dim = {p: t for t, p in enumerate(logical_pos)}
    order = tv.alloc_order or tuple(range(len(full)))
    strides = [0] * len(sizes)
    running = 1
    for i in reversed(order):
        if full[i].is_reduction:
            continue
        t = tensor_dim[i]
        if full[i].is_broadcast and full[i].expanded and sizes[t] != 1:
            strides[t] = 0
            continue
        strides[t] = running
        running *= max(int(sizes[t]), 1)
    return tuple(strides)
