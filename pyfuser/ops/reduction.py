"""Reductions (sum, prod, max, min, var, var_mean, welford) and scans (cumsum, cumprod, cummax, cummin).

Dtype rules (frontend.md "Result dtypes"):
- sum/prod: ``dtype`` (not Null) casts the input first and is the result dtype, as in nvFuser and torch. With
  dtype Null, integer and bool inputs give Int (torch accumulates them in int64 too) and floats keep their dtype.
  Over an expanded broadcast dim they scale instead (see _squeeze_then_reduce), which makes a reduced-precision
  result Float, as in nvFuser.
- max/min keep the input dtype; nvFuser rejects a dtype other than Null for them, and so do we.
- var/var_mean/welford need a floating-point input (torch rejects integers); reduced-precision inputs give Float.
- cumsum/cumprod follow sum/prod (Int for integer/bool inputs, as torch.cumsum does); cummax/cummin keep the dtype.
Reduced-precision floats are always computed in Float and rounded back only where the result keeps their dtype.

Reducing an empty dim list is an identity copy (``torch.sum(x, dim=[])`` would reduce *every* dim instead).
"""

from __future__ import annotations

import math
import numbers

import torch

from ..errors import UnsupportedOpError
from ..ir.dtypes import (
    DataType,
    compute_dtype,
    is_boolean,
    is_complex,
    is_floating,
    is_integral,
    to_torch_dtype,
)
from ..ir.nodes import IterDomain, IterType, Scalar, TensorView
from .common import (
    FusionDtypeError,
    fail,
    fusion_of,
    is_number,
    literal_dtype,
    new_tensor,
    normalize_dim,
    normalize_dims,
    require_tensor,
)
from .registry import OpKind, OpResult, get, register

_MISSING = object()
_FP4 = (DataType.Float4_e2m1fn, DataType.Float4_e2m1fn_x2)


# --------------------------------------------------------------------------------------------------------------
# argument parsing shared by every reduction


def _reject_fp4(op: str, dt: DataType, what: str) -> None:
    # Packed FP4 has no unpacked torch dtype to compute from; it needs the NVFP4 path.
    if dt in _FP4:
        raise UnsupportedOpError(f"fd.ops.{op}: {what} of {dt!r} is not supported (packed FP4 needs the NVFP4 path)")


def _pick_dims(op: str, dims, dim, axes):
    """The one dims argument the caller gave, by any of its spellings (``axes=`` is older nvFuser code)."""
    given = [(n, v) for n, v in (("dims", dims), ("dim", dim), ("axes", axes)) if v is not _MISSING]
    if len(given) > 1:
        names = ", ".join(f"'{n}'" for n, _ in given)
        fail(op, f"give only one of 'dims', 'dim' or 'axes' (got {names})")
    return given[0] if given else ("dims", _MISSING)


def _parse_dims(op: str, tv: TensorView, name: str, value, required: bool) -> list[int]:
    """Sorted non-negative dims. Missing means every dim (or an error when ``required``)."""
    if value is _MISSING:
        if required:
            fail(op, "argument 'dims' is required")
        return list(range(tv.ndim))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    elif not isinstance(value, (list, tuple)):
        fail(op, f"argument '{name}' must be an int or a list of ints, got {type(value).__name__}", FusionDtypeError)
    return sorted(normalize_dims(op, list(value), tv.ndim, name))


def _check_bool(op: str, value, name: str) -> bool:
    if not isinstance(value, bool):
        fail(op, f"argument '{name}' must be a bool, got {value!r}", FusionDtypeError)
    return value


def _pick_keepdim(op: str, keepdim, keep_dim) -> bool:
    # nvFuser's bindings spell it keep_dim; the printed form (and torch) use keepdim.
    if keepdim is not _MISSING and keep_dim is not _MISSING:
        fail(op, "give only one of 'keepdim' and 'keep_dim'")
    value = keep_dim if keepdim is _MISSING else keepdim
    return False if value is _MISSING else _check_bool(op, value, "keepdim")


def _reduced_domain(tv: TensorView, dims: list[int], keepdim: bool) -> list[IterDomain]:
    """Reduced dims become Reduction dims in place (the expanded extent is realized), or plain broadcasts with
    keepdim; the other dims keep their IterDomain."""
    out = []
    for i, d in enumerate(tv.logical):
        if i not in dims:
            out.append(d)
        elif keepdim:
            out.append(IterDomain.broadcast())
        else:
            out.append(IterDomain(d.extent, IterType.Reduction))
    return out


def _to(x: torch.Tensor, tdt) -> torch.Tensor:
    return x if tdt is None or x.dtype == tdt else x.to(tdt)


def _prepare(arg: torch.Tensor, info: dict) -> torch.Tensor:
    """Apply the builder's casts: first to the requested dtype (sum/prod's ``dtype``), then to the compute dtype."""
    return _to(_to(arg, info.get("cast")), info["compute"])



# --------------------------------------------------------------------------------------------------------------
# Loop structure for kernel segments: which output dims are which input dims, and which dims really reduce.
# (The Triton lowerings live in pyfuser/codegen/reduction_lowerings.py.)


def _reduction_loop_map(node):
    """Kept input dims are the output's dims (with keepdim, every dim pairs with the same position)."""
    inp = next(v for v in node.inputs if isinstance(v, TensorView))
    dims = node.kwargs.get("dims", [])
    keep = node.kwargs.get("keepdim", False)
    pairs = []
    for out in node.outputs:
        if keep:  # the size-1 dims left by keepdim are new broadcasts, not the reduced dims
            pairs += [((out, d), (inp, d)) for d in range(inp.ndim) if d not in dims]
        else:
            kept = [d for d in range(inp.ndim) if d not in dims]
            pairs += [((out, o), (inp, i)) for o, i in enumerate(kept)]
    return pairs


def _reduced_dims(node):
    """The reduced dims that really reduce (size-1 broadcast dims reduce to a copy)."""
    inp = node.inputs[0]
    return [d for d in node.kwargs.get("dims", []) if not (inp.logical[d].is_broadcast and not inp.logical[d].expanded)]


_REDUCTION_LOOPS = dict(loop_map=_reduction_loop_map, reduced_dims=_reduced_dims)


# --------------------------------------------------------------------------------------------------------------
# sum, prod, max, min


def _torch_prod(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    # torch.prod takes a single dim; reduce the highest dim first so the lower indices stay valid.
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


_TORCH_REDUCE = {
    "sum": lambda x, dims, keepdim: torch.sum(x, dims, keepdim=keepdim),
    "prod": _torch_prod,
    "max": lambda x, dims, keepdim: torch.amax(x, dims, keepdim=keepdim),
    "min": lambda x, dims, keepdim: torch.amin(x, dims, keepdim=keepdim),
}


def _reduce_types(op: str, in_dt: DataType, dtype) -> tuple:
    """(cast-to dtype or None, compute dtype, output dtype) of a sum/prod/max/min."""
    if not isinstance(dtype, DataType):
        fail(op, f"argument 'dtype' must be a DataType, got {dtype!r}", FusionDtypeError)
    _reject_fp4(op, in_dt, "argument 'arg'")
    _reject_fp4(op, dtype, "argument 'dtype'")
    if op in ("max", "min"):
        if dtype is not DataType.Null:
            msg = f"argument 'dtype' must be DataType.Null ({op} keeps the input dtype), got {dtype!r}"
            fail(op, msg, FusionDtypeError)
        if is_complex(in_dt):
            fail(op, f"argument 'arg' must not be complex (no ordering), got {in_dt!r}", FusionDtypeError)
        return None, compute_dtype(in_dt), in_dt
    cast = dtype
    if dtype is DataType.Null:
        cast = DataType.Int if (is_integral(in_dt) or is_boolean(in_dt)) else None
    src = in_dt if cast is None else cast
    return cast, compute_dtype(src), src


def _reduce_eval(node, arg, dims, keepdim=False, dtype=DataType.Null):
    out_tdt = to_torch_dtype(node.outputs[0].dtype)
    x = _prepare(arg, node.info)
    if not dims:
        return x.to(out_tdt, copy=True)
    return _TORCH_REDUCE[node.op.name](x, list(dims), keepdim).to(out_tdt)


def _register_reduction(name: str):
    def build(arg, dims=_MISSING, keepdim=_MISSING, dtype=_MISSING, *, dim=_MISSING, axes=_MISSING, keep_dim=_MISSING):
        tv = require_tensor(name, arg, "arg")
        # nvFuser's first overload is (arg, dtype): a DataType in the dims slot is the dtype.
        if isinstance(dims, DataType):
            if dtype is not _MISSING:
                fail(name, "argument 'dtype' given twice")
            dims, dtype = _MISSING, dims
        dims_name, dims_value = _pick_dims(name, dims, dim, axes)
        norm = _parse_dims(name, tv, dims_name, dims_value, required=False)
        if tv.ndim == 0:
            norm = []  # a 0-dim tensor reduces to a copy of itself (nvFuser and torch accept dim 0 or -1)
        keep = _pick_keepdim(name, keepdim, keep_dim)
        dtype = DataType.Null if dtype is _MISSING else dtype
        cast, compute, out_dt = _reduce_types(name, tv.dtype, dtype)
        # Broadcast dims are squeezed rather than reduced, as nvFuser does: always the size-1 ones (without
        # keepdim), and for sum/prod also the expanded ones, which then scale the result (_squeeze_then_reduce).
        # max/min over an expanded dim stay a plain reduction: the same values nvFuser's squeeze gives.
        expanded = name in ("sum", "prod") and any(tv.logical[d].expanded for d in norm)
        squeezed = [d for d in norm if tv.logical[d].is_broadcast and (expanded or not tv.logical[d].expanded)]
        if name in ("sum", "prod") and any(tv.logical[d].extent == 0 for d in norm):
            return _init_instead_of_reduction(name, tv, norm, keep, out_dt)
        if squeezed and (expanded or not keep):
            return _squeeze_then_reduce(name, tv, norm, squeezed, keep, cast, dtype)
        out = new_tensor(fusion_of(name, tv), _reduced_domain(tv, norm, keep), out_dt)
        info = {"cast": None if cast is None else to_torch_dtype(cast), "compute": to_torch_dtype(compute)}
        # sum/prod record the dtype they resolved (Null on a float input is that float), which rebuilds the
        # same op and is what nvFuser prints; max/min only take Null.
        recorded = dtype if name in ("max", "min") else out_dt
        return OpResult([out], (tv,), {"dims": norm, "keepdim": keep, "dtype": recorded}, info)

    build.__doc__ = (
        f"fd.ops.{name}(arg, dtype=Null) | (arg, dim: int, keepdim=False, dtype=Null) | "
        f"(arg, dims: list[int], keepdim=False, dtype=Null): {name} over dims (every dim when none are given)."
    )
    return register(name, OpKind.REDUCTION, _reduce_eval, **_REDUCTION_LOOPS)(build)


def _squeeze_then_reduce(name: str, tv: TensorView, dims: list[int], squeezed: list[int], keep: bool, cast,
                         dtype) -> OpResult:
    """nvFuser's reduction of broadcast dims ("trivial reductions"): they are squeezed (after the dtype cast
    sum/prod make first) and only the other dims are reduced; with none left, the squeeze is the result.

    An *expanded* broadcast dim holds one value repeated over its extent, and nvFuser does not reduce the
    repeats: a sum multiplies by the product of the expanded extents, a prod raises to that power (a
    reduced-precision result becomes Float, like any arithmetic on it). Eager adds (multiplies) the repeated
    values one by one, which rounds differently. With
    keepdim the squeezed dims come back as broadcasts afterwards; a keepdim reduction over only size-1 dims
    stays a plain reduction, which gives the same values and dims."""
    src = tv if cast is None or cast is tv.dtype else get("cast").builder(tv, cast)
    expanded = [d for d in squeezed if src.logical[d].expanded]
    factor = _expanded_count(src, expanded) if name in ("sum", "prod") and expanded else None
    out = get("squeeze").builder(src, squeezed, bool(expanded))
    rest = [d - sum(1 for t in squeezed if t < d) for d in dims if d not in squeezed]
    if rest:
        out = get(name).builder(out, rest, keep, dtype)
    if factor is not None:
        # The factor takes the result's dtype, or Float (what the math runs in) for Half/BFloat16: nvFuser
        # keeps a constant factor's exact value there (a reduced-precision constant is emitted as a float
        # literal), so it is not rounded to the result's 8 or 11 bits.
        factor_dt = compute_dtype(out.dtype)
        if isinstance(factor, Scalar) and factor.dtype is not factor_dt:
            factor = get("cast").builder(factor, factor_dt)
        out = get("mul" if name == "sum" else "pow").builder(out, _as_number(factor, factor_dt))
        if not rest:
            # This product is the reduction's result: contiguous, as eager's reduction allocates it, not laid
            # out like the (possibly permuted) squeezed input (ops/elementwise.py honours the flag).
            out.defined_by.info["reduction_result"] = True
    if keep:
        out = get("broadcast").builder(out, [d in squeezed for d in range(tv.ndim)])
    return OpResult([], user_result=out)


def _init_instead_of_reduction(name: str, tv: TensorView, dims: list[int], keep: bool, out_dt: DataType):
    """A sum/prod over a dim known at definition time to be empty is its init value everywhere, built as a
    ``full`` as nvFuser builds it (checked before anything else, so an empty expanded dim is not scaled)."""
    shape = []
    for d, dom in enumerate(tv.logical):
        if d in dims:
            if keep:
                shape.append(1)
        elif dom.extent is not None:
            shape.append(dom.extent)
        else:
            shape.append(get("size").builder(tv, d))
    init = 0 if name == "sum" else 1
    if is_boolean(out_dt):
        init = bool(init)
    elif is_floating(out_dt):
        init = float(init)
    elif is_complex(out_dt):
        init = complex(init)
    return OpResult([], user_result=get("full").builder(shape, init, out_dt))


def _expanded_count(tv: TensorView, dims: list[int]):
    """How many times each value repeats over the expanded broadcast ``dims``: an int when every extent is
    known at definition time, else an Int scalar computed from ``fd.ops.size`` at run time."""
    known = math.prod(tv.logical[d].extent for d in dims if tv.logical[d].extent is not None)
    count = known
    for d in dims:
        if tv.logical[d].extent is None:
            size = get("size").builder(tv, d)
            count = size if count == 1 else get("mul").builder(count, size)
    return count


def _as_number(factor, dt: DataType):
    """A known factor as the Python number of ``dt``'s kind (a Scalar factor is already typed)."""
    if isinstance(factor, Scalar) or is_integral(dt):
        return factor
    if is_boolean(dt):
        return bool(factor)
    if is_complex(dt):
        return complex(factor)
    return float(factor)


for _name in _TORCH_REDUCE:
    _register_reduction(_name)


# --------------------------------------------------------------------------------------------------------------
# var, var_mean, welford


def _statistics_types(op: str, in_dt: DataType, allow_complex: bool) -> DataType:
    """Compute dtype of var/var_mean/welford: real (or complex) floats only, reduced precision in Float."""
    _reject_fp4(op, in_dt, "argument 'arg'")
    if is_floating(in_dt) or (allow_complex and is_complex(in_dt)):
        return compute_dtype(in_dt)
    kinds = "floating-point or complex" if allow_complex else "real floating-point"
    fail(op, f"argument 'arg' must be a {kinds} tensor, got {in_dt!r}", FusionDtypeError)


def _real_of(dt: DataType) -> DataType:
    return {DataType.ComplexFloat: DataType.Float, DataType.ComplexDouble: DataType.Double}.get(dt, dt)


def _check_correction(op: str, correction) -> int:
    if isinstance(correction, bool) or not isinstance(correction, numbers.Integral):
        fail(op, f"argument 'correction' must be an int, got {correction!r}", FusionDtypeError)
    if correction < 0:
        fail(op, f"argument 'correction'={correction} must be non-negative")
    return int(correction)


def _over(x: torch.Tensor, dims: list[int]):
    """(tensor, dims) to hand to torch: an empty dim list means statistics over one element per position, so
    reduce a new unit dim (torch would read an empty list as 'every dim')."""
    if dims:
        return x, list(dims)
    return x.unsqueeze(-1), [-1]


def _var_eval(node, arg, dims, correction=1, keepdim=False):
    x, rdims = _over(_prepare(arg, node.info), dims)
    out = torch.var(x, rdims, correction=correction, keepdim=keepdim and bool(dims))
    return out.to(to_torch_dtype(node.outputs[0].dtype))


def _var_mean_eval(node, arg, dims, correction=1, keepdim=False):
    x, rdims = _over(_prepare(arg, node.info), dims)
    var, mean = torch.var_mean(x, rdims, correction=correction, keepdim=keepdim and bool(dims))
    return var.to(to_torch_dtype(node.outputs[0].dtype)), mean.to(to_torch_dtype(node.outputs[1].dtype))


def _build_statistics(op: str, arg, dims, correction, keepdim, dim, axes, keep_dim):
    tv = require_tensor(op, arg, "arg")
    dims_name, dims_value = _pick_dims(op, dims, dim, axes)
    norm = _parse_dims(op, tv, dims_name, dims_value, required=True)
    corr = _check_correction(op, correction)
    keep = _pick_keepdim(op, keepdim, keep_dim)
    compute = _statistics_types(op, tv.dtype, allow_complex=True)
    fusion = fusion_of(op, tv)
    domain = _reduced_domain(tv, norm, keep)
    var = new_tensor(fusion, domain, _real_of(compute))
    mean = new_tensor(fusion, domain, compute)
    kwargs = {"dims": norm, "correction": corr, "keepdim": keep}
    return tv, var, mean, kwargs, {"compute": to_torch_dtype(compute)}


@register("var", OpKind.REDUCTION, _var_eval, **_REDUCTION_LOOPS)
def var(arg, dims=_MISSING, correction=1, keepdim=_MISSING, *, dim=_MISSING, axes=_MISSING, keep_dim=_MISSING):
    """fd.ops.var(arg, dims, correction=1, keepdim=False): variance with Bessel-style ``correction``."""
    tv, v, _, kwargs, info = _build_statistics("var", arg, dims, correction, keepdim, dim, axes, keep_dim)
    return OpResult([v], (tv,), kwargs, info)


@register("var_mean", OpKind.REDUCTION, _var_mean_eval, **_REDUCTION_LOOPS)
def var_mean(arg, dims=_MISSING, correction=1, keepdim=_MISSING, *, dim=_MISSING, axes=_MISSING, keep_dim=_MISSING):
    """fd.ops.var_mean(arg, dims, correction=1, keepdim=False) -> (var, mean)."""
    tv, v, m, kwargs, info = _build_statistics("var_mean", arg, dims, correction, keepdim, dim, axes, keep_dim)
    return OpResult([v, m], (tv,), kwargs, info)


def _welford_eval(node, arg, dims):
    x, rdims = _over(_prepare(arg, node.info), dims)
    count = math.prod(x.shape[d] for d in rdims)
    # Welford's M2 is the biased variance times the count; var_mean gives avg and var with one layout.
    var, avg = torch.var_mean(x, rdims, correction=0)
    n = torch.full_like(avg, count, dtype=torch.int64)
    return avg, var * count, n


@register("welford", OpKind.REDUCTION, _welford_eval, **_REDUCTION_LOOPS)
def welford(arg, dims=_MISSING, *, dim=_MISSING, axes=_MISSING):
    """fd.ops.welford(arg, dims) -> (avg, var_sum, n): mean, sum of squared deviations, and the element count
    (an Int tensor shaped like avg)."""
    tv = require_tensor("welford", arg, "arg")
    dims_name, dims_value = _pick_dims("welford", dims, dim, axes)
    norm = _parse_dims("welford", tv, dims_name, dims_value, required=True)
    compute = _statistics_types("welford", tv.dtype, allow_complex=False)
    fusion = fusion_of("welford", tv)
    domain = _reduced_domain(tv, norm, False)
    outs = [new_tensor(fusion, domain, dt) for dt in (compute, compute, DataType.Int)]
    return OpResult(outs, (tv,), {"dims": norm}, {"compute": to_torch_dtype(compute)})


# --------------------------------------------------------------------------------------------------------------
# scans


def _fold_max(r, init):
    return torch.maximum(r, torch.full((), init, dtype=r.dtype, device=r.device))


def _fold_min(r, init):
    return torch.minimum(r, torch.full((), init, dtype=r.dtype, device=r.device))


# name -> (values of the scan, how ``init`` folds into them, accumulates like sum/prod)
_SCANS = {
    "cumsum": (torch.cumsum, torch.add, True),
    "cumprod": (torch.cumprod, torch.mul, True),
    "cummax": (lambda x, d: torch.cummax(x, d).values, _fold_max, False),
    "cummin": (lambda x, d: torch.cummin(x, d).values, _fold_min, False),
}


def _scalar_rank(dt: DataType) -> int:
    """bool < integer < floating < complex: an init must not need a wider category than the scan result."""
    if is_boolean(dt):
        return 0
    if is_integral(dt):
        return 1
    if is_floating(dt):
        return 2
    return 3


def _check_init(op: str, init, result_dt: DataType) -> None:
    if init is None:
        return
    if isinstance(init, Scalar):
        init_dt = init.dtype
    elif is_number(init):
        init_dt = literal_dtype(init)
    else:
        fail(op, f"argument 'init' must be a scalar (number or Scalar), got {type(init).__name__}", FusionDtypeError)
    if _scalar_rank(init_dt) > _scalar_rank(result_dt):
        fail(op, f"argument 'init' of {init_dt!r} does not fit a scan result of {result_dt!r}", FusionDtypeError)


def _scan_eval(node, arg, dim, init=None):
    values, fold, _ = _SCANS[node.op.name]
    r = values(_prepare(arg, node.info), dim)
    if init is not None:
        r = fold(r, init)
    return r.to(to_torch_dtype(node.outputs[0].dtype))


def _register_scan(name: str):
    accumulates = _SCANS[name][2]

    def build(arg, dim, init=None):
        tv = require_tensor(name, arg, "arg")
        d = normalize_dim(name, dim, tv.ndim)
        in_dt = tv.dtype
        _reject_fp4(name, in_dt, "argument 'arg'")
        if accumulates:
            out_dt = DataType.Int if (is_integral(in_dt) or is_boolean(in_dt)) else in_dt
        else:
            if is_complex(in_dt):
                fail(name, f"argument 'arg' must not be complex (no ordering), got {in_dt!r}", FusionDtypeError)
            out_dt = in_dt
        _check_init(name, init, out_dt)
        domain = list(tv.logical)
        if domain and domain[d].expanded:
            # Scanning along an expanded dim gives different values at each position: it is materialized.
            domain[d] = IterDomain.iteration(domain[d].extent)
        out = new_tensor(fusion_of(name, tv, init), domain, out_dt)
        kwargs = {"dim": d} if init is None else {"dim": d, "init": init}
        return OpResult([out], (tv,), kwargs, {"compute": to_torch_dtype(compute_dtype(out_dt))})

    build.__doc__ = f"fd.ops.{name}(arg, dim, init=None): inclusive {name} along dim, ``init`` folded in first."
    return register(name, OpKind.SCAN, _scan_eval)(build)


for _name in _SCANS:
    _register_scan(_name)
