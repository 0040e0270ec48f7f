"""Make Triton's CPU interpreter (``TRITON_INTERPRET=1``) compute what a GPU computes.

Without a GPU, pyfuser's generated and hand-written Triton kernels run under Triton's interpreter, which
evaluates them with numpy. triton 3.6's interpreter has gaps that make a kernel fail or give other numbers than
the same kernel on a GPU; ``install()`` closes them by patching the interpreter (never Triton's compiler):

- ``libdevice`` functions (exp, tanh, erf, rsqrt, div_rn, fmod, ...) are stubs returning None: every kernel
  calling one fails with ``InterpreterError``. Here each is computed with numpy or torch in the operand's dtype.
- float-to-float conversions (``x.to(tl.bfloat16)``, fp8) truncate instead of rounding to nearest even, and fp8
  conversions do not saturate; here they go through torch, which rounds like the GPU, with the GPU's
  saturation of fp8 (``cvt.rn.satfinite``).
- bf16 constants (``tl.full(..., tl.bfloat16)``) are missing from the interpreter's builder.
- ``tl.dot`` of bf16 operands multiplies their raw 16-bit patterns; here they are widened to fp32 first (the
  GPU's bf16 products are exact in its fp32 accumulator).
- ``tl.maximum``/``tl.minimum`` of +0.0 and -0.0 return whichever operand numpy picks; the GPU's max/min order
  the zeros (max gives +0.0, min -0.0), as ATen's CUDA kernels do.
- ``tl.reduce`` with a combine function (NaN-propagating max/min, products, the argmax pairs of top-k) calls the
  function once per element on 0-dim tensors: a row of 8192 costs 8191 Python calls. Here it combines whole
  slices in a binary tree (adjacent pairs, the left operand first, as on the GPU), log2(n) calls per reduction.

``install()`` does nothing unless ``TRITON_INTERPRET=1`` is set (Triton decides at kernel creation whether to
interpret), so a GPU run is never changed; calling it again does nothing. ``pyfuser.codegen`` calls it on import.
"""

from __future__ import annotations

import os
import threading

_installed = False
_lock = threading.Lock()

_TORCH_FLOAT = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16",
                "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"}
_TORCH_INT = {"int1": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
              "uint8": "uint8"}
_SATURATE = {"fp8e4nv": 448.0, "fp8e5": 57344.0}  # largest finite values: the GPU's conversions clamp to them
_STORAGE_OF_WIDTH = {8: "uint8", 16: "int16", 32: "int32", 64: "int64"}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def install() -> None:
    """Patch triton's interpreter (only when ``TRITON_INTERPRET=1``); idempotent."""
    global _installed
    if _installed or not interpreting():
        return
    with _lock:
        if _installed:
            return
        _patch()
        _installed = True


# --- implementation (imports numpy and triton's interpreter only when interpreting) ---------------------------


def _patch() -> None:
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton.language.extra import libdevice

    def storage(width):
        return getattr(torch, _STORAGE_OF_WIDTH[width])

    def from_bits(data: np.ndarray, type_name: str, width: int) -> torch.Tensor:
        """The interpreter keeps fp32/fp64/fp16 as numpy floats and bf16/fp8 as raw unsigned bits: go through
        the bits, which every case has."""
        bits = np.ascontiguousarray(data).view(getattr(np, f"uint{width}")).astype(np.int64)
        return torch.from_numpy(bits).to(storage(width)).view(getattr(torch, _TORCH_FLOAT[type_name]))

    def to_bits(t: torch.Tensor, type_name: str, width: int) -> np.ndarray:
        raw = t.contiguous().view(storage(width)).numpy().view(getattr(np, f"uint{width}"))
        as_float = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}.get(type_name)
        return raw.view(as_float) if as_float is not None else raw

    def saturate(t: torch.Tensor, type_name: str) -> torch.Tensor:
        if type_name not in _SATURATE:
            return t
        lim = _SATURATE[type_name]
        t = t.float()
        return torch.where(torch.isnan(t), t, t.clamp(-lim, lim))

    # float <-> float conversions through torch (round to nearest even, fp8 saturation)
    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        t = from_bits(input, input_dtype.name, input_dtype.primitive_bitwidth)
        t = saturate(t.to(torch.float64 if t.dtype == torch.float64 else torch.float32), output_dtype.name)
        out = t.to(getattr(torch, _TORCH_FLOAT[output_dtype.name]))
        width = output_dtype.primitive_bitwidth
        return out.contiguous().view(storage(width)).numpy().view(getattr(np, f"uint{width}"))

    interp._convert_float = convert_float

    original_cast = interp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        # Comparison results keep their operands' handle dtype, and so does a where() over them (its data then
        # holds the Bool values as integers): trust the data. (A Float handle over integer data would otherwise
        # be read as Float bits: where(cmp, bool, cmp).to(float32) gave 1.4e-45 for True; fuzz seed 41846.)
        if src.data.dtype == np.bool_:
            s = tl.int1
        elif s.name in ("fp32", "fp64") and src.data.dtype.kind == "i":
            s = getattr(tl, src.data.dtype.name)
        known = lambda n: n in _TORCH_FLOAT or n in _TORCH_INT  # noqa: E731
        if (s.name in _TORCH_FLOAT or d.name in _TORCH_FLOAT) and known(s.name) and known(d.name):
            if s.name in _TORCH_FLOAT:
                t = from_bits(src.data, s.name, s.primitive_bitwidth)
            else:
                t = torch.from_numpy(np.ascontiguousarray(src.data))
            t = saturate(t, d.name)
            if d.name in _TORCH_FLOAT:
                out = to_bits(t.to(getattr(torch, _TORCH_FLOAT[d.name])), d.name, d.primitive_bitwidth)
            else:
                out = t.to(getattr(torch, _TORCH_INT[d.name])).numpy()
            return interp.TensorHandle(out, d)
        return original_cast(self, src, dst_type)

    interp.InterpreterBuilder.cast_impl = cast_impl

    # Splatting a 0-dim comparison result (x != 0 of a by-value Float argument) converted its Bool data to the
    # handle's dtype (its operands', Float), so `&` with a Bool block then failed in numpy: keep it Bool.
    original_splat = interp.InterpreterBuilder.create_splat

    def create_splat(self, ret_ty, arg):
        if getattr(arg.data, "dtype", None) == np.bool_:
            value = arg.data[0] if isinstance(arg.dtype, tl.block_type) else arg.data
            return interp.TensorHandle(np.full(ret_ty.shape, value, dtype=np.bool_), tl.int1)
        return original_splat(self, ret_ty, arg)

    interp.InterpreterBuilder.create_splat = create_splat

    if not hasattr(interp.InterpreterBuilder, "get_bf16"):
        def get_bf16(self, value):
            bits = torch.tensor([value], dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interp.TensorHandle(bits, tl.bfloat16)

        interp.InterpreterBuilder.get_bf16 = get_bf16

    # tl.dot of bf16: widen the raw bit patterns to fp32 values first
    original_dot = interp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if "bf16" in (a.dtype.name, b.dtype.name):
            def widen(h):
                if h.dtype.name != "bf16":
                    return h.data.astype(np.float32)
                return (h.data.astype(np.uint32) << 16).view(np.float32)

            out = np.matmul(widen(a), widen(b), dtype=np.float32).astype(d.data.dtype) + d.data
            return interp.TensorHandle(out, d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot

    # max/min of two zeros as the GPU orders them
    def zero_ordered(np_fn, pick_signed: bool):
        def fn(a, b):
            r = np_fn(a, b)
            if not np.issubdtype(np.result_type(a, b), np.floating):
                return r
            zeros = (a == 0) & (b == 0)
            if not np.any(zeros):
                return r
            a_neg = np.signbit(a)
            return np.where(zeros, np.where(a_neg == pick_signed, a, b), r)

        return fn

    builder = interp.InterpreterBuilder
    builder.create_maximumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, zero_ordered(np.maximum, False))
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, zero_ordered(np.fmax, False))
    builder.create_minimumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, zero_ordered(np.minimum, True))
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, zero_ordered(np.fmin, True))

    # tl.reduce with a combine function: a tree over whole slices instead of a Python call per element
    reduce_ops = interp.ReduceOps

    def tree_reduce(self, raw_input):
        original_axis = self.axis
        input, axis = self.unravel(raw_input, self.axis)
        dtypes = [a.dtype for a in input]
        parts = [np.moveaxis(a.handle.data, axis, 0) for a in input]
        n = parts[0].shape[0]
        if n == 0:
            return original_generic_reduce(self, raw_input)
        while n > 1:
            half = n // 2
            left = [self.to_tensor(np.ascontiguousarray(p[0:2 * half:2]), dt) for p, dt in zip(parts, dtypes)]
            right = [self.to_tensor(np.ascontiguousarray(p[1:2 * half:2]), dt) for p, dt in zip(parts, dtypes)]
            ret = self.combine_fn.fn(*left, *right)
            ret = ret if isinstance(ret, tuple) else (ret,)
            merged = [np.broadcast_to(np.asarray(r.handle.data if hasattr(r, "handle") else r, dtype=p.dtype),
                                      p[0:half].shape) for r, p in zip(ret, parts)]
            if n % 2:  # the odd last element joins the next round, still last
                merged = [np.concatenate([m, p[n - 1:n]]) for m, p in zip(merged, parts)]
            parts, n = merged, half + n % 2
        ret = []
        for data, dt in zip(parts, dtypes):
            data = data[0]
            if self.keep_dims:
                if original_axis is not None:
                    data = np.expand_dims(data, axis)
                else:
                    data = np.reshape(data, (1,) * input[0].handle.data.ndim)
            elif original_axis is None:
                data = data.item()
            ret.append(self.to_tensor(data, dt))
        return ret

    original_generic_reduce = reduce_ops.generic_reduce
    reduce_ops.generic_reduce = tree_reduce

    # libdevice
    def torch_fn(fn):
        def g(*arrays):
            return fn(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]).numpy()

        return g

    def libdevice_fn(np_fn):
        def f(*args, **kw):
            # Operands may be tensors or plain Python numbers (e.g. libdevice.div_rn(1.0, x)).
            ref = next(a for a in args if hasattr(a, "handle"))
            np_dtype = ref.handle.data.dtype
            datas = [a.handle.data if hasattr(a, "handle") else np.asarray(a, dtype=np_dtype) for a in args]
            with np.errstate(all="ignore"):  # NaN/inf results are values here, as on the GPU
                res = np.asarray(np_fn(*datas))
            shape_ty = next((a.type for a in args if hasattr(a, "handle") and a.type.is_block()), ref.type)
            if res.dtype == np.bool_:
                ty = shape_ty.with_element_ty(tl.int1) if shape_ty.is_block() else tl.int1
                return tl.tensor(interp.TensorHandle(res, tl.int1), ty)
            scalar = ref.handle.dtype.scalar if hasattr(ref.handle.dtype, "scalar") else ref.handle.dtype
            return tl.tensor(interp.TensorHandle(res.astype(np_dtype), scalar), shape_ty)

        return f

    table = {
        "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
        "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh,
        "tanh": np.tanh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
        "acosh": np.arccosh, "atanh": np.arctanh, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
        "ceil": np.ceil, "floor": np.floor, "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint,
        "fmod": np.fmod, "pow": np.power, "atan2": np.arctan2, "nextafter": np.nextafter,
        "signbit": np.signbit, "copysign": np.copysign,
        "erf": torch_fn(torch.erf), "erfc": torch_fn(torch.erfc), "erfinv": torch_fn(torch.erfinv),
        "erfcinv": torch_fn(lambda x: torch.erfinv(1 - x)), "lgamma": torch_fn(torch.lgamma),
        "div_rn": np.divide, "isnan": np.isnan, "isinf": np.isinf,
    }
    for name, fn in table.items():
        setattr(libdevice, name, libdevice_fn(fn))
