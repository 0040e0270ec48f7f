"""Shape ops: size, broadcast, broadcast_in_dim, expand, reshape, permute, squeeze, slice, pad, cat, stride_order."""

from __future__ import annotations

from ..ir.dtypes import DataType
from .common import fail, fusion_of, new_scalar, normalize_dim, require_tensor
from .registry import OpKind, OpResult, register


def _size_eval(node, arg, dim):
    return int(arg.shape[dim])


@register("size", OpKind.HOST, _size_eval)
def size(arg, dim: int):
    """fd.ops.size(arg, dim): the extent of ``dim`` as an Int scalar."""
    tv = require_tensor("size", arg, "arg")
    d = normalize_dim("size", dim, tv.ndim)
    return OpResult([new_scalar(fusion_of("size", tv), DataType.Int)], (tv,), {"dim": d})


del fail
