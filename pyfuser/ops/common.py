"""Helpers shared by op builders: operand typing, dim normalization, broadcasting of logical domains."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

from ..errors import FusionDefinitionError, FusionDtypeError
from ..ir.dtypes import DataType
from ..ir.fusion import Fusion, current_fusion
from ..ir.nodes import IterDomain, IterType, Scalar, TensorView, Val, Vector


def fail(op: str, msg: str, exc=FusionDefinitionError):
    raise exc(f"fd.ops.{op}: {msg}")


def round_up(x: int, m: int) -> int:
    """x rounded up to a multiple of m (padded extents of the block-scale layouts)."""
    return (x + m - 1) // m * m


def is_number(x: Any) -> bool:
    return isinstance(x, (numbers.Number, bool)) and not isinstance(x, Val)


def literal_dtype(x: Any) -> DataType:
    """Dtype of a bare Python value, as nvFuser's define_scalar infers it."""
    if isinstance(x, bool):
        return DataType.Bool
    if isinstance(x, numbers.Integral):
        return DataType.Int
    if isinstance(x, numbers.Real):
        return DataType.Double
    if isinstance(x, numbers.Complex):
        return DataType.ComplexDouble
    raise TypeError(f"not a scalar: {x!r}")


def operand_dtype(x: Any) -> DataType:
    return x.dtype if isinstance(x, Val) else literal_dtype(x)


def check_operand(op: str, x: Any, argname: str, allow_scalar: bool = True) -> Any:
    if isinstance(x, TensorView):
        return x
    if isinstance(x, (Scalar,)) or is_number(x):
        if not allow_scalar:
            fail(op, f"argument '{argname}' must be a tensor, got scalar {x!r}", FusionDtypeError)
        return x
    fail(op, f"argument '{argname}' must be a tensor or a scalar, got {type(x).__name__}", FusionDtypeError)


def require_tensor(op: str, x: Any, argname: str) -> TensorView:
    if not isinstance(x, TensorView):
        fail(op, f"argument '{argname}' must be a TensorView, got {type(x).__name__}", FusionDtypeError)
    return x


def fusion_of(op: str, *operands: Any) -> Fusion:
    """The fusion the operands live in (all must share one); the current fusion if none is a Val."""
    fusion: Optional[Fusion] = None
    for x in operands:
        vals = x if isinstance(x, (list, tuple)) else [x]
        for v in vals:
            if isinstance(v, Val):
                if fusion is None:
                    fusion = v.fusion
                elif v.fusion is not fusion:
                    fail(op, "operands belong to different fusions")
    if fusion is None:
        fusion = current_fusion()
    fusion._check_open()
    return fusion


def normalize_dim(op: str, dim: Any, ndim: int, argname: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        fail(op, f"argument '{argname}' must be an int, got {dim!r}", FusionDtypeError)
    # As in torch, a 0-dim tensor accepts dim 0 and -1.
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        fail(op, f"argument '{argname}'={dim} is out of range for a tensor of rank {ndim}")
    return int(dim) % ndim if ndim else 0


def normalize_dims(op: str, dims: Sequence[Any], ndim: int, argname: str = "dims") -> list[int]:
    if isinstance(dims, numbers.Integral):
        dims = [dims]
    out = [normalize_dim(op, d, ndim, argname) for d in dims]
    if len(set(out)) != len(out):
        fail(op, f"argument '{argname}'={list(dims)} repeats a dim")
    return out


def new_tensor(fusion: Fusion, domain: Sequence[IterDomain], dtype: DataType, **kw) -> TensorView:
    return TensorView(fusion, domain, dtype, **kw)


def new_scalar(fusion: Fusion, dtype: DataType) -> Scalar:
    return Scalar(fusion, dtype)


def merge_extent(op: str, a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None or a == b:
        return a
    fail(op, f"operand extents {a} and {b} do not match")


def broadcast_domain(op: str, tensors: Sequence[TensorView]) -> list[IterDomain]:
    """Pointwise output domain. Lower-rank operands are aligned to the right and padded with leading broadcast
    dims (nvFuser's maybeBroadcast, torch's rule). A dim is broadcast only if it is broadcast in every operand
    (expanded if any operand expands it)."""
    if not tensors:
        return []
    rank = max(t.ndim for t in tensors)
    logicals = [(IterDomain.broadcast(),) * (rank - t.ndim) + t.logical for t in tensors]
    out = []
    for dims in zip(*logicals):
        concrete = [d for d in dims if not d.is_broadcast]
        if concrete:
            ext = None
            for d in concrete:
                ext = merge_extent(op, ext, d.extent)
            for d in dims:
                if d.is_broadcast and d.expanded and d.extent is not None and ext is not None and d.extent != ext:
                    fail(op, f"expanded extent {d.extent} does not match {ext}")
            out.append(IterDomain(ext, IterType.Iteration))
        else:
            expanded = [d for d in dims if d.expanded]
            if expanded:
                ext = None
                for d in expanded:
                    ext = merge_extent(op, ext, d.extent)
                out.append(IterDomain(ext, IterType.Broadcast, True))
            else:
                out.append(IterDomain.broadcast())
    return out


def extent_of(x: Any) -> Optional[int]:
    """A static extent from an int or a constant Scalar; None when symbolic."""
    if isinstance(x, Scalar):
        return x.value if x.is_constant else None
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    return None


def check_shape_arg(op: str, shape: Any, argname: str = "shape") -> list:
    """A shape given as ints, Int Scalars or a Vector. Returns the list (entries int or Scalar)."""
    if isinstance(shape, Vector):
        return list(shape.elements)
    if not isinstance(shape, (list, tuple)):
        fail(op, f"argument '{argname}' must be a list of ints or Int scalars, got {type(shape).__name__}",
             FusionDtypeError)
    for s in shape:
        if isinstance(s, Scalar):
            if s.dtype not in (DataType.Int, DataType.Int32, DataType.Index):
                fail(op, f"argument '{argname}' has a non-integer scalar {s.name} of {s.dtype}", FusionDtypeError)
        elif not (isinstance(s, numbers.Integral) and not isinstance(s, bool)):
            fail(op, f"argument '{argname}' must contain ints or Int scalars, got {s!r}", FusionDtypeError)
    return list(shape)
