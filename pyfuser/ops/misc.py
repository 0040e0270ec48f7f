"""Misc ops: triu (pointwise), topk and argsort (semantics here; their Triton lowerings over a small dim, with
the cases that stay on ATen, are attached from pyfuser/codegen/sort_lowerings.py).

All keep the input's dtype except the indices of topk and argsort, which are Int (torch.int64).
"""

from __future__ import annotations

import numbers

import torch

from ..ir.dtypes import DataType, is_boolean, is_complex
from ..ir.nodes import IterDomain, Scalar, TensorView
from .common import FusionDtypeError, extent_of, fail, fusion_of, new_tensor, normalize_dim, require_tensor
from .registry import OpKind, OpResult, register


def _check_int_arg(op: str, x, argname: str) -> None:
    if isinstance(x, Scalar):
        if x.dtype not in (DataType.Int, DataType.Int32, DataType.Index):
            fail(op, f"argument '{argname}' must be an Int scalar, got {x.dtype!r}", FusionDtypeError)
    elif isinstance(x, bool) or not isinstance(x, numbers.Integral):
        fail(op, f"argument '{argname}' must be an int or an Int scalar, got {x!r}", FusionDtypeError)


def _check_bool_arg(op: str, x, argname: str) -> None:
    if not isinstance(x, bool):
        fail(op, f"argument '{argname}' must be a bool, got {x!r}", FusionDtypeError)


def _check_sortable(op: str, tv: TensorView, allow_bool: bool) -> None:
    if tv.ndim == 0:
        fail(op, "argument 'arg' must have rank >= 1, got a 0-dim tensor")
    if is_complex(tv.dtype) or (is_boolean(tv.dtype) and not allow_bool):
        fail(op, f"does not support {tv.dtype!r} tensors", FusionDtypeError)


def _materialized(d: IterDomain) -> IterDomain:
    """The dim an op reorders: values vary along it even where the input was an expanded broadcast."""
    return IterDomain.iteration(d.extent) if d.is_broadcast and d.expanded else d


# --------------------------------------------------------------------------------------------------------------
# triu


def _triu_eval(node, arg, diagonal=0):
    return torch.triu(arg, diagonal)


@register("triu", OpKind.POINTWISE, _triu_eval)
def triu(arg, diagonal=0):
    """fd.ops.triu(arg, diagonal=0): torch.triu over the two innermost dims (rank >= 2); keeps the dtype."""
    op = "triu"
    tv = require_tensor(op, arg, "arg")
    if tv.ndim < 2:
        fail(op, f"argument 'arg' must have rank >= 2, got rank {tv.ndim}")
    _check_int_arg(op, diagonal, "diagonal")
    # Zeroing below the diagonal makes rows and columns differ: the matrix dims are no longer broadcasts.
    domain = list(tv.logical[:-2]) + [_materialized(d) for d in tv.logical[-2:]]
    out = new_tensor(fusion_of(op, tv, diagonal), domain, tv.dtype)
    kwargs = {} if isinstance(diagonal, int) and diagonal == 0 else {"diagonal": diagonal}
    return OpResult([out], (tv,), kwargs)


# --------------------------------------------------------------------------------------------------------------
# topk


def _topk_eval(node, arg, k, dim, largest=True, sorted=False):
    values, indices = torch.topk(arg, k, dim=dim, largest=largest, sorted=sorted)
    return values, indices


@register("topk", OpKind.ATEN, _topk_eval)
def topk(arg, k, dim: int = -1, largest: bool = True, sorted: bool = False):
    """fd.ops.topk(arg, k, dim=-1, largest=True, sorted=False) -> (values, indices): torch.topk. With
    sorted=False the order of the k results is unspecified (as in torch)."""
    op = "topk"
    tv = require_tensor(op, arg, "arg")
    _check_sortable(op, tv, allow_bool=False)
    d = normalize_dim(op, dim, tv.ndim)
    _check_int_arg(op, k, "k")
    _check_bool_arg(op, largest, "largest")
    _check_bool_arg(op, sorted, "sorted")
    kv = extent_of(k)
    dom = tv.logical[d]
    size = 1 if dom.is_broadcast and not dom.expanded else dom.extent
    if kv is not None and (kv < 0 or (size is not None and kv > size)):
        fail(op, f"argument 'k'={kv} is out of range for dim {d} of size {size}")
    domain = list(tv.logical)
    # nvFuser's TopKOp: the selected dim is an Iteration dim of extent k (also when k is 1).
    domain[d] = IterDomain.iteration(kv)
    fusion = fusion_of(op, tv, k)
    values = new_tensor(fusion, domain, tv.dtype)
    indices = new_tensor(fusion, domain, DataType.Int)
    kwargs = {"dim": d}
    if largest is not True:
        kwargs["largest"] = largest
    if sorted is not False:
        kwargs["sorted"] = sorted
    return OpResult([values, indices], (tv, k), kwargs)


# --------------------------------------------------------------------------------------------------------------
# argsort


def _argsort_eval(node, arg, dim, descending=False, stable=False):
    return torch.argsort(arg, dim=dim, descending=descending, stable=stable)


@register("argsort", OpKind.ATEN, _argsort_eval)
def argsort(arg, dim: int, descending: bool = False, stable: bool = False):
    """fd.ops.argsort(arg, dim, descending=False, stable=False): torch.argsort; Int indices of arg's shape.
    Without stable=True the order of equal elements is unspecified (as in torch)."""
    op = "argsort"
    tv = require_tensor(op, arg, "arg")
    _check_sortable(op, tv, allow_bool=True)
    d = normalize_dim(op, dim, tv.ndim)
    _check_bool_arg(op, descending, "descending")
    _check_bool_arg(op, stable, "stable")
    domain = list(tv.logical)
    domain[d] = _materialized(domain[d])
    out = new_tensor(fusion_of(op, tv), domain, DataType.Int)
    kwargs = {"dim": d}
    if descending is not False:
        kwargs["descending"] = descending
    if stable is not False:
        kwargs["stable"] = stable
    return OpResult([out], (tv,), kwargs)
