"""Factory ops: full, iota, uniform, normal.

Factories have no tensor operands, so they take their fusion from the ``with FusionDefinition()`` block and
their device from the run (:func:`pyfuser.runtime.evaluator.run_device`: the device of the fusion's tensor
inputs, "meta" during meta inference). Results are fresh contiguous tensors.

Shapes are lists of ints / Int scalars, or a Vector. As in nvFuser's TensorViewBuilder, a constant extent of 1
makes a broadcast dim, so a factory result broadcasts against other tensors like a size-1 dim in torch.

Random factories: with ``rng_seed`` and ``rng_offset`` the values come from a torch.Generator seeded from the
pair, so equal (seed, offset) give equal values on every run (on a given device); without them they draw from
torch's default generator, as eager torch.rand / torch.randn do. Values are drawn in Float (Double for Double) and
then cast, as nvFuser does; ``uniform`` stays in [minval, maxval) after the cast (a value rounded to maxval becomes
minval, as in nvFuser).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import torch

from ..ir.dtypes import DataType, compute_dtype, is_complex, is_floating, is_integral, to_torch_dtype
from ..ir.nodes import IterDomain, Scalar
from .common import (
    FusionDtypeError,
    check_shape_arg,
    extent_of,
    fail,
    fusion_of,
    is_number,
    new_tensor,
    operand_dtype,
)
from . import run_context
from .registry import OpKind, OpResult, register

_MASK64 = (1 << 64) - 1
_RANDOM_DTYPES = (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16)
_IOTA_DTYPES = (DataType.Int, DataType.Int32, DataType.Index) + _RANDOM_DTYPES


# --------------------------------------------------------------------------------------------------------------
# shared helpers


def _device():
    return run_context.run_device()


def _check_dtype(op: str, dtype: Any, allowed=None) -> DataType:
    if not isinstance(dtype, DataType) or dtype is DataType.Null:
        fail(op, f"argument 'dtype' must be a DataType other than Null, got {dtype!r}", FusionDtypeError)
    if dtype in (DataType.Float4_e2m1fn, DataType.Float4_e2m1fn_x2):
        fail(op, f"argument 'dtype'={dtype!r} is not supported (no unpacked FP4 storage)", FusionDtypeError)
    if allowed is not None and dtype not in allowed:
        names = ", ".join(repr(d) for d in allowed)
        fail(op, f"argument 'dtype' must be one of {names}, got {dtype!r}", FusionDtypeError)
    return dtype


def _domain(op: str, shape: Any) -> list[IterDomain]:
    entries = check_shape_arg(op, shape)
    domain = []
    for i, s in enumerate(entries):
        ext = extent_of(s)
        if ext is not None and ext < 0:
            fail(op, f"argument 'shape'[{i}]={ext} is negative")
        domain.append(IterDomain.broadcast() if ext == 1 else IterDomain.iteration(ext))
    return domain


def _check_scalar_arg(op: str, x: Any, argname: str, *, allow_complex: bool = True) -> None:
    if not (isinstance(x, Scalar) or is_number(x)):
        fail(op, f"argument '{argname}' must be a number or a scalar, got {type(x).__name__}", FusionDtypeError)
    if not allow_complex and is_complex(operand_dtype(x)):
        fail(op, f"argument '{argname}' must be real, got {operand_dtype(x)!r}", FusionDtypeError)


def _check_int_arg(op: str, x: Any, argname: str) -> None:
    if isinstance(x, Scalar):
        if not is_integral(x.dtype):
            fail(op, f"argument '{argname}' must be an Int scalar, got {x.dtype!r}", FusionDtypeError)
    elif isinstance(x, bool) or not isinstance(x, numbers.Integral):
        fail(op, f"argument '{argname}' must be an int or an Int scalar, got {x!r}", FusionDtypeError)


def _shape(shape) -> tuple:
    # Run-time shape: a resolved Vector is a list, a list of Int scalars a list of ints.
    return tuple(int(s) for s in shape)


# --------------------------------------------------------------------------------------------------------------
# full


def _full_eval(node, shape, fill_value, dtype):
    return torch.full(_shape(shape), fill_value, dtype=to_torch_dtype(dtype), device=_device())


@register("full", OpKind.FACTORY, _full_eval)
def full(shape, fill_value, dtype: DataType):
    """fd.ops.full(shape, fill_value, dtype): torch.full; ``fill_value`` (a number or scalar) is converted to
    ``dtype``."""
    op = "full"
    dtype = _check_dtype(op, dtype)
    domain = _domain(op, shape)
    _check_scalar_arg(op, fill_value, "fill_value", allow_complex=is_complex(dtype))
    fusion = fusion_of(op, shape, fill_value)
    return OpResult([new_tensor(fusion, domain, dtype)], (shape, fill_value, dtype))


# --------------------------------------------------------------------------------------------------------------
# iota


def _iota_eval(node, length, start=None, step=None, dtype=DataType.Int):
    # start + i * step, computed in the dtype (Float for Half/BFloat16) and then cast.
    compute = to_torch_dtype(compute_dtype(dtype))
    start = 0 if start is None else start
    step = 1 if step is None else step
    values = torch.arange(int(length), dtype=compute, device=_device()) * step + start
    return values.to(to_torch_dtype(dtype))


@register("iota", OpKind.FACTORY, _iota_eval)
def iota(length, start=None, step=None, dtype: DataType = DataType.Int):
    """fd.ops.iota(length, start=None, step=None, dtype=Int): the 1-D tensor ``start + i * step`` for
    ``i < length``. start/step default to 0/1 and must be integers for an integer dtype and floats for a
    floating dtype (nvFuser's rule)."""
    op = "iota"
    dtype = _check_dtype(op, dtype, _IOTA_DTYPES)
    _check_int_arg(op, length, "length")
    n = extent_of(length)
    if n is not None and n < 0:
        fail(op, f"argument 'length'={n} is negative")
    for name, x in (("start", start), ("step", step)):
        if x is None:
            continue
        _check_scalar_arg(op, x, name)
        xdt = operand_dtype(x)
        if is_integral(xdt) != is_integral(dtype) or is_floating(xdt) != is_floating(dtype):
            fail(op, f"argument '{name}' must match dtype {dtype!r} (integer vs floating), got {xdt!r}",
                 FusionDtypeError)
        value = x.value if isinstance(x, Scalar) else x
        if isinstance(value, float) and not math.isfinite(value):
            fail(op, f"argument '{name}' must be finite, got {value!r}")
    step_value = step.value if isinstance(step, Scalar) else step
    if step_value is not None and step_value == 0:
        fail(op, "argument 'step' must not be zero")
    domain = [IterDomain.broadcast() if n == 1 else IterDomain.iteration(n)]
    fusion = fusion_of(op, length, start, step)
    kwargs = {}
    if start is not None:
        kwargs["start"] = start
    if step is not None:
        kwargs["step"] = step
    if dtype is not DataType.Int:
        kwargs["dtype"] = dtype
    return OpResult([new_tensor(fusion, domain, dtype)], (length,), kwargs)


# --------------------------------------------------------------------------------------------------------------
# uniform, normal


def _mix_seed(seed: int, offset: int) -> int:
    """A 64-bit generator seed from (seed, offset): splitmix64's finalizer over the pair, so neighbouring
    offsets (consecutive calls of a training loop) give unrelated streams."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(offset)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _random(draw, shape, a, b, rng_seed, rng_offset, dtype):
    """``draw(shape, generator, dtype, device) * b + a`` computed in Float (Double for Double), then cast."""
    device = _device()
    tdt = to_torch_dtype(dtype)
    if device.type == "meta":
        return torch.empty(_shape(shape), dtype=tdt, device="meta")
    generator: Optional[torch.Generator] = None
    if rng_seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(_mix_seed(rng_seed, rng_offset))
    compute = to_torch_dtype(compute_dtype(dtype))
    values = draw(_shape(shape), generator=generator, dtype=compute, device=device)
    return (values * b + a).to(tdt)


def _uniform_eval(node, minval, maxval, shape, rng_seed=None, rng_offset=None, dtype=DataType.Float):
    values = _random(torch.rand, shape, minval, maxval - minval, rng_seed, rng_offset, dtype)
    # The range is [minval, maxval) in the result's dtype: a draw that rounds to maxval there (common in Half and
    # BFloat16, whose last value below 1.0 is 1 - 2**-9) becomes minval, as nvFuser's kernels do (its issue 1653).
    return values.masked_fill_(values == maxval, minval)


def _normal_eval(node, mean, std, shape, rng_seed=None, rng_offset=None, dtype=DataType.Float):
    return _random(torch.randn, shape, mean, std, rng_seed, rng_offset, dtype)


def _random_build(op: str, a, b, names, shape, rng_seed, rng_offset, dtype) -> OpResult:
    dtype = _check_dtype(op, dtype, _RANDOM_DTYPES)
    domain = _domain(op, shape)
    _check_scalar_arg(op, a, names[0], allow_complex=False)
    _check_scalar_arg(op, b, names[1], allow_complex=False)
    if (rng_seed is None) != (rng_offset is None):
        fail(op, "arguments 'rng_seed' and 'rng_offset' must be given together")
    for name, x in (("rng_seed", rng_seed), ("rng_offset", rng_offset)):
        if x is not None:
            _check_int_arg(op, x, name)
            if (extent_of(x) or 0) < 0:
                fail(op, f"argument '{name}'={extent_of(x)} must not be negative")
    fusion = fusion_of(op, a, b, shape, rng_seed, rng_offset)
    kwargs = {}
    if rng_seed is not None:
        kwargs.update(rng_seed=rng_seed, rng_offset=rng_offset)
    if dtype is not DataType.Float:
        kwargs["dtype"] = dtype
    return OpResult([new_tensor(fusion, domain, dtype)], (a, b, shape), kwargs)


@register("uniform", OpKind.FACTORY, _uniform_eval)
def uniform(minval, maxval, shape, *, rng_seed=None, rng_offset=None, dtype: DataType = DataType.Float):
    """fd.ops.uniform(minval, maxval, shape, *, rng_seed=None, rng_offset=None, dtype=Float): values drawn
    uniformly from [minval, maxval)."""
    return _random_build("uniform", minval, maxval, ("minval", "maxval"), shape, rng_seed, rng_offset, dtype)


@register("normal", OpKind.FACTORY, _normal_eval)
def normal(mean, std, shape, *, rng_seed=None, rng_offset=None, dtype: DataType = DataType.Float):
    """fd.ops.normal(mean, std, shape, *, rng_seed=None, rng_offset=None, dtype=Float): normally distributed
    values with the given mean and standard deviation."""
    return _random_build("normal", mean, std, ("mean", "std"), shape, rng_seed, rng_offset, dtype)

