"""Packed FP4 (frontend.md "Packed FP4").

A ``Float4_e2m1fn`` TensorView has logical (unpacked) extents. At run time its values live in
``torch.float4_e2m1fn_x2`` storage, two per byte (element 2j in the low nibble), packed along the tensor's
fastest allocation dim, whose torch size is therefore half the logical extent; the torch strides of the other
dims count bytes, i.e. pairs of values. Everything that relates a runtime tensor to a TV's extents goes
through these helpers.
"""

from __future__ import annotations

from typing import Sequence

from .dtypes import DataType


def is_packed_fp4(tv) -> bool:
    return getattr(tv, "dtype", None) is DataType.Float4_e2m1fn


def packed_dim(tv) -> int:
    """The logical dim (reductions excluded) that is packed: the innermost allocation dim."""
    if tv.alloc_order is None:
        return tv.ndim - 1
    kept = [p for p in tv.alloc_order if not tv.logical_domain[p].is_reduction]
    logical_pos = [p for p in range(len(tv.logical_domain)) if not tv.logical_domain[p].is_reduction]
    return logical_pos.index(kept[-1])


def unpacked(tv, sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Sizes and strides of a packed runtime tensor, in FP4 elements."""
    sizes, strides = list(sizes), list(strides)
    if not is_packed_fp4(tv) or not sizes:
        return sizes, strides
    d = packed_dim(tv)
    sizes = [s * 2 if i == d else s for i, s in enumerate(sizes)]
    strides = [st if i == d else st * 2 for i, st in enumerate(strides)]
    return sizes, strides


def packed_shape(shape: Sequence[int], dim: int) -> list[int]:
    """The torch shape holding logical ``shape`` packed along ``dim`` (the extent there must be even)."""
    shape = list(shape)
    if shape and shape[dim] % 2:
        raise ValueError(f"a Float4_e2m1fn tensor needs an even extent along its packed dim {dim}, got {shape}")
    if shape:
        shape[dim] //= 2
    return shape
