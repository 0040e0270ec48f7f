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


def _np_to_torch(data: np.ndarray, tl_type) -> torch.Tensor:
    if tl_type.name in _TORCH_OF:  # floats live as their bit patterns for bf16/fp8: go through the bits
        width = tl_type.primitive_bitwidth
        bits = np.ascontiguousarray(data).view(getattr(np, f"uint{width}")).astype(np.int64)
        return _from_bits(torch.from_numpy(bits), _TORCH_OF[tl_type.name], width)
    return torch.from_numpy(np.ascontiguousarray(data))


def _torch_to_np(t: torch.Tensor, tl_type) -> np.ndarray:
    if tl_type.name in _TORCH_OF:
        width = tl_type.primitive_bitwidth
        raw = t.view({8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]).numpy()
        return raw.view(getattr(np, f"uint{width}")).view(_np_float(width, tl_type))
    return t.numpy()


def _np_float(width, tl_type):
    # The interpreter keeps fp32/fp64 as numpy floats and narrower floats as raw unsigned bits.
    return {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}.get(tl_type.name, getattr(np, f"uint{width}"))


_TORCH_INT = {"int1": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
              "int64": torch.int64, "uint8": torch.uint8}


def _cast_impl_through_torch(original):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if src.data.dtype == np.bool_:  # comparison results keep their operands' handle dtype: trust the data
            s = tl.int1
        if (s.name in _TORCH_OF or d.name in _TORCH_OF) and (s.name in _TORCH_OF or s.name in _TORCH_INT) and (
            d.name in _TORCH_OF or d.name in _TORCH_INT
        ):
            t = _np_to_torch(src.data, s)
            if d.name in _SATURATE:
                lim = _SATURATE[d.name]
                t = t.float()
                t = torch.where(torch.isnan(t), t, t.clamp(-lim, lim))
            out = t.to(_TORCH_OF.get(d.name) or _TORCH_INT[d.name])
            return TensorHandle(_torch_to_np(out, d), d)
        return original(self, src, dst_type)

    return cast_impl


def _from_bits(bits: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    storage = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return bits.to(storage).view(dtype)


def _libdevice_unary(np_fn):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def f(*args, **kw):
        # Operands may be tensors or plain Python numbers (e.g. libdevice.div_rn(1.0, x)).
        ref = next(a for a in args if hasattr(a, "handle"))
        np_dtype = ref.handle.data.dtype
        datas = [a.handle.data if hasattr(a, "handle") else np.asarray(a, dtype=np_dtype) for a in args]
        res = np.asarray(np_fn(*datas))
        shape_ty = next((a.type for a in args if hasattr(a, "handle") and a.type.is_block()), ref.type)
        if res.dtype == np.bool_:
            ty = shape_ty.with_element_ty(tl.int1) if shape_ty.is_block() else tl.int1
            return tl.tensor(TensorHandle(res, tl.int1), ty)
        scalar = ref.handle.dtype.scalar if hasattr(ref.handle.dtype, "scalar") else ref.handle.dtype
        return tl.tensor(TensorHandle(res.astype(np_dtype), scalar), shape_ty)

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
    builder = interp.InterpreterBuilder
    builder.cast_impl = _cast_impl_through_torch(builder.cast_impl)
    if not hasattr(builder, "get_bf16"):  # bf16 constants (tl.full(..., tl.bfloat16)) are missing
        import triton.language as tl

        def get_bf16(self, value):
            bits = torch.tensor([value], dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interp.TensorHandle(bits, tl.bfloat16)

        builder.get_bf16 = get_bf16
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
