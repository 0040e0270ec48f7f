"""Triton lowerings of the elementwise ops, attached to the registry by name.

Each op's formula is written over its cast operands, mirroring the ATen evaluator in ``pyfuser/ops/elementwise.py``
(same casts, same order of operations; IEEE division and libdevice math, as ATen's CUDA kernels use). Ops missing
here (random draws, complex, gcd, logical_right_shift, isreal, integer pow) run on ATen.
"""

from __future__ import annotations

from ..ops.registry import attach
from .lowering import cast_lowering, elementwise as _triton

_LD = "libdevice.{}({{0}})"
_TRITON = {
    **{n: _triton(None, _LD.format(n)) for n in (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "exp", "exp2", "expm1", "erf", "erfc",
        "erfinv", "erfcinv", "lgamma", "log", "log10", "log1p", "log2", "rsqrt", "sin", "sinh", "sqrt", "tan",
        "tanh")},
    # libdevice wants both operands in one dtype: a bare 1.0 would be fp32 against a Double operand.
    "reciprocal": _triton(None, "libdevice.div_rn(tl.full([], 1.0, {0}.dtype), {0})"),
    "sigmoid": _triton(None, "libdevice.div_rn(tl.full([], 1.0, {0}.dtype), 1.0 + libdevice.exp(-{0}))"),
    "neg": _triton("-{0}"),
    "abs": _triton("tl.abs({0})"),
    "sign": _triton("tl.where({0} > 0, 1, tl.where({0} < 0, -1, {0}))"),
    "relu": _triton("tl.where({0} < 0, 0, {0})"),
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
    # Integer div truncates; Triton's // on signed integers is C division, as is its %.
    "div": _triton("{0} // {1}", "libdevice.div_rn({0}, {1})"),
    "truediv": _triton(None, "libdevice.div_rn({0}, {1})"),
    "atan2": _triton(None, "libdevice.atan2({0}, {1})"),
    "fmod": _triton("{0} % {1}"),
    "mod": _triton("{0} % {1}"),
    "remainder": _triton("_remainder({0}, {1})"),
    "pow": _triton(None, "libdevice.pow({0}, {1})"),
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


for _name, _lower in _TRITON.items():
    attach(_name, lower=_lower)
attach("cast", lower=cast_lowering)
