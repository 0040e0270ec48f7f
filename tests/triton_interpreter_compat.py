"""TEST SETUP ONLY: make Triton's CPU interpreter compute what the GPU computes.

Used only when kernels run under TRITON_INTERPRET=1 on a machine without a GPU; never imported by pyfuser and
never active on a GPU run. Measured gaps of triton 3.6's interpreter (../shared/notes/measured_facts.md):
- float<->float conversions truncate instead of rounding to nearest even, and fp8 out-of-range values are not
  saturated; here they go through torch (which rounds like the GPU), with the GPU's fp8 saturation;
- ``libdevice`` functions are stubs that return None; here they are computed with numpy/torch in the operand's
  precision.
"""

from __future__ import annotations

import numpy as np
import torch

_installed = False

_TORCH_OF = {
    "fp32": torch.float32,
    "fp64": torch.float64,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8e4nv": torch.float8_e4m3fn,
    "fp8e5": torch.float8_e5m2,
}
_SATURATE = {"fp8e4nv": 448.0, "fp8e5": 57344.0}


def _torch_convert(input, input_dtype, output_dtype, rounding_mode):
    src = _TORCH_OF[input_dtype.name]
    dst = _TORCH_OF[output_dtype.name]
    bits = torch.from_numpy(np.ascontiguousarray(input).view(getattr(np, f"uint{input_dtype.primitive_bitwidth}")).astype(np.int64))
    t = _from_bits(bits, src, input_dtype.primitive_bitwidth).to(torch.float64 if src == torch.float64 else torch.float32)
    if output_dtype.name in _SATURATE:  # the GPU's cvt.rn.satfinite
        lim = _SATURATE[output_dtype.name]
        t = torch.where(torch.isnan(t), t, t.clamp(-lim, lim))
    out = t.to(dst)
    width = output_dtype.primitive_bitwidth
    raw = out.view({8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]).numpy()
    return raw.view(getattr(np, f"uint{width}"))


def _from_bits(bits: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    storage = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return bits.to(storage).view(dtype)


def _libdevice_unary(np_fn):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def f(x, *rest, **kw):
        args = [x] + list(rest)
        datas = [a.handle.data if hasattr(a, "handle") else np.asarray(a) for a in args]
        res = np_fn(*datas)
        dtype = x.handle.dtype.scalar if hasattr(x.handle.dtype, "scalar") else x.handle.dtype
        res = np.asarray(res)
        if res.dtype == np.bool_:
            return tl.tensor(TensorHandle(res, tl.int1), x.type.with_element_ty(tl.int1) if x.type.is_block() else tl.int1)
        return tl.tensor(TensorHandle(res.astype(x.handle.data.dtype), dtype), x.type)

    return f


def _torch_fn(fn):
    def g(*arrays):
        ts = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        return fn(*ts).numpy()

    return g


def install() -> None:
    global _installed
    if _installed:
        return
    import triton.runtime.interpreter as interp
    from triton.language.extra import libdevice

    interp._convert_float = _torch_convert
    table = {
        "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
        "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh,
        "tanh": np.tanh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
        "acosh": np.arccosh, "atanh": np.arctanh, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
        "ceil": np.ceil, "floor": np.floor, "trunc": np.trunc, "rint": np.rint, "fmod": np.fmod,
        "pow": np.power, "atan2": np.arctan2, "nextafter": np.nextafter, "signbit": np.signbit,
        "erf": _torch_fn(torch.erf), "erfc": _torch_fn(torch.erfc), "erfinv": _torch_fn(torch.erfinv),
        "erfcinv": _torch_fn(lambda x: torch.erfinv(1 - x)), "lgamma": _torch_fn(torch.lgamma),
        "div_rn": np.divide, "isnan": np.isnan, "isinf": np.isinf,
    }
    for name, fn in table.items():
        setattr(libdevice, name, _libdevice_unary(fn))
    _installed = True
