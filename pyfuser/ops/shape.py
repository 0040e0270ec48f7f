"""Shape ops: size, broadcast, broadcast_in_dim, expand, reshape, permute, squeeze, slice, pad, cat, stride_order.

Eager parity decides how each op is evaluated:
- VIEW ops (broadcast, broadcast_in_dim, expand, reshape, permute, squeeze, slice) are evaluated with ATen view
  functions, so their results alias their input exactly as eager PyTorch would (stride 0 on expanded dims,
  the input's strides on sliced dims). reshape is ``Tensor.reshape``: a view when torch can make one, a copy
  otherwise, as in eager.
- RESIZE ops (pad, cat) are ``F.pad`` / ``torch.cat``: new tensors. stride_order is a copy laid out in the
  requested order.
Tensors these copies create are written out in full, so an expanded broadcast input dim becomes a plain
Iteration dim of the result.

Output extents are static (ints) whenever they can be derived at definition time and None when symbolic.
"""

from __future__ import annotations

import builtins
import math
import numbers
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..errors import FusionDtypeError, UnsupportedOpError
from ..ir.tensor_layout import alloc_order_from_stride_order
from ..ir.packing import unpacked
from ..ir.dtypes import DataType, is_boolean, is_complex, is_floating, is_integral
from ..ir.nodes import IterDomain, Scalar, TensorView, Vector
from .common import (
    check_shape_arg,
    extent_of,
    fail,
    fusion_of,
    is_number,
    new_scalar,
    new_tensor,
    normalize_dim,
    normalize_dims,
    operand_dtype,
    require_tensor,
)
from .registry import OpKind, OpResult, get, register

# This module defines an op named ``slice``; evaluators need Python's.
_py_slice = builtins.slice


# --------------------------------------------------------------------------------------------------------------
# helpers


def _size(d: IterDomain) -> Optional[int]:
    """The run-time size of a logical dim when known at definition time (1 for a plain broadcast)."""
    if d.is_broadcast and not d.expanded:
        return 1
    return d.extent


def _materialized(d: IterDomain) -> IterDomain:
    """The dim in a freshly written tensor: an expanded broadcast is written out in full (nonzero stride)."""
    if d.is_broadcast and d.expanded:
        return IterDomain.iteration(d.extent)
    return d


def _int_list(op: str, value: Any, argname: str) -> tuple[Any, list]:
    """(canonical form, entries) of a list of ints / Int scalars, or a Vector (kept as is for printing)."""
    entries = check_shape_arg(op, value, argname)
    return (value if isinstance(value, Vector) else list(value)), entries


def _plain_int_list(op: str, value: Any, argname: str) -> list[int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        fail(op, f"argument '{argname}' must be a list of ints, got {type(value).__name__}", FusionDtypeError)
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            fail(op, f"argument '{argname}' must contain ints, got {v!r}", FusionDtypeError)
    return [int(v) for v in value]


def _expand_dim(op: str, d: IterDomain, target: Any, what: str) -> IterDomain:
    """The dim ``d`` expanded to ``target`` (int or Int scalar; -1 keeps ``d``), as torch.expand does.

    A size-1 dim grows into an expanded broadcast (stride 0); any other dim must already have the target size."""
    t = extent_of(target)
    if t == -1:
        return d
    if t is not None and t < 0:
        fail(op, f"{what}: target extent {t} is negative")
    have = _size(d)
    if have == 1 and t != 1:
        return IterDomain.broadcast(t)  # expanded (symbolic when t is None)
    if have is not None and t is not None and have != t:
        fail(op, f"{what}: cannot expand a dim of extent {have} to {t} (only size-1 dims can grow)")
    ext = have if have is not None else t
    if d.is_broadcast:
        return IterDomain.broadcast(ext)
    return IterDomain.iteration(ext)


def _new_broadcast(op: str, target: Any, what: str) -> IterDomain:
    t = extent_of(target)
    if t is not None and t < 0:
        fail(op, f"{what}: a new dim needs an extent >= 0, got {t}")
    return IterDomain.broadcast(t)


def _result(op_name: str, tv: TensorView, domain, args=(), kwargs=None, extra_vals=(), **tv_kw) -> OpResult:
    fusion = fusion_of(op_name, tv, *extra_vals)
    out = new_tensor(fusion, domain, tv.dtype, **tv_kw)
    return OpResult([out], (tv, *args), kwargs or {})


# --------------------------------------------------------------------------------------------------------------
# size


def _size_eval(node, arg, dim):
    sizes, _ = unpacked(node.inputs[0], arg.shape, arg.stride())  # a packed FP4 tensor's logical extent
    return int(sizes[dim])


@register("size", OpKind.HOST, _size_eval, accepts_fp4=True)
def size(arg, dim: int):
    """fd.ops.size(arg, dim): the extent of ``dim`` as an Int scalar."""
    tv = require_tensor("size", arg, "arg")
    d = normalize_dim("size", dim, tv.ndim)
    return OpResult([new_scalar(fusion_of("size", tv), DataType.Int)], (tv,), {"dim": d})



# --------------------------------------------------------------------------------------------------------------
# loop maps: inside a generated kernel a view op only re-indexes, so its lowering is the identity and its
# loop map says which output dim is which input dim.


def _pairs(node, out_in):
    out, inp = node.outputs[0], node.inputs[0]
    return [((out, o), (inp, i)) for o, i in out_in]


def _broadcast_loop_map(node):
    kept = [o for o, b in enumerate(node.kwargs["is_broadcast_dim"]) if not b]
    return _pairs(node, zip(kept, range(len(kept))))


def _broadcast_in_dim_loop_map(node):
    return _pairs(node, ((o, i) for i, o in enumerate(node.kwargs["broadcast_dims"])))


def _expand_loop_map(node):
    new = node.outputs[0].ndim - node.inputs[0].ndim
    return _pairs(node, ((i + new, i) for i in range(node.inputs[0].ndim)))


def _permute_loop_map(node):
    return _pairs(node, enumerate(node.kwargs["dims"]))


def _squeeze_loop_map(node):
    kept = [d for d in range(node.inputs[0].ndim) if d not in node.kwargs["dims"]]
    return _pairs(node, enumerate(kept))


# --------------------------------------------------------------------------------------------------------------
# broadcast, broadcast_in_dim, expand


def _broadcast_eval(node, arg, is_broadcast_dim):
    # Indexing with None inserts size-1 dims: always a new view of ``arg``.
    return arg[tuple(None if b else _py_slice(None) for b in is_broadcast_dim)]


@register("broadcast", OpKind.VIEW, _broadcast_eval, loop_map=_broadcast_loop_map)
def broadcast(arg, is_broadcast_dim):
    """fd.ops.broadcast(arg, is_broadcast_dim): one flag per output dim; True inserts a new size-1 dim."""
    op = "broadcast"
    tv = require_tensor(op, arg, "arg")
    if not isinstance(is_broadcast_dim, (list, tuple)) or not all(isinstance(b, bool) for b in is_broadcast_dim):
        fail(op, f"argument 'is_broadcast_dim' must be a list of bools, got {is_broadcast_dim!r}", FusionDtypeError)
    flags = list(is_broadcast_dim)
    kept = flags.count(False)
    if kept != tv.ndim:
        fail(op, f"argument 'is_broadcast_dim'={flags} has {kept} False entries but the input has rank {tv.ndim}")
    inp = iter(tv.logical)
    domain = [IterDomain.broadcast() if b else next(inp) for b in flags]
    return _result(op, tv, domain, kwargs={"is_broadcast_dim": flags})


def _broadcast_in_dim_eval(node, arg, shape, broadcast_dims):
    mapped = set(broadcast_dims)
    view = arg[tuple(_py_slice(None) if i in mapped else None for i in range(len(shape)))]
    return view.expand(list(shape))


@register(
    "broadcast_in_dim", OpKind.VIEW, _broadcast_in_dim_eval, loop_map=_broadcast_in_dim_loop_map
)
def broadcast_in_dim(arg, shape, broadcast_dims):
    """fd.ops.broadcast_in_dim(arg, shape, broadcast_dims): input dim j becomes output dim broadcast_dims[j]
    (strictly increasing); the other output dims are new broadcasts; the result is expanded to ``shape``."""
    op = "broadcast_in_dim"
    tv = require_tensor(op, arg, "arg")
    canon_shape, targets = _int_list(op, shape, "shape")
    rank = len(targets)
    if rank < tv.ndim:
        fail(op, f"argument 'shape' has {rank} entries, fewer than the input rank {tv.ndim}")
    dims_in = _plain_int_list(op, broadcast_dims, "broadcast_dims")
    if len(dims_in) != tv.ndim:
        fail(op, f"argument 'broadcast_dims'={dims_in} has {len(dims_in)} entries but the input has rank {tv.ndim}")
    dims = [normalize_dim(op, d, rank, "broadcast_dims") for d in dims_in]
    if any(a >= b for a, b in zip(dims, dims[1:])):
        fail(op, f"argument 'broadcast_dims'={dims_in} must be strictly increasing")
    source = dict(zip(dims, tv.logical))
    domain = []
    for i, target in enumerate(targets):
        what = f"argument 'shape'[{i}]"
        if i in source:
            domain.append(_expand_dim(op, source[i], target, f"{what} (input dim {dims.index(i)})"))
        else:
            if extent_of(target) == -1:
                fail(op, f"{what}=-1 is only allowed for dims mapped from the input")
            domain.append(_new_broadcast(op, target, what))
    if rank == tv.ndim:
        # Every output dim is an input dim (broadcast_dims is 0..n-1): no broadcast is added, only an expand,
        # and that is the op recorded (nvFuser's definition holds the same single expand).
        return OpResult([], user_result=get("expand").builder(tv, shape))
    return _result(op, tv, domain, kwargs={"shape": canon_shape, "broadcast_dims": dims}, extra_vals=targets)


def _expand_eval(node, arg, shape):
    return arg.expand(list(shape))


@register("expand", OpKind.VIEW, _expand_eval, loop_map=_expand_loop_map)
def expand(arg, shape):
    """fd.ops.expand(arg, shape): torch.expand; -1 keeps a dim, new leading dims are broadcasts."""
    op = "expand"
    tv = require_tensor(op, arg, "arg")
    canon_shape, targets = _int_list(op, shape, "shape")
    new = len(targets) - tv.ndim
    if new < 0:
        fail(op, f"argument 'shape' has {len(targets)} entries, fewer than the input rank {tv.ndim}")
    domain = []
    for i, target in enumerate(targets):
        what = f"argument 'shape'[{i}]"
        if i < new:
            if extent_of(target) == -1:
                fail(op, f"{what}=-1 is not allowed for a new leading dim")
            domain.append(_new_broadcast(op, target, what))
        else:
            domain.append(_expand_dim(op, tv.logical[i - new], target, what))
    return _result(op, tv, domain, kwargs={"shape": canon_shape}, extra_vals=targets)


# --------------------------------------------------------------------------------------------------------------
# reshape, permute, squeeze


def _reshape_eval(node, arg, new_shape):
    # Tensor.reshape: a view when the strides allow one, else a copy -- exactly what eager does.
    if arg.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        return _reshape_packed_fp4(arg, list(new_shape))
    return arg.reshape(list(new_shape))


def _reshape_packed_fp4(arg, shape: list):
    """Reshape FP4 values held as packed pairs along the last dim: the same reshape of the pairs, with the last
    output extent halved. Valid because pairs never straddle a row (even last dims on both sides)."""
    numel = arg.numel() * 2
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if not shape or shape[-1] % 2:
        raise ValueError(f"fd.ops.reshape: a packed FP4 result needs an even last extent, got shape {shape}")
    return arg.reshape(shape[:-1] + [shape[-1] // 2])


@register("reshape", OpKind.VIEW, _reshape_eval, accepts_fp4=True)
def reshape(arg, new_shape):
    """fd.ops.reshape(arg, new_shape): ints, Int scalars or a Vector; one -1 is inferred."""
    op = "reshape"
    tv = require_tensor(op, arg, "arg")
    canon_shape, targets = _int_list(op, _index_extents(new_shape), "new_shape")
    sizes = [extent_of(t) for t in targets]
    for i, s in enumerate(sizes):
        if s is not None and s < -1:
            fail(op, f"argument 'new_shape'[{i}]={s} is invalid (extents are >= 0, or -1 to infer one)")
    inferred = [i for i, s in enumerate(sizes) if s == -1]
    if len(inferred) > 1:
        fail(op, f"argument 'new_shape' has -1 at positions {inferred}; at most one extent can be inferred")
    in_sizes = [_size(d) for d in tv.logical]
    numel = math.prod(in_sizes) if None not in in_sizes else None
    known = [s for i, s in enumerate(sizes) if i not in inferred]
    if inferred:
        sizes[inferred[0]] = None
    if numel is not None and None not in known:
        other = math.prod(known)
        if inferred:
            if other == 0 or numel % other:
                fail(op, f"cannot infer the -1 in {list(_print_sizes(targets))}: {numel} elements "
                         f"do not divide by {other}")
            sizes[inferred[0]] = numel // other
        elif other != numel:
            fail(op, f"argument 'new_shape'={_print_sizes(targets)} has {other} elements but the input has {numel}")
    if tv.dtype is DataType.Float4_e2m1fn:
        # Packed at run time along the innermost allocation dim: that must be the last logical dim, and the
        # result's last extent must be even (a symbolic one is checked when it runs).
        if tv.alloc_order is not None or tv.ndim == 0:
            fail(op, "a Float4_e2m1fn input must be row-major (its packed pairs run along its last dim)")
        if sizes and sizes[-1] is not None and sizes[-1] % 2:
            fail(op, f"a Float4_e2m1fn result needs an even last extent (packed pairs), got {sizes[-1]}")
    # A static extent of 1 is a broadcast dim, as in nvFuser's static reshape.
    domain = [IterDomain.broadcast() if s == 1 else IterDomain.iteration(s) for s in sizes]
    return _result(op, tv, domain, kwargs={"new_shape": canon_shape}, extra_vals=targets)


def _index_extents(new_shape):
    """nvFuser converts each of reshape's new extents to its index type, so a floating scalar (say ``192 *
    reciprocal(n)``, which is Float) is accepted and truncated toward zero: such entries become ``cast(s, Int)``
    nodes. Python floats stay refused, as nvFuser's bindings refuse them."""
    if not isinstance(new_shape, (list, tuple)):
        return new_shape
    cast = get("cast").builder
    return [cast(s, DataType.Int) if isinstance(s, Scalar) and is_floating(s.dtype) else s for s in new_shape]


def _print_sizes(entries) -> list:
    return [e.name if isinstance(e, Scalar) and not e.is_constant else extent_of(e) for e in entries]


def _permute_eval(node, arg, dims):
    return arg.permute(list(dims))


@register("permute", OpKind.VIEW, _permute_eval, loop_map=_permute_loop_map)
def permute(arg, dims):
    """fd.ops.permute(arg, dims): output dim i is input dim dims[i]."""
    op = "permute"
    tv = require_tensor(op, arg, "arg")
    raw = _plain_int_list(op, dims, "dims")
    if len(raw) != tv.ndim:
        fail(op, f"argument 'dims'={raw} has {len(raw)} entries but the input has rank {tv.ndim}")
    perm = normalize_dims(op, raw, tv.ndim, "dims")
    return _result(op, tv, [tv.logical[d] for d in perm], kwargs={"dims": perm})


def _squeeze_eval(node, arg, dims, squeeze_expanded=False):
    # Indexing a dim with 0 removes it: a view, for a size-1 dim and for an expanded (stride-0) dim alike.
    drop = set(dims)
    source = node.inputs[0].logical
    for d in dims:
        # A squeezed dim that was not a broadcast when defined (symbolic extent) must be 1 now; this also runs
        # on meta tensors when a runtime is built, so kernels never see another extent.
        if arg.shape[d] != 1 and not source[d].expanded:
            raise ValueError(
                f"fd.ops.squeeze: dim {d} has extent {arg.shape[d]} at run time; only extent 1 can be squeezed"
            )
    return arg[tuple(0 if d in drop else _py_slice(None) for d in range(arg.dim()))]


@register("squeeze", OpKind.VIEW, _squeeze_eval, loop_map=_squeeze_loop_map)
def squeeze(arg, dims, squeeze_expanded: bool = False):
    """fd.ops.squeeze(arg, dims, squeeze_expanded=False): remove broadcast dims; an expanded broadcast dim is
    removed only with squeeze_expanded=True (its values are all equal, so the result is index 0)."""
    op = "squeeze"
    tv = require_tensor(op, arg, "arg")
    if not isinstance(squeeze_expanded, bool):
        fail(op, f"argument 'squeeze_expanded' must be a bool, got {squeeze_expanded!r}", FusionDtypeError)
    norm = normalize_dims(op, _plain_int_list(op, dims, "dims"), tv.ndim, "dims")
    for d in norm:
        dom = tv.logical[d]
        if not dom.is_broadcast and dom.extent not in (None, 1):
            fail(op, f"argument 'dims': dim {d} ({dom!r}) is not a broadcast dim and cannot be squeezed")
        # A symbolic (or static 1) non-broadcast extent is allowed, as nvFuser allows it: it must be 1 at run time.
        if dom.expanded and not squeeze_expanded:
            fail(op, f"argument 'dims': dim {d} is an expanded broadcast ({dom!r}); pass squeeze_expanded=True "
                     "to remove it")
    domain = [dom for i, dom in enumerate(tv.logical) if i not in norm]
    kwargs = {"dims": norm}
    if squeeze_expanded:
        kwargs["squeeze_expanded"] = True
    return _result(op, tv, domain, kwargs=kwargs)


# --------------------------------------------------------------------------------------------------------------
# slice


def _normalize_start(start: int, n: int) -> int:
    return min(n, max(0, start + n if start < 0 else start))


def _normalize_end(end: int, n: int, start: Optional[int]) -> int:
    end = min(n, max(0, end + n if end < 0 else end))
    return end if start is None else max(start, end)


def _slice_eval(node, arg, start_indices, end_indices, strides=None, manual_normalization=False):
    index = []
    for d, (s, e) in enumerate(zip(start_indices, end_indices)):
        n = arg.shape[d]
        if manual_normalization:
            if not 0 <= s <= e <= n:
                raise ValueError(
                    f"fd.ops.slice: dim {d} of extent {n}: manual_normalization requires 0 <= start <= end <= extent, "
                    f"got start={s}, end={e}"
                )
        else:
            s = _normalize_start(s, n)
            e = _normalize_end(e, n, s)
        index.append(_py_slice(s, e))
    return arg[tuple(index)]  # basic indexing: a new view, even when nothing is cut


# nvFuser's own words for its slice checks, kept in our messages: code written for nvFuser matches on them.
_NVF_STRIDES = "nvFuser Limitation: All slice operation strides must be of const size 1."


def _check_slice_arity(op: str, ndim: int, starts: list, ends: list, steps: Optional[list]) -> None:
    """nvFuser's arity checks, in its order: strides against starts, the rank, ends against starts."""
    n1 = len(starts)
    if steps is not None and len(steps) != n1:
        fail(op, f"argument 'strides' has {len(steps)} entries, 'start_indices' {n1}: Slice start_indices and "
                 f"strides don't match! Start Indices: {n1} Strides: {len(steps)}")
    if n1 != ndim:
        fail(op, f"argument 'start_indices' has {n1} entries but the input has rank {ndim}: Number of tensor "
                 "dimensions does not match slice dimensions!")
    if len(ends) != n1:
        fail(op, f"argument 'end_indices' has {len(ends)} entries, 'start_indices' {n1}: Slice indexing attribute "
                 f"dimensions don't match! Start Indices: {n1} End Indices: {len(ends)}")


def _check_step(op: str, d: int, step) -> None:
    v = extent_of(step)
    if v is not None and v <= 0:
        fail(op, f"argument 'strides'[{d}]={v} must be positive ({_NVF_STRIDES})")
    if v != 1:
        raise UnsupportedOpError(
            f"fd.ops.slice: argument 'strides'[{d}]={step if v is None else v}: only step 1 is supported "
            f"({_NVF_STRIDES})")


@register("slice", OpKind.VIEW, _slice_eval)
def slice(arg, start_indices, end_indices, strides=None, manual_normalization: bool = False):  # noqa: A001
    """fd.ops.slice(arg, start_indices, end_indices, strides=None, manual_normalization=False).

    Ends are exclusive; steps must be 1. Without manual normalization negative bounds wrap and bounds are
    clamped to [0, extent] (at definition time where the bound and extent are static, else at run time).
    Bounds normalized at definition time are printed normalized; when all are, the printed call carries
    manual_normalization=True (as nvFuser prints it), which rebuilds the same op."""
    op = "slice"
    tv = require_tensor(op, arg, "arg")
    n = tv.ndim
    if not isinstance(manual_normalization, bool):
        fail(op, f"argument 'manual_normalization' must be a bool, got {manual_normalization!r}", FusionDtypeError)
    _, starts = _int_list(op, start_indices, "start_indices")
    _, ends = _int_list(op, end_indices, "end_indices")
    steps = None if strides is None else _int_list(op, strides, "strides")[1]
    _check_slice_arity(op, n, starts, ends, steps)
    new_starts, new_ends, domain = [], [], []
    all_static = True  # every bound known and final at definition time
    for d, (dom, s, e) in enumerate(zip(tv.logical, starts, ends)):
        size_d = _size(dom)
        ss, es = extent_of(s), extent_of(e)
        if manual_normalization and ss is not None and ss < 0:
            fail(op, f"argument 'start_indices'[{d}]={ss} is negative (manual_normalization=True): Slice operation "
                     f"start_indices must be greater than or equal to 0. Start Indices: {ss}")
        # Constant bounds as given (negative ones wrap, below): an end before its start is an error, as in nvFuser.
        if ss is not None and es is not None and 0 <= es < ss:
            fail(op, f"argument 'end_indices'[{d}]={es} is below start {ss}: Slice operation end_indices must be "
                     f"greater than or equal to start_indices. Start Indices: {ss} End Indices: {es}")
        if steps is not None:
            _check_step(op, d, steps[d])
        if manual_normalization:
            if size_d is not None and es is not None and es > size_d:
                fail(op, f"argument 'end_indices'[{d}]={es} exceeds the extent {size_d} (manual_normalization=True)")
        elif size_d is not None:
            # Normalizing is idempotent, so bounds normalized here give the same result when the run time
            # normalizes them again.
            if ss is not None:
                ss = s = _normalize_start(ss, size_d)
            if es is not None:
                es = e = _normalize_end(es, size_d, ss)
        else:
            ss = es = None  # static bounds on a symbolic extent: the clamped values are known only at run time
        all_static = all_static and ss is not None and es is not None
        new_starts.append(s)
        new_ends.append(e)
        domain.append(_sliced_dim(dom, ss, es, size_d))
    # Steps are always 1 (checked above); the call records them, as nvFuser prints them.
    kwargs = {"start_indices": new_starts, "end_indices": new_ends, "strides": [1] * n}
    if manual_normalization or all_static:
        kwargs["manual_normalization"] = True
    return _result(op, tv, domain, kwargs=kwargs, extra_vals=starts + ends)


def _sliced_dim(dom: IterDomain, start: Optional[int], end: Optional[int], size_d: Optional[int]) -> IterDomain:
    """The output dim of a slice with (normalized where static) bounds."""
    if start == 0 and end is not None and end == size_d:
        return dom  # nothing cut
    ext = end - start if start is not None and end is not None else None
    if ext == 1:  # a static extent of 1 is a broadcast dim, as nvFuser makes a resize known to give 1
        return IterDomain.broadcast()
    if dom.expanded and ext != 0:
        return IterDomain.broadcast(ext)  # a slice of a stride-0 dim keeps stride 0
    return IterDomain.iteration(ext)


# --------------------------------------------------------------------------------------------------------------
# pad, cat


def _same_kind(a: DataType, b: DataType) -> bool:
    """nvFuser's hasSimilarDtype: the pad value must be of the tensor's kind (float/complex/int/bool)."""
    return any(pred(a) and pred(b) for pred in (is_floating, is_complex, is_integral, is_boolean))


def _pad_eval(node, arg, pad_widths, value=None):
    if value is None:
        value = False if arg.dtype == torch.bool else 0
    return F.pad(arg, list(pad_widths), mode="constant", value=value)


@register("pad", OpKind.RESIZE, _pad_eval)
def pad(arg, pad_widths, value=None):
    """fd.ops.pad(arg, pad_widths, value=None): (left, right) pairs from the LAST dim, as torch.nn.functional.pad.

    Negative widths crop. The default fill is 0 (False for Bool); a given value must be of the tensor's kind."""
    op = "pad"
    tv = require_tensor(op, arg, "arg")
    canon, widths = _int_list(op, pad_widths, "pad_widths")
    if len(widths) % 2 or len(widths) > 2 * tv.ndim:
        fail(op, f"argument 'pad_widths' has {len(widths)} entries; it needs an even number, "
                 f"at most 2 * rank = {2 * tv.ndim}")
    extra = list(widths)
    if value is not None:
        if not (isinstance(value, Scalar) or is_number(value)):
            fail(op, f"argument 'value' must be a scalar, got {type(value).__name__}", FusionDtypeError)
        if not _same_kind(tv.dtype, operand_dtype(value)):
            fail(op, f"argument 'value' is {operand_dtype(value)!r} but the tensor is {tv.dtype!r}", FusionDtypeError)
        extra.append(value)
    domain = [_materialized(d) for d in tv.logical]
    for k in range(len(widths) // 2):
        d = tv.ndim - 1 - k
        lo, hi = extent_of(widths[2 * k]), extent_of(widths[2 * k + 1])
        if lo == 0 and hi == 0:
            continue
        size_d = _size(tv.logical[d])
        ext = None if None in (size_d, lo, hi) else size_d + lo + hi
        if ext is not None and ext < 0:
            fail(op, f"argument 'pad_widths': dim {d} of extent {size_d} padded by ({lo}, {hi}) "
                     f"has negative extent {ext}")
        domain[d] = IterDomain.iteration(ext)
    kwargs = {} if value is None else {"value": value}
    return _result(op, tv, domain, (canon,), kwargs, extra_vals=extra)


def _cat_eval(node, tensors, dim=0):
    return torch.cat(list(tensors), dim)


@register("cat", OpKind.RESIZE, _cat_eval)
def cat(tensors, dim: int = 0, manual_padding: bool = False):
    """fd.ops.cat(tensors, dim=0, manual_padding=False): torch.cat. nvFuser requires equal ranks and equal dtypes
    (no promotion); extents of the other dims must match."""
    op = "cat"
    if manual_padding:
        raise UnsupportedOpError("fd.ops.cat: manual_padding=True (inputs already padded) is not supported")
    if not isinstance(tensors, (list, tuple)) or not tensors:
        fail(op, "argument 'tensors' must be a non-empty list of tensors")
    tvs = [require_tensor(op, t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    ranks = [t.ndim for t in tvs]
    if len(set(ranks)) != 1:
        fail(op, f"argument 'tensors' must have equal ranks, got {ranks}")
    dtypes = [t.dtype for t in tvs]
    if len(set(dtypes)) != 1:
        fail(op, f"argument 'tensors' must have equal dtypes (nvFuser does not promote), got {dtypes}",
             FusionDtypeError)
    if ranks[0] == 0:
        fail(op, "argument 'tensors': 0-dim tensors cannot be concatenated")
    cd = normalize_dim(op, dim, ranks[0])
    domain = []
    for d in range(ranks[0]):
        dims = [t.logical[d] for t in tvs]
        sizes = [_size(x) for x in dims]
        if d == cd:
            domain.append(IterDomain.iteration(None if None in sizes else sum(sizes)))
            continue
        static = {s for s in sizes if s is not None}
        if len(static) > 1:
            fail(op, f"argument 'tensors': extents {sizes} of dim {d} do not match (only dim {cd} may differ)")
        if all(x.is_broadcast and not x.expanded for x in dims):
            domain.append(IterDomain.broadcast())
        else:
            domain.append(IterDomain.iteration(static.pop() if static else None))
    fusion = fusion_of(op, tvs)
    out = new_tensor(fusion, domain, dtypes[0])
    return OpResult([out], (list(tvs),), {"dim": cd})


# --------------------------------------------------------------------------------------------------------------
# stride_order


def _strides_in_order(sizes, alloc_order) -> list[int]:
    """Dense strides with the dims laid out in ``alloc_order`` (outermost first)."""
    strides = [0] * len(sizes)
    running = 1
    for d in reversed(alloc_order):
        strides[d] = running
        running *= max(int(sizes[d]), 1)
    return strides


def _stride_order_eval(node, arg, stride_order):
    alloc = node.info["alloc_order"]
    out = torch.empty_strided(tuple(arg.shape), _strides_in_order(arg.shape, alloc), dtype=arg.dtype, device=arg.device)
    out.copy_(arg)
    return out


# In a kernel the copy is the store itself: the output is allocated with the requested strides.
@register("stride_order", OpKind.POINTWISE, _stride_order_eval)
def stride_order(arg, stride_order):
    """fd.ops.stride_order(arg, stride_order): a copy whose strides follow ``stride_order`` (stride_order[i] is
    the rank of dim i's stride, 0 = fastest), as in define_tensor."""
    op = "stride_order"
    tv = require_tensor(op, arg, "arg")
    order = _plain_int_list(op, stride_order, "stride_order")
    if len(order) != tv.ndim:
        fail(op, f"argument 'stride_order'={order} has {len(order)} entries but the input has rank {tv.ndim}")
    alloc = alloc_order_from_stride_order(order, tv.ndim, "fd.ops.stride_order: argument 'stride_order'")
    alloc = alloc or list(range(tv.ndim))
    canon = [s % tv.ndim for s in order]
    domain = [_materialized(d) for d in tv.logical]
    result = _result(op, tv, domain, kwargs={"stride_order": canon}, alloc_order=alloc)
    result.info["alloc_order"] = tuple(alloc)
    return result

