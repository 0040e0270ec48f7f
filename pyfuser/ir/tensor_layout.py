"""Layout descriptors: nvFuser's (contiguity, stride_order) from sizes/strides, and stride_order handling.

IR-level facts about allocation orders, used by the frontend (define_tensor), the ops (stride_order, matmul
layouts), codegen and the runtime alike."""

from __future__ import annotations

import numbers
from typing import Optional, Sequence


def compute_tensor_descriptor(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[Optional[bool]], list[int]]:
    """(contiguity in allocation order, stride_order) for a tensor with these sizes and strides.

    Stride-0 dims keep their logical position in the allocation order; the other dims are stable-sorted by
    decreasing stride. Size-1 and stride-0 dims are broadcasts (contiguity None). A dim is contiguous iff its
    stride equals stride*size of the next inner non-broadcast dim, or 1 if there is none.
    """
    sizes, strides = list(sizes), list(strides)
    if len(sizes) != len(strides):
        raise ValueError(f"compute_tensor_descriptor: {len(sizes)} sizes but {len(strides)} strides")
    for i, st in enumerate(strides):
        if st < 0:
            raise ValueError(f"compute_tensor_descriptor: negative stride is not supported: strides[{i}]={st}")
    rank = len(sizes)
    alloc = allocation_order_from_strides(sizes, strides)
    contiguity: list[Optional[bool]] = [None] * rank
    expected = 1
    for pos in range(rank - 1, -1, -1):
        d = alloc[pos]
        if strides[d] == 0 or sizes[d] == 1:
            continue
        contiguity[pos] = strides[d] == expected
        expected = strides[d] * sizes[d]
    stride_order = [0] * rank
    for pos, d in enumerate(alloc):
        stride_order[d] = rank - 1 - pos
    return contiguity, stride_order


def allocation_order_from_strides(sizes: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Logical dims from outermost to innermost: stride-0 dims keep their index, the rest sorted by stride."""
    rank = len(sizes)
    movable = [d for d in range(rank) if strides[d] != 0]
    ordered = iter(sorted(movable, key=lambda d: -strides[d]))  # sorted() is stable
    return [d if strides[d] == 0 else next(ordered) for d in range(rank)]


def alloc_order_from_stride_order(
    stride_order: Sequence[int], rank: int, what: str = "stride_order"
) -> Optional[list[int]]:
    """Allocation order (outermost first) from nvFuser's stride_order; None means row-major.

    ``stride_order[i]`` is the rank of dim i's stride (0 = fastest), so dim i sits at allocation position
    ``rank-1-stride_order[i]``. Negative entries wrap; duplicates and out-of-range entries are errors.
    """
    from ..errors import FusionDefinitionError  # noqa: E402 (errors sit below every layer)

    order = list(stride_order)
    if not order:
        return None
    if len(order) != rank:
        raise FusionDefinitionError(f"{what} has {len(order)} entries but the tensor has rank {rank}")
    norm = []
    for i, s in enumerate(order):
        if not isinstance(s, numbers.Integral) or isinstance(s, bool) or not -rank <= s < rank:
            raise FusionDefinitionError(f"{what}[{i}]={s!r} is out of range for rank {rank}")
        norm.append(int(s) % rank)
    if len(set(norm)) != rank:
        raise FusionDefinitionError(f"{what}={order} has duplicate entries")
    alloc = [0] * rank
    for dim, s in enumerate(norm):
        alloc[rank - 1 - s] = dim
    return None if alloc == list(range(rank)) else alloc
