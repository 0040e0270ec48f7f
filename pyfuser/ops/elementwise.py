"""Elementwise ops: unary, binary, ternary and cast.

Dtype rules (frontend.md "Result dtypes"): arithmetic results promote like PyTorch and then widen Half, BF16,
FP8 and FP4 to Float; float unaries also turn integers into Float; relu/ceil/floor/round/trunc/frac/silu (and
abs/sign, as in nvFuser) keep the input dtype; comparisons and is* ops give Bool. Reduced-precision inputs are
always computed in Float.

Each op's evaluator upcasts its operands to the compute dtype recorded by the builder (``node.info["cast"]``),
runs the torch function and casts to the output dtype, which is exactly "run the op with ATen in Float".
"""

from __future__ import annotations

import math
import struct

import torch

from ..ir.dtypes import (
    DataType,
    compute_dtype,
    is_boolean,
    is_complex,
    is_floating,
    is_integral,
    promote,
    to_torch_dtype,
)
from ..ir.nodes import Scalar, TensorView
from ..ir.packing import is_packed_fp4, packed_dim, packed_shape, unpacked
from .common import (
    FusionDtypeError,
    broadcast_domain,
    check_operand,
    fail,
    fusion_of,
    new_scalar,
    new_tensor,
    operand_dtype,
)
from .registry import OpKind, OpResult, register


# --------------------------------------------------------------------------------------------------------------
# shared machinery


def _output(op: str, operands: list, dtype: DataType):
    """A tensor output broadcast over the tensor operands, or a Scalar when every operand is a scalar."""
    fusion = fusion_of(op, *operands)
    tensors = [x for x in operands if isinstance(x, TensorView)]
    if tensors:
        return new_tensor(fusion, broadcast_domain(op, tensors), dtype)
    return new_scalar(fusion, dtype)


def _promoted(operands: list) -> DataType:
    return promote(*[(operand_dtype(x), isinstance(x, TensorView)) for x in operands])


def _floatify(dt: DataType) -> DataType:
    """Integers and bools become Float, reduced floats become Float."""
    if is_integral(dt) or is_boolean(dt):
        return DataType.Float
    return compute_dtype(dt)


def _tdt(dt):
    return None if dt is None else to_torch_dtype(dt)


_SCALAR_OPERANDS: dict = {}


def _scalar_operand(value, dtype, device) -> torch.Tensor:
    """``value`` as a 0-dim tensor of the compute dtype on ``device``, made once per (value, dtype, device).

    A fresh ``torch.tensor`` per call would cost a host-to-device copy on every call on CUDA. The key uses the
    value's bits, so -0.0 and 0.0 (equal, with equal hashes) and True and 1 stay apart. Evaluators never write
    to their operands, so sharing the tensor is safe."""
    bits = struct.pack("<d", value) if type(value) is float else value
    key = (type(value), bits, dtype, device)
    t = _SCALAR_OPERANDS.get(key)
    if t is None:
        if len(_SCALAR_OPERANDS) > 4096:
            _SCALAR_OPERANDS.clear()
        t = _SCALAR_OPERANDS[key] = torch.tensor(value, dtype=dtype, device=device)
    return t


def _elementwise_eval(fn, int_div_fn=None):
    """Evaluator: cast operands as the builder recorded, apply ``fn`` (``int_div_fn`` where the builder marked the
    node ``int_div``), cast to the output dtype."""

    def evaluate(node, *args):
        # What the node fixes is derived once and kept on it (this runs on every call of an ATen step): the
        # function, the casts, the output dtype, and whether the result is made contiguous (ops/reduction.py: a
        # sum/prod over expanded dims only) or returned as a Python scalar; and per operand the last scalar seen
        # with its tensor (a constant is the same object on every call: no key to build).
        fixed = node.info.get("_elementwise_eval")
        if fixed is None:
            out = node.outputs[0]
            fixed = node.info["_elementwise_eval"] = (
                int_div_fn if node.info.get("int_div") else fn, tuple(node.info["cast"]),
                to_torch_dtype(out.dtype), bool(node.info.get("reduction_result")), isinstance(out, Scalar),
                [None] * len(node.info["cast"]))
        op, casts, out_dtype, contiguous, scalar_out, last_scalars = fixed
        device = None
        conv = []
        i = -1
        for a, c in zip(args, casts):
            i += 1
            if isinstance(a, torch.Tensor):
                conv.append(a if c is None or a.dtype == c else a.to(c))
                continue
            if device is None:
                device = _tensor_device(args)
            last = last_scalars[i]
            if last is None or last[0] is not a or last[1] != device:
                last = last_scalars[i] = (a, device, _scalar_operand(a, c, device))
            conv.append(last[2])
        result = op(*conv)
        if result.dtype != out_dtype:
            result = result.to(out_dtype)
        if contiguous:
            result = result.contiguous()
        if scalar_out:
            return result.item()
        return result

    return evaluate


_CPU = torch.device("cpu")


def _tensor_device(args) -> torch.device:
    """Where a scalar operand's tensor goes: the device of the op's first tensor operand (the CPU if none)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return _CPU


# Operand categories: which dtypes an op accepts. Anything else is rejected at definition time, so a fusion
# never fails at run time because ATen has no kernel for the dtype.
_CATEGORIES = {
    "float": lambda dt: is_floating(dt) or is_complex(dt),
    "real_float": is_floating,
    "int": lambda dt: is_integral(dt) or is_boolean(dt),
    "int_only": is_integral,
    "complex": is_complex,
    "not_complex": lambda dt: not is_complex(dt),
    # real numbers without Bool: ATen's relu/ceil/floor/round/trunc have no Bool kernels
    "real_number": lambda dt: is_integral(dt) or is_floating(dt),
    "not_bool": lambda dt: not is_boolean(dt),
    "any": lambda dt: True,
}


def _check_category(op: str, x, allowed: str, argname: str = "arg"):
    dt = operand_dtype(x)
    if not _CATEGORIES[allowed](dt):
        fail(op, f"argument '{argname}' of {dt!r} is not supported", FusionDtypeError)



# --------------------------------------------------------------------------------------------------------------
# unary

_FLOAT_UNARY = {
    "acos": torch.acos,
    "acosh": torch.acosh,
    "asin": torch.asin,
    "asinh": torch.asinh,
    "atan": torch.atan,
    "atanh": torch.atanh,
    "cos": torch.cos,
    "cosh": torch.cosh,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "erf": torch.erf,
    "erfc": torch.erfc,
    "erfinv": torch.erfinv,
    "erfcinv": lambda x: torch.erfinv(1 - x),
    "lgamma": torch.lgamma,
    "log": torch.log,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "log2": torch.log2,
    "reciprocal": torch.reciprocal,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "sinh": torch.sinh,
    "sqrt": torch.sqrt,
    "tan": torch.tan,
    "tanh": torch.tanh,
}
# (torch fn, category the input must be in)
_KEEP_UNARY = {
    "relu": (torch.relu, "real_number"),
    "ceil": (torch.ceil, "real_number"),
    "floor": (torch.floor, "real_number"),
    "round": (torch.round, "real_number"),
    "trunc": (torch.trunc, "real_number"),
    "frac": (torch.frac, "real_float"),
    "silu": (torch.nn.functional.silu, "real_float"),
    "bitwise_not": (torch.bitwise_not, "int"),
    # nvFuser's abs is a plain UnaryOp and its sign casts back to the input type: both keep the dtype
    # (abs of a complex is the exception, handled below). ATen has no abs for Bool and no sign for complex.
    "abs": (torch.abs, "not_bool"),
    "sign": (torch.sign, "not_complex"),
    # nvFuser's set/segment_set are copies (segment_set also marks a segment boundary).
    "set": (torch.clone, "any"),
    "segment_set": (torch.clone, "any"),
}
# Random draws happen in the tensor's own dtype: drawing in Float and rounding to bf16/half could round a
# uniform sample up to 1.0, outside rand's [0, 1).
_RANDOM_UNARY = {"rand_like": torch.rand_like, "randn_like": torch.randn_like}
_BOOL_UNARY = {
    "isfinite": torch.isfinite,
    "isinf": torch.isinf,
    "isnan": torch.isnan,
    "isneginf": torch.isneginf,
    "isposinf": torch.isposinf,
    "isreal": torch.isreal,
    "signbit": torch.signbit,
    "logical_not": torch.logical_not,
}


def _register_unary(name: str, fn, out_rule, category: str = "any"):
    def build(arg):
        check_operand(name, arg, "arg")
        _check_category(name, arg, category, "arg")
        dt = operand_dtype(arg)
        out_dt, cast = out_rule(dt)
        return OpResult([_output(name, [arg], out_dt)], (arg,), info={"cast": [_tdt(cast)]})

    build.__doc__ = f"fd.ops.{name}(arg): elementwise {name}."
    return register(name, OpKind.POINTWISE, _elementwise_eval(fn))(build)


# ATen has no complex kernels for these.
_REAL_ONLY_FLOAT_UNARY = {"erf", "erfc", "erfinv", "erfcinv", "lgamma"}

for _name, _fn in _FLOAT_UNARY.items():
    _register_unary(
        _name,
        _fn,
        lambda dt: (_floatify(dt), _floatify(dt)),
        "not_complex" if _name in _REAL_ONLY_FLOAT_UNARY else "any",
    )


def _neg_rule(dt):
    if is_boolean(dt):
        fail("neg", "argument 'arg' of DataType.Bool is not supported; use logical_not", FusionDtypeError)
    c = compute_dtype(dt)
    return c, c


def _keep_rule(dt):
    """Output keeps the input dtype; reduced floats are computed in Float."""
    return dt, compute_dtype(dt)


def _abs_rule(dt):
    if is_complex(dt):
        return (DataType.Float if dt is DataType.ComplexFloat else DataType.Double), dt
    return _keep_rule(dt)


# neg promotes like an arithmetic op (frontend.md "Result dtypes"), so it is registered apart from the
# dtype-keeping unaries.
_register_unary("neg", torch.neg, _neg_rule)

for _name, (_fn, _cat) in _KEEP_UNARY.items():
    _register_unary(_name, _fn, _abs_rule if _name == "abs" else _keep_rule, _cat)

# ATen draws random numbers only in these; FP8/FP4 inputs draw in Float and round.
_RANDOM_DTYPES = (DataType.Double, DataType.Float, DataType.Half, DataType.BFloat16)

for _name, _fn in _RANDOM_UNARY.items():
    _register_unary(_name, _fn, lambda dt: (dt, dt if dt in _RANDOM_DTYPES else DataType.Float), "real_float")

# ATen defines these only for real numbers (sign bits and signed infinities do not exist for complex).
_REAL_ONLY_BOOL_UNARY = {"isneginf", "isposinf", "signbit"}

for _name, _fn in _BOOL_UNARY.items():
    _register_unary(
        _name,
        _fn,
        lambda dt: (DataType.Bool, compute_dtype(dt)),
        "not_complex" if _name in _REAL_ONLY_BOOL_UNARY else "any",
    )


def _real_imag_rule(dt):
    if is_complex(dt):
        return (DataType.Float if dt is DataType.ComplexFloat else DataType.Double), dt
    return dt, dt


def _fresh(part):
    # torch.real/imag return views into the complex storage (strides doubled), and torch.real of a real tensor
    # returns the tensor itself. nvFuser's real/imag are pointwise ops (real of a real tensor is a `set`), so
    # the result is a new tensor; clone() lays it out densely in the input's dim order, like any pointwise op.
    return lambda x: part(x).clone()


_register_unary("real", _fresh(torch.real), _real_imag_rule)
_register_unary("imag", _fresh(torch.imag), _real_imag_rule, "complex")


# --------------------------------------------------------------------------------------------------------------
# binary


def _logical_right_shift(x, n):
    # Shift as if x were unsigned: an arithmetic shift, then clear the sign-extended high bits with a mask of
    # the low (bits - n) bits. torch defines 1 << bits as 0, so n == 0 gives the all-ones mask 0 - 1.
    # `shifted` is the first operand of every later op, so the result has the layout of a single pointwise
    # op on (x, n), as eager would give.
    bits = x.element_size() * 8
    shifted = torch.bitwise_right_shift(x, n)
    mask = torch.bitwise_left_shift(torch.ones_like(shifted), bits - n) - 1
    return torch.bitwise_and(shifted, mask)


def _int_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


# name -> (torch fn, rule, operand category)
#   rule "arith": promote, widen reduced floats;  "float": as arith, and integers become Float;
#   "cmp": Bool result computed in the promoted type; "logical": Bool result computed in Bool;
#   "bitwise": promoted integer type; "float_only": the promoted type must already be Float or Double.
_BINARY = {
    "add": (torch.add, "arith", "any"),
    "sub": (torch.sub, "arith", "any"),
    "mul": (torch.mul, "arith", "any"),
    "div": (torch.div, "div", "any"),
    "truediv": (torch.true_divide, "float", "any"),
    "atan2": (torch.atan2, "float", "not_complex"),
    "fmod": (torch.fmod, "arith", "not_complex"),
    "mod": (torch.fmod, "arith", "not_complex"),
    "remainder": (torch.remainder, "arith", "not_complex"),
    "pow": (torch.pow, "arith", "any"),
    "nextafter": (torch.nextafter, "float_only", "real_float"),
    "minimum": (torch.minimum, "arith", "not_complex"),
    "maximum": (torch.maximum, "arith", "not_complex"),
    "eq": (torch.eq, "cmp", "any"),
    "ne": (torch.ne, "cmp", "any"),
    "ge": (torch.ge, "cmp", "not_complex"),
    "gt": (torch.gt, "cmp", "not_complex"),
    "le": (torch.le, "cmp", "not_complex"),
    "lt": (torch.lt, "cmp", "not_complex"),
    "logical_and": (torch.logical_and, "logical", "any"),
    "logical_or": (torch.logical_or, "logical", "any"),
    "bitwise_and": (torch.bitwise_and, "bitwise", "int"),
    "bitwise_or": (torch.bitwise_or, "bitwise", "int"),
    "bitwise_xor": (torch.bitwise_xor, "bitwise", "int"),
    "bitwise_left_shift": (torch.bitwise_left_shift, "bitwise", "int_only"),
    "bitwise_right_shift": (torch.bitwise_right_shift, "bitwise", "int_only"),
    "logical_right_shift": (_logical_right_shift, "bitwise", "int_only"),
    "gcd": (torch.gcd, "bitwise", "int_only"),
}


def _binary_types(name: str, rule: str, operands: list):
    p = _promoted(operands)
    if rule == "div":
        # nvFuser's div keeps integer division for integer operands (truncating, like C); truediv does not.
        if is_integral(p) or is_boolean(p):
            p = DataType.Int if is_boolean(p) else p
            return p, [p] * len(operands), _int_div
        rule = "arith"
    if rule == "arith":
        c = compute_dtype(p)
        if is_boolean(c) and name in ("sub", "pow", "fmod", "mod", "remainder"):
            fail(name, "does not support Bool operands", FusionDtypeError)
        return c, [c] * len(operands), None
    if rule == "float_only":
        # The next representable value depends on the type: computing a bf16 nextafter in Float would step by
        # a Float ulp. nvFuser (float_only_op_config) rejects anything but Float and Double, and so do we.
        if p not in (DataType.Float, DataType.Double):
            fail(name, f"operands promote to {p!r}; only Float and Double are supported", FusionDtypeError)
        return p, [p] * len(operands), None
    if rule == "float":
        c = _floatify(p)
        return c, [c] * len(operands), None
    if rule == "cmp":
        c = compute_dtype(p)
        return DataType.Bool, [c] * len(operands), None
    if rule == "logical":
        return DataType.Bool, [DataType.Bool] * len(operands), None
    if rule == "bitwise":
        return p, [p] * len(operands), None
    raise AssertionError(rule)


def _register_binary(name: str, fn, rule: str, category: str):
    evaluate = _elementwise_eval(fn, _int_div if rule == "div" else None)

    def build(lhs, rhs):
        check_operand(name, lhs, "lhs")
        check_operand(name, rhs, "rhs")
        _check_category(name, lhs, category, "lhs")
        _check_category(name, rhs, category, "rhs")
        out_dt, casts, special = _binary_types(name, rule, [lhs, rhs])
        info = {"cast": [_tdt(c) for c in casts]}
        if special is not None:
            info["int_div"] = True
        return OpResult([_output(name, [lhs, rhs], out_dt)], (lhs, rhs), info=info)

    build.__doc__ = f"fd.ops.{name}(lhs, rhs): elementwise {name} of tensors and/or scalars."
    return register(name, OpKind.POINTWISE, evaluate)(build)


for _name, (_fn, _rule, _cat) in _BINARY.items():
    _register_binary(_name, _fn, _rule, _cat)


def _complex_build(real, imag):
    for x, n in ((real, "real"), (imag, "imag")):
        check_operand("complex", x, n)
        _check_category("complex", x, "real_float", n)
    p = compute_dtype(_promoted([real, imag]))
    out = DataType.ComplexDouble if p is DataType.Double else DataType.ComplexFloat
    info = {"cast": [_tdt(p), _tdt(p)]}
    return OpResult([_output("complex", [real, imag], out)], (real, imag), info=info)


register("complex", OpKind.POINTWISE, _elementwise_eval(torch.complex))(_complex_build)


# --------------------------------------------------------------------------------------------------------------
# ternary


def _where_build(pred, lhs, rhs):
    for x, n in ((pred, "pred"), (lhs, "lhs"), (rhs, "rhs")):
        check_operand("where", x, n)
    if operand_dtype(pred) is not DataType.Bool:
        fail("where", f"argument 'pred' must be Bool, got {operand_dtype(pred)!r}", FusionDtypeError)
    # where selects values: it keeps the promoted type without widening bf16 to Float (as torch.where does).
    p = _promoted([lhs, rhs])
    info = {"cast": [torch.bool, _tdt(p), _tdt(p)]}
    return OpResult([_output("where", [pred, lhs, rhs], p)], (pred, lhs, rhs), info=info)


register("where", OpKind.POINTWISE, _elementwise_eval(torch.where))(_where_build)


def _lerp_build(start, end, weight):
    for x, n in ((start, "start"), (end, "end"), (weight, "weight")):
        check_operand("lerp", x, n)
        _check_category("lerp", x, "float", n)
    c = _floatify(_promoted([start, end, weight]))
    info = {"cast": [_tdt(c)] * 3}
    return OpResult([_output("lerp", [start, end, weight], c)], (start, end, weight), info=info)


register("lerp", OpKind.POINTWISE, _elementwise_eval(torch.lerp))(_lerp_build)


def _clamp_build(arg, min_val, max_val):
    for x, n in ((arg, "arg"), (min_val, "min_val"), (max_val, "max_val")):
        check_operand("clamp", x, n)
        _check_category("clamp", x, "not_complex", n)
    dt = operand_dtype(arg)
    c = compute_dtype(_promoted([arg, min_val, max_val]))
    info = {"cast": [_tdt(c)] * 3}
    return OpResult([_output("clamp", [arg, min_val, max_val], dt)], (arg, min_val, max_val), info=info)


register(
    "clamp",
    OpKind.POINTWISE,
    _elementwise_eval(lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi)),
)(_clamp_build)


def _threshold_build(arg, threshold, value):
    for x, n in ((arg, "arg"), (threshold, "threshold"), (value, "value")):
        check_operand("threshold", x, n)
        _check_category("threshold", x, "not_complex", n)
    dt = operand_dtype(arg)
    # threshold and value take the input's type (nvFuser casts them to it, as torch does): for an integer
    # input, a threshold of -0.5 is 0, so 0 is replaced (comparing in Float would keep it).
    c = compute_dtype(dt)
    info = {"cast": [_tdt(c)] * 3}
    return OpResult([_output("threshold", [arg, threshold, value], dt)], (arg, threshold, value), info=info)


def _threshold(x, th, v):
    # ATen and nvFuser both compute `x <= th ? v : x`, so NaN passes through (`x > th ? x : v` would replace it).
    return torch.where(x <= th, v, x)


register("threshold", OpKind.POINTWISE, _elementwise_eval(_threshold))(_threshold_build)


def _addcmul_build(arg, tensor1, tensor2, value=1.0):
    for x, n in ((arg, "arg"), (tensor1, "tensor1"), (tensor2, "tensor2"), (value, "value")):
        check_operand("addcmul", x, n)
    c = compute_dtype(_promoted([arg, tensor1, tensor2, value]))
    info = {"cast": [_tdt(c)] * 4}
    out = _output("addcmul", [arg, tensor1, tensor2, value], c)
    return OpResult([out], (arg, tensor1, tensor2, value), info=info)


register("addcmul", OpKind.POINTWISE, _elementwise_eval(lambda a, b, c, v: a + v * b * c))(
    _addcmul_build
)


# --------------------------------------------------------------------------------------------------------------
# cast


def _cast_eval(node, arg, dtype=None):
    out = node.outputs[0]
    if isinstance(arg, torch.Tensor) and (is_packed_fp4(out) or is_packed_fp4(node.inputs[0])):
        return _fp4_cast(node, arg)
    tdt = to_torch_dtype(out.dtype)
    if isinstance(arg, torch.Tensor):
        return arg.to(tdt, copy=True)
    return torch.tensor(arg).to(tdt).item()


def _fp4_cast(node, arg):
    """Casts into and out of packed FP4, along each TV's packed dim (round to nearest even, saturating at 6)."""
    from ..nvfp4 import reference as ref

    src, out = node.inputs[0], node.outputs[0]
    if is_packed_fp4(src):
        d = packed_dim(src)
        codes = ref.unpack_fp4(arg.movedim(d, -1)).movedim(-1, d)
        if is_packed_fp4(out):
            return ref.pack_fp4(codes.movedim(packed_dim(out), -1)).movedim(-1, packed_dim(out))
        return ref.fp4_decode(codes).to(to_torch_dtype(out.dtype))
    d = packed_dim(out)
    return ref.to_fp4(arg.to(torch.float32).movedim(d, -1)).movedim(-1, d)


def _cast_meta(node, arg, dtype=None):
    if not isinstance(arg, torch.Tensor):  # a scalar, perhaps a literal (then the node has no inputs)
        return _cast_eval(node, arg, dtype)
    src, out = node.inputs[0], node.outputs[0]
    if not (is_packed_fp4(src) or is_packed_fp4(out)):
        return _cast_eval(node, arg, dtype)
    sizes, strides = unpacked(src, arg.shape, arg.stride())
    if is_packed_fp4(out):
        shape = packed_shape(sizes, packed_dim(out))
        return torch.empty(shape, dtype=to_torch_dtype(out.dtype), device="meta")
    # Unpacking keeps the input's dim order (as ATen's .to() preserves a dense layout).
    return torch.empty_strided(sizes, strides, dtype=to_torch_dtype(out.dtype), device="meta")


def _cast_build(arg, dtype: DataType):
    check_operand("cast", arg, "arg")
    if not isinstance(dtype, DataType) or dtype is DataType.Null:
        fail("cast", f"argument 'dtype' must be a DataType other than Null, got {dtype!r}", FusionDtypeError)
    if dtype is DataType.Float4_e2m1fn_x2:
        fail("cast", "Float4_e2m1fn_x2 is a storage type (two values per byte): cast to Float4_e2m1fn",
             FusionDtypeError)
    if dtype is DataType.Float4_e2m1fn or operand_dtype(arg) is DataType.Float4_e2m1fn:
        if not isinstance(arg, TensorView):
            fail("cast", f"a scalar cannot be cast to {dtype!r}", FusionDtypeError)
        if is_complex(operand_dtype(arg)):
            fail("cast", f"{arg.name} is complex and cannot be cast to Float4_e2m1fn", FusionDtypeError)
    out = _output("cast", [arg], dtype)
    if is_packed_fp4(out) and out.ndim == 0:
        fail("cast", "a 0-dim tensor cannot be cast to Float4_e2m1fn (values are packed in pairs)")
    if is_packed_fp4(out):
        inner = out.logical[packed_dim(out)]
        if inner.extent is not None and inner.extent % 2:
            fail("cast", f"Float4_e2m1fn packs pairs along the last dim, whose extent {inner.extent} is odd")
    return OpResult([out], (arg,), {"dtype": dtype})


register("cast", OpKind.POINTWISE, _cast_eval, meta=_cast_meta, accepts_fp4=True)(_cast_build)

del math
