"""Indexing ops: index_select, select, gather, take_along_axis, scatter, embedding_fwd.

Semantics follow the eager PyTorch op each mirrors (torch.index_select, torch.select, torch.gather,
torch.take_along_dim, out-of-place torch.scatter, F.embedding); shapes and broadcast rules follow nvFuser's
csrc/ops/indexing.cpp. Index tensors must be Int or Int32. ATen's gather/scatter/take_along_dim only take
int64 indices, so their evaluators widen Int32 indices first (values are unchanged, so the result is too).

Output IterDomains: a dim is kept as a broadcast only where the output really is constant along it. An
expanded index dim that selects different elements of a non-broadcast input dim (gather) or an expanded dim
that scatter writes into becomes an ordinary Iteration dim.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.nn.functional as F

from ..ir.dtypes import DataType, is_complex
from ..ir.nodes import IterDomain, Scalar, TensorView
from .common import (
    FusionDtypeError,
    check_operand,
    extent_of,
    fail,
    fusion_of,
    is_number,
    literal_dtype,
    new_tensor,
    normalize_dim,
    operand_dtype,
    require_tensor,
)
from .registry import OpKind, OpResult, register

INDEX_DTYPES = (DataType.Int, DataType.Int32)


# --------------------------------------------------------------------------------------------------------------
# shared checks


def _check_index(op: str, index, argname: str = "index") -> TensorView:
    tv = require_tensor(op, index, argname)
    if tv.dtype not in INDEX_DTYPES:
        fail(op, f"argument '{argname}' must be an Int or Int32 tensor, got {tv.dtype!r}", FusionDtypeError)
    return tv


def _check_rank_at_least_1(op: str, tv: TensorView, argname: str = "arg") -> None:
    if tv.ndim == 0:
        fail(op, f"argument '{argname}' must have rank >= 1, got a 0-dim tensor")


def _check_same_rank(op: str, tensors: dict) -> None:
    ranks = {name: t.ndim for name, t in tensors.items()}
    if len(set(ranks.values())) != 1:
        desc = ", ".join(f"'{n}' has rank {r}" for n, r in ranks.items())
        fail(op, f"tensors must have equal rank ({desc})")


def _size(d: IterDomain) -> Optional[int]:
    """Run-time size of a dim if known at definition time (a plain broadcast always has size 1)."""
    if d.is_broadcast and not d.expanded:
        return 1
    return d.extent


def _check_not_larger(op: str, small: TensorView, big: TensorView, small_name: str, big_name: str, skip: int = -1):
    """torch.gather/scatter require small.size(d) <= big.size(d) (for every d but ``skip``)."""
    for d, (a, b) in enumerate(zip(small.logical, big.logical)):
        sa, sb = _size(a), _size(b)
        if d != skip and sa is not None and sb is not None and sa > sb:
            fail(op, f"'{small_name}' has size {sa} in dim {d}, larger than {sb} of '{big_name}'")


def _as_iteration(d: IterDomain) -> IterDomain:
    """An expanded broadcast whose values now vary along it becomes a plain dim of the same extent."""
    if d.is_broadcast and d.expanded:
        return IterDomain.iteration(d.extent)
    return d


def _long(index: torch.Tensor) -> torch.Tensor:
    return index if index.dtype == torch.int64 else index.to(torch.int64)


# --------------------------------------------------------------------------------------------------------------
# index_select


def _index_select_eval(node, arg, index, dim):
    return torch.index_select(arg, dim, index)


@register("index_select", OpKind.INDEXING, _index_select_eval)
def index_select(arg, index, dim: int):
    """fd.ops.index_select(arg, index, dim): torch.index_select; ``index`` is a 1-D (or 0-D) Int/Int32 tensor."""
    op = "index_select"
    tv = require_tensor(op, arg, "arg")
    idx = _check_index(op, index)
    _check_rank_at_least_1(op, tv)
    d = normalize_dim(op, dim, tv.ndim)
    if idx.ndim > 1:
        fail(op, f"argument 'index' must be a 1-D or 0-D tensor, got rank {idx.ndim}")
    # A 0-D index keeps the dim with size 1 (torch semantics, nvFuser's select + unsqueeze).
    selected = idx.logical[0] if idx.ndim == 1 else IterDomain.broadcast()
    domain = list(tv.logical)
    domain[d] = selected
    out = new_tensor(fusion_of(op, tv, idx), domain, tv.dtype)
    return OpResult([out], (tv, idx), {"dim": d})


# --------------------------------------------------------------------------------------------------------------
# select


def _select_eval(node, arg, index, dim):
    return torch.select(arg, dim, index)


@register("select", OpKind.VIEW, _select_eval)
def select(arg, index, dim: int):
    """fd.ops.select(arg, index, dim): torch.select, a view without ``dim``. ``index`` is an int or an Int scalar;
    negative values count from the end, as in torch."""
    op = "select"
    tv = require_tensor(op, arg, "arg")
    _check_rank_at_least_1(op, tv)
    d = normalize_dim(op, dim, tv.ndim)
    if isinstance(index, Scalar):
        if index.dtype not in (DataType.Int, DataType.Int32, DataType.Index):
            fail(op, f"argument 'index' must be an Int scalar, got {index.dtype!r}", FusionDtypeError)
    elif isinstance(index, bool) or not isinstance(index, numbers.Integral):
        fail(op, f"argument 'index' must be an int or an Int scalar, got {index!r}", FusionDtypeError)
    value, size = extent_of(index), _size(tv.logical[d])
    if value is not None and size is not None and not -size <= value < size:
        fail(op, f"argument 'index'={value} is out of range for dim {d} of size {size}")
    domain = [x for i, x in enumerate(tv.logical) if i != d]
    out = new_tensor(fusion_of(op, tv, index), domain, tv.dtype)
    return OpResult([out], (tv, index), {"dim": d})


# --------------------------------------------------------------------------------------------------------------
# gather


def _gather_eval(node, arg, index, dim):
    return torch.gather(arg, dim, _long(index))


def _gather_dim(d: int, dim: int, arg_d: IterDomain, idx_d: IterDomain) -> IterDomain:
    # out[..i..] = arg[.. i ..] with the gathered position taken from index: along dim the output is constant
    # wherever the index is; along other dims it is constant only if both index and arg are.
    if idx_d.is_broadcast and idx_d.expanded and d != dim and not arg_d.is_broadcast:
        return IterDomain.iteration(idx_d.extent)
    return idx_d


@register("gather", OpKind.INDEXING, _gather_eval)
def gather(arg, index, dim: int):
    """fd.ops.gather(arg, index, dim): torch.gather. The output has the index's shape; index and arg have equal
    rank and ``index.size(d) <= arg.size(d)`` for every d != dim."""
    op = "gather"
    tv = require_tensor(op, arg, "arg")
    idx = _check_index(op, index)
    _check_rank_at_least_1(op, tv)
    _check_same_rank(op, {"arg": tv, "index": idx})
    d = normalize_dim(op, dim, tv.ndim)
    _check_not_larger(op, idx, tv, "index", "arg", skip=d)
    domain = [_gather_dim(i, d, a, x) for i, (a, x) in enumerate(zip(tv.logical, idx.logical))]
    out = new_tensor(fusion_of(op, tv, idx), domain, tv.dtype)
    return OpResult([out], (tv, idx), {"dim": d})


# --------------------------------------------------------------------------------------------------------------
# take_along_axis


def _take_along_axis_eval(node, arg, index, dim):
    return torch.take_along_dim(arg, _long(index), dim)


def _take_along_dim(op: str, d: int, arg_d: IterDomain, idx_d: IterDomain) -> IterDomain:
    """A non-indexed dim: arg and index broadcast against each other (nvFuser's takeAlongAxis rule)."""
    if not arg_d.is_broadcast and not idx_d.is_broadcast:
        a, b = arg_d.extent, idx_d.extent
        if a is not None and b is not None and a != b:
            fail(op, f"dim {d} has extent {a} in 'arg' but {b} in 'index'; non-indexed dims must match or be broadcast")
        return IterDomain.iteration(a if a is not None else b)
    concrete = arg_d if not arg_d.is_broadcast else idx_d
    other = idx_d if concrete is arg_d else arg_d
    if (not concrete.is_broadcast and other.expanded and None not in (other.extent, concrete.extent)
            and other.extent != concrete.extent):
        fail(op, f"dim {d}: expanded extent {other.extent} does not match {concrete.extent}")
    if not concrete.is_broadcast:
        return concrete
    # Both broadcast: the index decides if it is expanded, as in nvFuser.
    return idx_d if idx_d.expanded else arg_d


@register("take_along_axis", OpKind.INDEXING, _take_along_axis_eval)
def take_along_axis(arg, index, dim: int):
    """fd.ops.take_along_axis(arg, index, dim): torch.take_along_dim. Index and arg have equal rank; each
    non-indexed dim must have equal extents in both or be a broadcast in one of them."""
    op = "take_along_axis"
    tv = require_tensor(op, arg, "arg")
    idx = _check_index(op, index)
    _check_rank_at_least_1(op, tv)
    _check_same_rank(op, {"arg": tv, "index": idx})
    d = normalize_dim(op, dim, tv.ndim)
    domain = [
        x if i == d else _take_along_dim(op, i, a, x) for i, (a, x) in enumerate(zip(tv.logical, idx.logical))
    ]
    out = new_tensor(fusion_of(op, tv, idx), domain, tv.dtype)
    return OpResult([out], (tv, idx), {"dim": d})


# --------------------------------------------------------------------------------------------------------------
# scatter


def _scatter_eval(node, arg, index, src, dim):
    # ``src`` is a tensor or a Python number: torch.scatter has an overload for each.
    if isinstance(src, torch.Tensor) and arg.device.type == "cuda" and index.numel() > 0 and not arg.is_complex():
        return _scatter_last_write(arg, dim, _long(index), src)
    return torch.scatter(arg, dim, _long(index), src)


_BIT_VIEWS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _scatter_last_write(arg, dim: int, index, src):
    """torch.scatter with repeated indices resolved as ATen's CPU scatter resolves them: the last write in index
    order wins. CUDA's scatter leaves that winner unspecified (it may differ from call to call); pyfuser's kernel
    and its CPU path both keep the last, so the ATen path on CUDA does too, deterministically: the winning
    position of every written element is the largest position writing it (scatter_reduce "amax", the same
    whatever order the writes land in), and src is taken there. The result is torch.scatter's own (its layout,
    arg's elements where nothing writes) with the written elements replaced. Floats move as their bit patterns
    (ATen's CPU gather and scatter of 16-bit floats rewrite NaNs)."""
    if arg.dtype.is_floating_point:
        bits = _BIT_VIEWS[arg.element_size()]
        moved = _scatter_last_write(arg.resolve_neg().view(bits), dim, index, src.resolve_neg().view(bits))
        return moved.view(arg.dtype)
    out = torch.scatter(arg, dim, index, src)
    pos_shape = [1] * index.dim()
    pos_shape[dim] = index.shape[dim]
    positions = torch.arange(index.shape[dim], device=index.device).view(pos_shape).expand(index.shape)
    # Written elements lie within the index's extents along the other dims (torch.scatter's shape rule).
    region_shape = [n if d == dim else index.shape[d] for d, n in enumerate(arg.shape)]
    winner = torch.full(region_shape, -1, dtype=torch.int64, device=arg.device)
    winner.scatter_reduce_(dim, index, positions, "amax")
    region = out
    for d, n in enumerate(region_shape):
        if d != dim:
            region = region.narrow(d, 0, n)
    region.copy_(torch.where(winner >= 0, torch.gather(src, dim, winner.clamp(min=0)), region))
    return out


@register("scatter", OpKind.INDEXING, _scatter_eval)
def scatter(arg, index, src, dim: int):
    """fd.ops.scatter(arg, index, src, dim): out-of-place torch.scatter (a copy of ``arg`` with
    ``out[..index[i]..] = src[..i..]`` along ``dim``). ``src`` is a tensor of arg's dtype or a scalar. With
    repeated indices the last write in index order wins, on every path and device (as ATen's CPU scatter; torch
    documents it as unspecified, and CUDA's scatter leaves it so)."""
    op = "scatter"
    tv = require_tensor(op, arg, "arg")
    idx = _check_index(op, index)
    check_operand(op, src, "src")
    _check_rank_at_least_1(op, tv)
    tensors = {"arg": tv, "index": idx}
    if isinstance(src, TensorView):
        tensors["src"] = src
        if src.dtype is not tv.dtype:
            fail(op, f"argument 'src' must have arg's dtype {tv.dtype!r}, got {src.dtype!r}", FusionDtypeError)
    elif is_complex(operand_dtype(src)) and not is_complex(tv.dtype):
        fail(op, f"argument 'src' is complex but arg is {tv.dtype!r}", FusionDtypeError)
    _check_same_rank(op, tensors)
    d = normalize_dim(op, dim, tv.ndim)
    _check_not_larger(op, idx, tv, "index", "arg", skip=d)
    if isinstance(src, TensorView):
        _check_not_larger(op, idx, src, "index", "src")
    # Scattered values vary along every dim the index spans, so an expanded dim of arg is no longer constant.
    domain = [_as_iteration(x) for x in tv.logical]
    out = new_tensor(fusion_of(op, tv, idx, src), domain, tv.dtype)
    return OpResult([out], (tv, idx, src), {"dim": d})


# --------------------------------------------------------------------------------------------------------------
# embedding_fwd


_EMBEDDING_OPTIONS = ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")


def _embedding_eval(
    node, input, weight, padding_idx=None, max_norm=None, norm_type=None, scale_grad_by_freq=None, sparse=None
):
    # As F.embedding (and nvFuser's EmbeddingFwdOp, which calls it): with max_norm the referenced rows of
    # ``weight`` are renormalized in place before the lookup.
    return F.embedding(
        input,
        weight,
        padding_idx=padding_idx,
        max_norm=max_norm,
        norm_type=2.0 if norm_type is None else norm_type,
        scale_grad_by_freq=bool(scale_grad_by_freq),
        sparse=bool(sparse),
    )


def _embedding_meta(node, input, weight, **options):
    # nvFuser #5477: the real result is always a fresh contiguous input.shape + [weight.size(1)] tensor,
    # whatever the layouts of input and weight (and the in-place renorm must not run on meta tensors).
    return torch.empty((*input.shape, weight.shape[1]), dtype=weight.dtype, device="meta")


def _check_option_scalar(op: str, name: str, value, kind: str):
    if value is None:
        return
    dt = value.dtype if isinstance(value, Scalar) else (literal_dtype(value) if is_number(value) else None)
    ok = {
        "int": dt in (DataType.Int, DataType.Int32, DataType.Index),
        "float": dt in (DataType.Double, DataType.Float, DataType.Int, DataType.Int32),
        "bool": dt is DataType.Bool,
    }[kind]
    if not ok:
        fail(op, f"argument '{name}' must be {'an' if kind == 'int' else 'a'} {kind} or a scalar of that type, "
                 f"got {value!r}", FusionDtypeError)


@register("embedding_fwd", OpKind.ATEN, _embedding_eval, meta=_embedding_meta)
def embedding_fwd(input, weight, padding_idx=None, max_norm=None, norm_type=None, scale_grad_by_freq=None, sparse=None):
    """fd.ops.embedding_fwd(input, weight, ...): F.embedding. ``input`` holds Int/Int32 row numbers of the 2-D
    ``weight``; the result is ``input.shape + [weight.shape[1]]`` of weight's dtype."""
    op = "embedding_fwd"
    idx = _check_index(op, input, "input")
    w = require_tensor(op, weight, "weight")
    if w.ndim != 2:
        fail(op, f"argument 'weight' must be a 2-D tensor, got rank {w.ndim}")
    options = {
        "padding_idx": padding_idx,
        "max_norm": max_norm,
        "norm_type": norm_type,
        "scale_grad_by_freq": scale_grad_by_freq,
        "sparse": sparse,
    }
    kinds = {
        "padding_idx": "int", "max_norm": "float", "norm_type": "float", "scale_grad_by_freq": "bool", "sparse": "bool"
    }
    for name in _EMBEDDING_OPTIONS:
        _check_option_scalar(op, name, options[name], kinds[name])
    rows = _size(w.logical[0])
    if isinstance(padding_idx, numbers.Integral) and rows is not None and not -rows <= padding_idx < rows:
        fail(op, f"argument 'padding_idx'={padding_idx} is out of range for a weight with {rows} rows")
    domain = list(idx.logical) + [w.logical[1]]
    out = new_tensor(fusion_of(op, idx, w, *options.values()), domain, w.dtype)
    kwargs = {k: v for k, v in options.items() if v is not None}
    return OpResult([out], (idx, w), kwargs)

