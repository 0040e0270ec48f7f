"""Binding execute() arguments to fusion inputs, with errors that name the input position.

Checked: number of inputs, Python type, dtype, rank, device, static extents, broadcast dims and strides against
the declared contiguity and stride order. Executors validate once per input signature; a signature hit skips it.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

import torch

from ..errors import InputDeviceError, InputTypeError, InputValidationError
from ..ir.dtypes import COMPLEX, INTEGRAL, DataType, c_type_name, from_torch_dtype, to_torch_dtype
from ..ir.fusion import Fusion
from ..ir.packing import is_packed_fp4, packed_dim, unpacked
from ..ir.nodes import Scalar, TensorView


def flatten_inputs(inputs: Sequence[Any], expected: Optional[Sequence[Any]] = None) -> list:
    """A list or tuple inside ``inputs`` is flattened where the definition expects scalars (how define_vector(n)
    receives its values); anywhere else it is an error naming the input it stands for."""
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
        raise InputTypeError(f"execute() takes a list of inputs, got {type(inputs).__name__}")
    if isinstance(inputs, list) and not any(isinstance(x, (list, tuple)) for x in inputs):
        return inputs  # nothing to flatten: the common case on every cached call
    flat: list = []
    for x in inputs:
        if isinstance(x, (list, tuple)) and expected is None:
            flat.extend(x)
        elif isinstance(x, (list, tuple)):
            pos = len(flat)
            if pos >= len(expected) or not isinstance(expected[pos], Scalar) or \
                    not all(isinstance(e, Scalar) for e in expected[pos:pos + len(x)]):
                what = f"input {pos} ({expected[pos].name})" if pos < len(expected) else f"input {pos}"
                raise InputTypeError(f"{what}: a nested {type(x).__name__} of {len(x)} values stands only for "
                                     f"define_vector scalars, but the definition expects "
                                     f"{'a tensor there' if pos < len(expected) else 'no more inputs'}")
            flat.extend(x)
        else:
            flat.append(x)
    return flat


def _cpp_value(x: Any) -> str:
    """A Python scalar as nvFuser's messages print it (C++ stream defaults: 2.0 -> 2, a complex as (re,im))."""
    if isinstance(x, numbers.Integral):  # (bool too: C++ prints true as 1)
        return str(int(x))
    if isinstance(x, numbers.Real):
        return format(float(x), "g")
    if isinstance(x, numbers.Complex):
        return f"({format(x.real, 'g')},{format(x.imag, 'g')})"
    return repr(x)


def _tensor_c_type(x: torch.Tensor) -> str:
    try:
        return c_type_name(from_torch_dtype(x.dtype))
    except TypeError:  # (a torch dtype without a DataType)
        return str(x.dtype)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {list(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"


class InputBinder:
    def __init__(self, fusion: Fusion):
        self.fusion = fusion

    def bind(self, inputs: Sequence[Any], device: Optional[torch.device] = None) -> list:
        flat = flatten_inputs(inputs, self.fusion.inputs)
        self.validate(flat, device)
        return flat

    def validate(self, flat: Sequence[Any], device=None) -> None:
        expected = self.fusion.inputs
        if len(flat) != len(expected):
            raise InputValidationError(
                f"execute() expected {len(expected)} inputs ({', '.join(v.name for v in expected)}), got {len(flat)}"
            )
        common_device = None if device is None else torch.device(device)
        for pos, (v, x) in enumerate(zip(expected, flat)):
            if isinstance(v, TensorView):
                self._check_tensor(pos, v, x)
                if not v.is_cpu:
                    dev = x.device
                    if common_device is None:
                        common_device = dev
                    elif not _same_device(dev, common_device):
                        raise InputDeviceError(
                            f"input {pos} ({v.name}) is on {dev}, but the fusion runs on {common_device}"
                        )
            else:
                self._check_scalar(pos, v, x)

    def _check_scalar(self, pos: int, v: Scalar, x: Any) -> None:
        dt = v.dtype
        if isinstance(x, torch.Tensor):
            # (nvFuser's sentences for the same checks close our messages: code written for it matches on them)
            raise InputTypeError(f"input {pos} ({v.name}) must be a {dt!r} scalar, got {_describe(x)} (Expected "
                                 f"input {pos}, {v.name}, to be a scalar but got {_tensor_c_type(x)} tensor of rank "
                                 f"{x.dim()})")
        if dt is DataType.Bool:
            ok = isinstance(x, bool)
        elif dt in INTEGRAL:
            ok = isinstance(x, numbers.Integral) and not isinstance(x, bool)
        elif dt in COMPLEX:
            ok = isinstance(x, numbers.Complex) and not isinstance(x, bool)
        else:
            ok = isinstance(x, numbers.Real) and not isinstance(x, bool)
        if not ok:
            nvf = (f" (Scalar value {_cpp_value(x)} is not compatible with the expected data type: "
                   f"{c_type_name(dt)}.)" if isinstance(x, numbers.Number) else "")
            raise InputTypeError(f"input {pos} ({v.name}) must be a {dt!r} scalar, got {_describe(x)}{nvf}")
        if dt in _INT_RANGES:
            # Out-of-range ints would otherwise fail (or wrap) deep inside an op at run time.
            lo, hi = _INT_RANGES[dt]
            if not lo <= x <= hi:
                raise InputValidationError(f"input {pos} ({v.name}) must be a {dt!r} scalar in [{lo}, {hi}], got {x}")

    def _check_tensor(self, pos: int, tv: TensorView, x: Any) -> None:
        name = f"input {pos} ({tv.name})"
        if not isinstance(x, torch.Tensor):
            nvf = (f" (Expected input {pos}, {tv.name}, to be an at::Tensor but got scalar {_cpp_value(x)})"
                   if isinstance(x, numbers.Number) else "")
            raise InputTypeError(f"{name} must be a tensor, got {_describe(x)}{nvf}")
        expected_dtype = to_torch_dtype(tv.dtype)
        if x.dtype != expected_dtype:
            raise InputTypeError(f"{name} must have dtype {expected_dtype} ({tv.dtype!r}), got {x.dtype} (Expected "
                                 f"input {pos}, {tv.name}, to be bound to a tensor of dtype {c_type_name(tv.dtype)}, "
                                 f"but got a tensor of dtype {_tensor_c_type(x)})")
        if x.dim() != tv.ndim:
            raise InputValidationError(f"{name} must have rank {tv.ndim}, got rank {x.dim()} (shape {list(x.shape)})")
        if tv.is_cpu and x.device.type != "cpu":
            raise InputDeviceError(
                f"{name} was defined with is_cpu=True and must be a CPU tensor, got one on {x.device}"
            )
        sizes, strides = x.shape, x.stride()
        if is_packed_fp4(tv) and x.dim() > 0:
            d = packed_dim(tv)
            if x.shape[d] > 1 and strides[d] != 1:
                raise InputValidationError(
                    f"{name} is packed Float4_e2m1fn: its packed dim {d} must have stride 1, "
                    f"got strides {list(strides)}"
                )
            sizes, strides = unpacked(tv, sizes, strides)
        for d, dom in enumerate(tv.logical):
            n = sizes[d]
            if dom.is_broadcast and not dom.expanded:
                if n != 1:
                    raise InputValidationError(f"{name} dim {d} is a broadcast dim and must have size 1, got {n}")
            elif dom.extent is not None and n != dom.extent:
                raise InputValidationError(f"{name} dim {d} must have static extent {dom.extent}, got {n}")
            if dom.expanded and n != 1 and strides[d] != 0:
                raise InputValidationError(
                    f"{name} dim {d} is an expanded broadcast and must have stride 0, got stride {strides[d]}"
                )
        if x.numel() > 0:
            self._check_strides(name, tv, sizes, strides)

    @staticmethod
    def _check_strides(name: str, tv: TensorView, sizes, strides) -> None:
        order = tv.alloc_order or tuple(range(len(tv.logical_domain)))
        expected = 1
        inner_dim = None  # the next inner non-broadcast dim of size > 1, for the stride-order check
        for pos in range(len(order) - 1, -1, -1):
            d = order[pos]
            dom = tv.logical_domain[d]
            if dom.is_broadcast or dom.is_reduction:
                continue
            n, st = sizes[d], strides[d]
            if n <= 1:
                continue
            if tv.contiguity[pos] and st != expected:
                raise InputValidationError(
                    f"{name} has strides {list(strides)} for sizes {list(sizes)}, which contradict the declared "
                    f"contiguity {list(tv.contiguity)} (stride_order {tv.stride_order()}): "
                    f"dim {d} must have stride {expected}"
                )
            if inner_dim is not None and st < strides[inner_dim]:
                raise InputValidationError(
                    f"{name} has strides {list(strides)}, which contradict the declared stride_order "
                    f"{tv.stride_order()}: dim {d} is outer to dim {inner_dim} but has a smaller stride"
                )
            expected = st * n
            inner_dim = d


_INT_RANGES = {
    DataType.Int: (-(2**63), 2**63 - 1),
    DataType.Index: (-(2**63), 2**63 - 1),
    DataType.Int32: (-(2**31), 2**31 - 1),
    DataType.UInt64: (0, 2**64 - 1),
}


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index == b.index or a.index is None or b.index is None
