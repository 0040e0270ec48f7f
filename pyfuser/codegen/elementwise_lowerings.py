"""Triton lowerings of the elementwise ops, attached to the registry by name.

Each op's formula is written over its cast operands, mirroring the ATen evaluator in ``pyfuser/ops/elementwise.py``
(same casts, same order of operations; IEEE division and libdevice math, as ATen's CUDA kernels use). Ops missing
here (random draws, complex, gcd, logical_right_shift, isreal, integer pow) run on ATen.
"""

from __future__ import annotations

import torch

from ..ops.registry import attach
from ..segment.loop_domain import NotFusable
from .interpreter_compat import interpreting
from .kernel_builder import KernelBuilder, KValue
from .lowering import _operand, cast_lowering, check_real, elementwise as _triton, out_dtype

_LD = "libdevice.{}({{0}})"
_TRITON = {
    **{n: _triton(None, _LD.format(n)) for n in (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "exp", "exp2", "expm1", "erf", "erfc",
        "erfinv", "erfcinv", "lgamma", "log", "log10", "log1p", "log2", "rsqrt", "sin", "sinh", "sqrt", "tan")},
    # libdevice wants both operands in one dtype: a bare 1.0 would be fp32 against a Double operand.
    "reciprocal": _triton(None, "libdevice.div_rn(tl.full([], 1.0, {0}.dtype), {0})"),
    "sigmoid": _triton(None, "libdevice.div_rn(tl.full([], 1.0, {0}.dtype), 1.0 + libdevice.exp(-{0}))"),
    # Triton's unary minus is 0 - x: -(+0.0) would be +0.0. A product with -1 flips the sign bit of every float
    # (zeros and infinities included); on integers 0 - x wraps INT_MIN to itself, as torch does.
    "neg": _triton("-{0}", "{0} * -1.0"),
    "abs": _triton("tl.abs({0})"),
    # torch's sign is (0 < x) - (x < 0): 0 for NaN, +0.0 for -0.0. Floats are written as that difference of
    # converted Bools: LLVM folds where(x < 0, -1, 0) converted to a float into a signed conversion of the i1,
    # which the NVPTX backend lowers to bf16 as +1 (H200, fuzz seed 917: sign of a bf16 input stored as bf16 was
    # +1 for negatives; the PTX read `selp.b32 1, 0` then `cvt.rn.bf16.s32`).
    "sign": _triton("tl.where({0} > 0, 1, tl.where({0} < 0, -1, 0)).to({0}.dtype)",
                    "({0} > 0).to({0}.dtype) - ({0} < 0).to({0}.dtype)"),
    # relu is clamp_min(x, 0): NaN stays, and (IEEE max, as on CUDA) relu(-0.0) is +0.0.
    "relu": _triton("tl.maximum({0}, 0)", "tl.where({0} != {0}, {0}, tl.maximum({0}, 0.0))"),
    "ceil": _triton("{0}", "libdevice.ceil({0})"),
    "floor": _triton("{0}", "libdevice.floor({0})"),
    "round": _triton("{0}", "libdevice.rint({0})"),
    "trunc": _triton("{0}", "libdevice.trunc({0})"),
    "frac": _triton(None, "{0} - libdevice.trunc({0})"),
    "silu": _triton(None, "libdevice.div_rn({0}, 1.0 + libdevice.exp(-{0}))"),
    "bitwise_not": _triton("~{0}"),
    "set": _triton("{0}", bool_ok=True),
    "segment_set": _triton("{0}", bool_ok=True),
    "isfinite": _triton("{0} == {0}", "tl.abs({0}) < float('inf')", result="bool", bool_ok=True),
    "isinf": _triton("{0} != {0}", "tl.abs({0}) == float('inf')", result="bool", bool_ok=True),
    "isnan": _triton("{0} != {0}", result="bool", bool_ok=True),
    "isneginf": _triton("{0} != {0}", "{0} == float('-inf')", result="bool", bool_ok=True),
    "isposinf": _triton("{0} != {0}", "{0} == float('inf')", result="bool", bool_ok=True),
    "signbit": _triton("{0} < 0", "libdevice.signbit({0}) != 0", result="bool", bool_ok=True),
    "logical_not": _triton("{0} == 0", result="bool", bool_ok=True),
    "real": _triton("{0}", bool_ok=True),
    "add": _triton("{0} + {1}"),
    "sub": _triton("{0} - {1}"),
    "mul": _triton("{0} * {1}"),
    "div": _triton(None, "libdevice.div_rn({0}, {1})"),
    "truediv": _triton(None, "libdevice.div_rn({0}, {1})"),
    "atan2": _triton(None, "libdevice.atan2({0}, {1})"),
    # libdevice's fmod is C's fmod, as ATen's: the result (a zero too) has the dividend's sign, and
    # fmod(inf, y) is NaN. Triton's float % is neither.
    "fmod": _triton(None, "libdevice.fmod({0}, {1})"),
    "mod": _triton(None, "libdevice.fmod({0}, {1})"),
    "remainder": _triton(None, "_remainder_adjust(libdevice.fmod({0}, {1}), {1})"),
    "nextafter": _triton(None, "libdevice.nextafter({0}, {1})"),
    "minimum": _triton("_min_nan({0}, {1})"),
    "maximum": _triton("_max_nan({0}, {1})"),
    "eq": _triton("{0} == {1}", result="bool", bool_ok=True),
    "ne": _triton("{0} != {1}", result="bool", bool_ok=True),
    "ge": _triton("{0} >= {1}", result="bool", bool_ok=True),
    "gt": _triton("{0} > {1}", result="bool", bool_ok=True),
    "le": _triton("{0} <= {1}", result="bool", bool_ok=True),
    "lt": _triton("{0} < {1}", result="bool", bool_ok=True),
    "logical_and": _triton("{0} & {1}", result="bool", bool_ok=True),
    "logical_or": _triton("{0} | {1}", result="bool", bool_ok=True),
    "bitwise_and": _triton("{0} & {1}", bool_ok=True),
    "bitwise_or": _triton("{0} | {1}", bool_ok=True),
    "bitwise_xor": _triton("{0} ^ {1}", bool_ok=True),
    "bitwise_left_shift": _triton("{0} << {1}"),
    "bitwise_right_shift": _triton("{0} >> {1}"),
    "where": _triton("tl.where({0}, {1}, {2})", bool_ok=True),
    # torch's lerp: start + w*(end-start) for |w| < 0.5, else end - (end-start)*(1-w) (exact at w = 1).
    "lerp": _triton(None, "tl.where(tl.abs({2}) < 0.5, {0} + {2} * ({1} - {0}), {1} - ({1} - {0}) * (1 - {2}))"),
    "clamp": _triton("_min_nan(_max_nan({0}, {1}), {2})"),
    "threshold": _triton("tl.where({0} <= {1}, {2}, {0})"),
    "addcmul": _triton("{0} + {3} * {1} * {2}"),
}




def _integer_division(name: str, float_lower, int_template: str):
    """div/fmod/remainder: floats through ``float_lower``; integers only by a non-zero constant divisor.

    Eager integer division by zero raises on CPU (ZeroDivisionError) and returns device-specific values on CUDA,
    and a kernel can do neither: with a tensor (or run-time scalar) divisor the op runs on ATen, which is eager.
    A divisor of -1 is written out: C division of INT_MIN by -1 is undefined (it traps on x86), torch wraps it
    (INT_MIN // -1 == INT_MIN, INT_MIN % -1 == 0)."""

    def lower(node, kb: KernelBuilder, a, b):
        compute = (node.info.get("cast") or [None, None])[-1]
        if compute is None or compute.is_floating_point or compute.is_complex:
            return float_lower(node, kb, a, b)
        if isinstance(b, KValue) or not isinstance(b, (bool, int, float)):
            raise NotFusable(f"fd.ops.{name} with an integer divisor that is not a constant runs on ATen: a kernel "
                             "cannot raise on a zero divisor as eager does")
        if int(b) == 0:
            raise NotFusable(f"fd.ops.{name} by the integer constant 0 runs on ATen (eager raises)")
        template = ("0 - {0}" if name == "div" else "{0} * 0") if int(b) == -1 else int_template
        return _triton(template)(node, kb, a, b)

    return lower


for _name, _tpl in (("div", "{0} // {1}"), ("fmod", "{0} % {1}"), ("mod", "{0} % {1}"),
                    ("remainder", "_remainder_adjust({0} % {1}, {1})")):
    _TRITON[_name] = _integer_division(_name, _TRITON[_name], _tpl)



def _pow(node, kb: KernelBuilder, base, exponent):
    """Float pow computed in Double and rounded once. Measured on the H200 over 2^22 random pairs per input
    range: libdevice's Float powf differs from eager's CUDA pow in 37% of the results and from eager's CPU pow
    in 37%; Double rounded to Float in 6% and 2% (each eager pow is within about an ulp of the exact value, in
    different places; the Double form is correctly rounded nearly always). Double (and integer) pow unchanged."""
    check_real(node)
    casts = node.info.get("cast") or [None, None]
    b, e = (_operand(kb, a, c) for a, c in zip((base, exponent), casts))
    compute = e.dtype
    if not compute.is_floating_point:
        raise NotFusable(f"fd.ops.pow on {compute} has no Triton lowering")
    if compute == torch.float32:
        b, e = kb.cast(b, torch.float64), kb.cast(e, torch.float64)
    r = kb.op("libdevice.pow({0}, {1})", [b, e], b.dtype)
    return kb.cast(kb.cast(r, compute), out_dtype(node))


_TRITON["pow"] = _pow


def _tanh_template(compute: torch.dtype) -> str:
    """Float tanh on the GPU is the prelude's branch-free copy of libdevice's tanhf (same bits, fewer
    instructions where a warp's inputs straddle |x| = 0.6); Double and the interpreter use libdevice."""
    return "_tanh_f32({0})" if compute == torch.float32 and not interpreting() else _LD.format("tanh")


_TRITON["tanh"] = _triton(None, _tanh_template)

for _name, _lower in _TRITON.items():
    attach(_name, lower=_lower)
attach("cast", lower=cast_lowering)
