"""Elementwise ops: every unary, binary and ternary op of frontend.md "Elementwise", and cast.

Each test runs the fusion through ``check_fusion`` (execute, repr round trip, LRU cache) and compares values,
dtypes, shapes and strides with an eager PyTorch reference written here. The references encode the result
dtype rules of frontend.md independently of pyfuser: arithmetic promotes like torch and then turns Half/BF16
into Float (``widen``); float unaries also turn ints and bools into Float (``float_of``); relu & co. keep the
dtype, computed in Float for Half/BF16; comparisons and is* ops give Bool.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from harness import DEVICE, check_fusion, define, expanded, make, sliced, transposed
from pyfuser import DataType
from pyfuser.ir.dtypes import to_torch_dtype

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, BOOL, C64 = torch.int64, torch.int32, torch.bool, torch.complex64
FLOATS = [F32, F64, BF16, F16]
INTS = [I64, I32]
REAL = FLOATS + INTS + [BOOL]
ALL = REAL + [C64]
SHAPE = (5, 7)

# Transcendental functions may differ by a few ulp between ATen and a generated kernel.
TOL = dict(atol=1e-5, rtol=1e-5)


def widen(dt: torch.dtype) -> torch.dtype:
    """Half and BF16 compute and return in Float."""
    return F32 if dt in (BF16, F16) else dt


def float_of(dt: torch.dtype) -> torch.dtype:
    """Float unaries: ints and bools become Float, reduced floats become Float."""
    if dt == BOOL or not (dt.is_floating_point or dt.is_complex):
        return F32
    return widen(dt)


def ids(values):
    return [str(v).replace("torch.", "") for v in values]


# --------------------------------------------------------------------------------------------------------------
# inputs: values in an op's domain, in a given layout

# domain -> ((float low, float high), (int low, int high))
DOMAINS = {
    "any": ((-3.0, 3.0), (-5, 6)),
    "pos": ((0.1, 4.0), (1, 6)),
    "unit": ((-0.9, 0.9), (0, 1)),
    "ge1": ((1.1, 4.0), (1, 6)),
    "gt-1": ((-0.9, 3.0), (0, 6)),
    "erfc": ((0.1, 1.9), (1, 2)),
    "nonzero": ((0.25, 3.0), (1, 6)),  # random sign applied below
    "exponent": ((-2.0, 2.0), (0, 4)),
    "shift": ((0.0, 0.0), (0, 8)),
}


def values(shape, dtype, domain="any"):
    if dtype == BOOL:
        return torch.randint(0, 2, shape, device=DEVICE).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=DEVICE)
    (flo, fhi), (ilo, ihi) = DOMAINS[domain]
    if dtype.is_floating_point:
        t = (torch.rand(shape, dtype=F64, device=DEVICE) * (fhi - flo) + flo).to(dtype)
    else:
        t = torch.randint(ilo, ihi, shape, dtype=dtype, device=DEVICE)
    if domain == "nonzero":
        t = t * (torch.randint(0, 2, shape, device=DEVICE) * 2 - 1).to(dtype)
    return t


def tensor(dtype, domain="any", layout="contig", shape=SHAPE):
    """A [5, 7] tensor with values in ``domain``, contiguous, transposed, sliced (padded rows) or expanded."""
    rows, cols = shape
    if layout == "contig":
        return values(shape, dtype, domain)
    if layout == "transposed":
        return values((cols, rows), dtype, domain).t()
    if layout == "sliced":
        return values((rows, cols + 3), dtype, domain)[:, :cols]
    if layout == "expanded":
        return values((rows, 1), dtype, domain).expand(rows, cols)
    raise ValueError(layout)


def unary_fusion(name):
    return lambda x: (lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x))))


def run_unary(name, x, reference, **tol):
    return check_fusion(unary_fusion(name)(x), [x], reference, **tol)


# --------------------------------------------------------------------------------------------------------------
# unary: float ops (ints and bools -> Float, Half/BF16 -> Float)

FLOAT_UNARY = {
    # name: (torch function, input domain, complex supported)
    "acos": (torch.acos, "unit", True),
    "acosh": (torch.acosh, "ge1", True),
    "asin": (torch.asin, "unit", True),
    "asinh": (torch.asinh, "any", True),
    "atan": (torch.atan, "any", True),
    "atanh": (torch.atanh, "unit", True),
    "cos": (torch.cos, "any", True),
    "cosh": (torch.cosh, "any", True),
    "exp": (torch.exp, "any", True),
    "exp2": (torch.exp2, "any", True),
    "expm1": (torch.expm1, "any", True),
    "erf": (torch.erf, "any", False),
    "erfc": (torch.erfc, "any", False),
    "erfinv": (torch.erfinv, "unit", False),
    # erfcinv(x) = erfinv(1 - x) by definition; test_erfcinv_inverts_erfc checks it the other way round.
    "erfcinv": (lambda x: torch.erfinv(1 - x), "erfc", False),
    "lgamma": (torch.lgamma, "pos", False),
    "log": (torch.log, "pos", True),
    "log10": (torch.log10, "pos", True),
    "log1p": (torch.log1p, "gt-1", True),
    "log2": (torch.log2, "pos", True),
    "reciprocal": (torch.reciprocal, "nonzero", True),
    "rsqrt": (torch.rsqrt, "pos", True),
    "sigmoid": (torch.sigmoid, "any", True),
    "sin": (torch.sin, "any", True),
    "sinh": (torch.sinh, "any", True),
    "sqrt": (torch.sqrt, "pos", True),
    "tan": (torch.tan, "any", True),
    "tanh": (torch.tanh, "any", True),
}
FLOAT_UNARY_CASES = [
    (name, dt) for name, (_, _, cplx) in FLOAT_UNARY.items() for dt in (ALL if cplx else REAL)
]


@pytest.mark.parametrize("name,dtype", FLOAT_UNARY_CASES, ids=[f"{n}-{ids([d])[0]}" for n, d in FLOAT_UNARY_CASES])
def test_float_unary(name, dtype):
    fn, domain, _ = FLOAT_UNARY[name]
    x = tensor(dtype, domain)
    out = run_unary(name, x, lambda x: fn(x.to(float_of(x.dtype))), **TOL)[0]
    assert out.dtype == float_of(dtype)


def test_erfcinv_inverts_erfc():
    x = tensor(F64, "erfc")
    out = define(unary_fusion("erfcinv")(x)).execute([x])[0]
    torch.testing.assert_close(torch.erfc(out), x)


# --------------------------------------------------------------------------------------------------------------
# unary: dtype-keeping ops, neg, bool results, real/imag

KEEP_UNARY = {
    # name: (torch function, dtypes)
    "relu": (torch.relu, FLOATS + INTS),
    "ceil": (torch.ceil, FLOATS + INTS),
    "floor": (torch.floor, FLOATS + INTS),
    "round": (torch.round, FLOATS + INTS),
    "trunc": (torch.trunc, FLOATS + INTS),
    "frac": (torch.frac, FLOATS),
    "silu": (torch.nn.functional.silu, FLOATS),
    "bitwise_not": (torch.bitwise_not, INTS + [BOOL]),
    "abs": (torch.abs, FLOATS + INTS + [C64]),
    "sign": (torch.sign, REAL),
    "set": (torch.clone, ALL),
    "segment_set": (torch.clone, ALL),
}
KEEP_CASES = [(n, d) for n, (_, dts) in KEEP_UNARY.items() for d in dts]


@pytest.mark.parametrize("name,dtype", KEEP_CASES, ids=[f"{n}-{ids([d])[0]}" for n, d in KEEP_CASES])
def test_dtype_keeping_unary(name, dtype):
    fn, _ = KEEP_UNARY[name]
    x = tensor(dtype)

    def reference(x):
        if name == "abs" and x.is_complex():
            return torch.abs(x)  # the real magnitude
        return fn(x.to(widen(x.dtype))).to(x.dtype)

    tol = TOL
    if name == "silu" and dtype.itemsize == 2:
        # computed in fp32 and rounded once: an exp one fp32 ulp from ATen's CPU one (the interpreter's is
        # numpy's) flips a rounding now and then, one ulp of the 16-bit result
        tol = dict(atol=1e-5, rtol=torch.finfo(dtype).eps)
    out = run_unary(name, x, reference, **tol)[0]
    assert out.dtype == (F32 if (name == "abs" and dtype == C64) else dtype)


@pytest.mark.parametrize("dtype", [d for d in ALL if d != BOOL], ids=ids([d for d in ALL if d != BOOL]))
def test_neg(dtype):
    x = tensor(dtype)
    out = run_unary("neg", x, lambda x: torch.neg(x.to(widen(x.dtype))))[0]
    assert out.dtype == widen(dtype)


def _with_specials(x):
    """Put inf, -inf, nan and -0.0 into a float tensor so the is* predicates see every case."""
    if x.dtype.is_floating_point or x.is_complex():
        x = x.clone()
        x[0, 0], x[1, 1], x[2, 2], x[3, 3] = float("inf"), float("-inf"), float("nan"), -0.0
    return x


BOOL_UNARY = {
    "isfinite": (torch.isfinite, ALL),
    "isinf": (torch.isinf, ALL),
    "isnan": (torch.isnan, ALL),
    "isneginf": (torch.isneginf, REAL),
    "isposinf": (torch.isposinf, REAL),
    "isreal": (torch.isreal, ALL),
    "signbit": (torch.signbit, REAL),
    "logical_not": (torch.logical_not, ALL),
}
BOOL_CASES = [(n, d) for n, (_, dts) in BOOL_UNARY.items() for d in dts]


@pytest.mark.parametrize("name,dtype", BOOL_CASES, ids=[f"{n}-{ids([d])[0]}" for n, d in BOOL_CASES])
def test_bool_unary(name, dtype):
    fn, _ = BOOL_UNARY[name]
    x = _with_specials(tensor(dtype))
    if dtype == C64 and name == "isreal":
        x[4, :3] = torch.tensor([1.0, -2.0, 0.0])  # purely real entries
    out = run_unary(name, x, fn)[0]
    assert out.dtype == BOOL


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_real(dtype):
    x = tensor(dtype, layout="transposed")
    out = run_unary("real", x, lambda x: torch.real(x).clone())[0]
    assert out.dtype == (F32 if dtype == C64 else dtype)
    # A new tensor, never a view of the input (nvFuser's real of a real tensor is a `set`).
    out = define(unary_fusion("real")(x)).execute([x])[0]
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced", "expanded"])
def test_imag(layout):
    x = tensor(torch.complex128, layout=layout)
    out = run_unary("imag", x, lambda x: torch.imag(x).clone())[0]
    assert out.dtype == F64


# --------------------------------------------------------------------------------------------------------------
# random ops: shape, dtype, strides and range only


@pytest.mark.parametrize("name", ["rand_like", "randn_like"])
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced", "expanded"])
def test_random_like(name, dtype, layout):
    x = tensor(dtype, layout=layout)
    fd = define(unary_fusion(name)(x))
    check_fusion(unary_fusion(name)(x), [x])  # round trip and cache paths run (values are random)
    out, again = fd.execute([x])[0], fd.execute([x])[0]
    layout_ref = getattr(torch, name)(x)
    assert out.dtype == dtype and out.shape == x.shape
    assert out.stride() == layout_ref.stride()
    assert torch.isfinite(out).all()
    if name == "rand_like":
        assert 0 <= out.min().item() and out.max().item() < 1
    else:
        assert out.float().std().item() > 0.1  # not a constant
    assert not torch.equal(out, again), "two executions drew the same numbers"


# --------------------------------------------------------------------------------------------------------------
# binary ops between two tensors of one dtype

NO_BOOL = [d for d in ALL if d != BOOL]
REAL_NO_BOOL = FLOATS + INTS
BINARY = {
    # name: (torch function, result rule, dtypes, rhs domain)
    "add": (torch.add, "arith", ALL, "any"),
    "sub": (torch.sub, "arith", NO_BOOL, "any"),
    "mul": (torch.mul, "arith", ALL, "any"),
    "div": (torch.div, "div", NO_BOOL, "nonzero"),  # integer operands: truncating division
    "truediv": (torch.true_divide, "float", ALL, "nonzero"),
    "atan2": (torch.atan2, "float", REAL, "any"),
    "fmod": (torch.fmod, "arith", REAL_NO_BOOL, "nonzero"),
    "mod": (torch.fmod, "arith", REAL_NO_BOOL, "nonzero"),  # C's %: truncating, the sign of the dividend
    "remainder": (torch.remainder, "arith", REAL_NO_BOOL, "nonzero"),
    "pow": (torch.pow, "arith", NO_BOOL, "exponent"),
    "nextafter": (torch.nextafter, "arith", [F32, F64], "any"),
    "minimum": (torch.minimum, "arith", REAL, "any"),
    "maximum": (torch.maximum, "arith", REAL, "any"),
    "eq": (torch.eq, "bool", ALL, "any"),
    "ne": (torch.ne, "bool", ALL, "any"),
    "ge": (torch.ge, "bool", REAL, "any"),
    "gt": (torch.gt, "bool", REAL, "any"),
    "le": (torch.le, "bool", REAL, "any"),
    "lt": (torch.lt, "bool", REAL, "any"),
    "logical_and": (torch.logical_and, "bool", ALL, "any"),
    "logical_or": (torch.logical_or, "bool", ALL, "any"),
    "bitwise_and": (torch.bitwise_and, "exact", INTS + [BOOL], "any"),
    "bitwise_or": (torch.bitwise_or, "exact", INTS + [BOOL], "any"),
    "bitwise_xor": (torch.bitwise_xor, "exact", INTS + [BOOL], "any"),
    "bitwise_left_shift": (torch.bitwise_left_shift, "exact", INTS, "shift"),
    "bitwise_right_shift": (torch.bitwise_right_shift, "exact", INTS, "shift"),
    "gcd": (torch.gcd, "exact", INTS, "any"),
}
BINARY_CASES = [(n, d) for n, (_, _, dts, _) in BINARY.items() for d in dts]


def binary_reference(name):
    fn, rule, _, _ = BINARY[name]

    def reference(a, b):
        common = torch.result_type(a, b)
        if rule == "bool" or rule == "exact":
            return fn(a, b)
        if rule == "float":
            c = float_of(common)
            return fn(a.to(c), b.to(c))
        c = widen(common)
        if name == "div":
            is_int = not (c.is_floating_point or c.is_complex)
            return torch.div(a.to(c), b.to(c), rounding_mode="trunc" if is_int else None)
        return fn(a.to(c), b.to(c))

    return reference


def binary_fusion(name, a, b):
    def fn(fd):
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), fd.from_pytorch(b)))

    return fn


@pytest.mark.parametrize("name,dtype", BINARY_CASES, ids=[f"{n}-{ids([d])[0]}" for n, d in BINARY_CASES])
def test_binary(name, dtype):
    _, rule, _, domain = BINARY[name]
    a, b = tensor(dtype), tensor(dtype, domain)
    if rule == "bool" or name in ("minimum", "maximum"):
        b = torch.where(torch.rand(SHAPE, device=DEVICE) < 0.4, a, b)  # equal elements exercise ==, <=, ...
    out = check_fusion(binary_fusion(name, a, b), [a, b], binary_reference(name), **TOL)[0]
    expected = {"bool": BOOL, "float": float_of(dtype), "exact": dtype}.get(rule, widen(dtype))
    assert out.dtype == expected


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_logical_right_shift(dtype):
    bits = torch.iinfo(dtype).bits
    a = tensor(dtype, "any", layout="transposed")
    a[0, :3] = torch.tensor([-1, torch.iinfo(dtype).min, torch.iinfo(dtype).max], dtype=dtype)
    n = torch.randint(0, bits, SHAPE, dtype=dtype, device=DEVICE)
    n[0, :3] = torch.tensor([0, 1, bits - 1], dtype=dtype)

    def reference(a, n):
        # Shift the unsigned (two's complement) value with Python ints, then reinterpret as signed.
        unsigned = [(int(v) % (1 << bits)) >> int(s) for v, s in zip(a.cpu().flatten().tolist(), n.cpu().flatten().tolist())]
        signed = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in unsigned]
        out = torch.empty_like(torch.bitwise_right_shift(a, n))  # the eager pointwise layout
        out.copy_(torch.tensor(signed, dtype=dtype).reshape(a.shape))
        return out

    out = check_fusion(binary_fusion("logical_right_shift", a, n), [a, n], reference)[0]
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype,expected", [(F32, torch.complex64), (F64, torch.complex128)], ids=["f32", "f64"])
def test_complex(dtype, expected):
    re, im = tensor(dtype, layout="transposed"), tensor(dtype, layout="transposed")
    out = check_fusion(binary_fusion("complex", re, im), [re, im], torch.complex)[0]
    assert out.dtype == expected


def test_int_div_truncates_and_truediv_of_ints_is_float():
    a = torch.tensor([[-7, 7, -7, 7, 0]], dtype=I64, device=DEVICE)
    b = torch.tensor([[2, 2, -2, -2, 3]], dtype=I64, device=DEVICE)
    div = check_fusion(binary_fusion("div", a, b), [a, b], lambda a, b: torch.div(a, b, rounding_mode="trunc"))[0]
    assert div.tolist() == [[-3, 3, 3, -3, 0]]  # truncation, not floor (-7 // 2 == -4)
    true = check_fusion(binary_fusion("truediv", a, b), [a, b], lambda a, b: a.float() / b.float())[0]
    assert true.dtype == F32 and true[0, 0].item() == -3.5


# --------------------------------------------------------------------------------------------------------------
# mixed dtypes: promotion like torch, then Half/BF16 -> Float

MIXED = [
    (F32, BF16, F32),
    (BF16, F16, F32),
    (F16, F64, F64),
    (I32, I64, I64),
    (I64, F32, F32),
    (BOOL, I32, I32),
    (BOOL, F16, F32),
    (I32, BF16, F32),
    (F64, C64, torch.complex128),
    (BF16, C64, C64),
]


MIXED_CASES = [
    (name, lhs, rhs, promoted)
    for name in ["add", "mul", "div", "truediv", "eq", "lt", "maximum"]
    for lhs, rhs, promoted in MIXED
    if not (promoted.is_complex and name in ("lt", "maximum"))  # no ordering of complex numbers
]


@pytest.mark.parametrize(
    "name,lhs,rhs,promoted", MIXED_CASES, ids=[f"{n}-{ids([a])[0]}-{ids([b])[0]}" for n, a, b, _ in MIXED_CASES]
)
def test_binary_mixed_dtypes(name, lhs, rhs, promoted):
    a, b = tensor(lhs), tensor(rhs, "nonzero")
    if name in ("eq", "lt"):
        expected = BOOL
    elif name == "truediv":
        expected = float_of(promoted)
    else:
        expected = promoted
    out = check_fusion(binary_fusion(name, a, b), [a, b], binary_reference(name), **TOL)[0]
    assert out.dtype == expected


# --------------------------------------------------------------------------------------------------------------
# tensor-scalar mixes: Python literals, define_scalar constants, symbolic define_scalar inputs

SCALAR_OPS = ["add", "sub", "mul", "div", "truediv", "pow", "eq", "lt", "maximum"]
SCALARS = [3, 2.5, True]
SCALAR_TENSOR_DTYPES = [F32, BF16, F64, I32, I64, BOOL]


def _scalar_case_ok(name, dtype, scalar):
    # Bool arithmetic that torch and nvFuser reject.
    common = torch.result_type(torch.empty(0, dtype=dtype), scalar)
    return not (common == BOOL and name in ("sub", "pow", "div"))


def scalar_reference(name, scalar, scalar_first):
    fn, rule, _, _ = BINARY[name]

    def reference(a, *rest):
        s = rest[0] if rest else scalar
        common = torch.result_type(a, s)
        c = float_of(common) if rule == "float" else widen(common)
        x = a.to(c)
        st = torch.tensor(s, dtype=c, device=a.device)
        lhs, rhs = (st, x) if scalar_first else (x, st)
        if name == "div" and not (c.is_floating_point or c.is_complex):
            return torch.div(lhs, rhs, rounding_mode="trunc")
        return fn(lhs, rhs)

    return reference


def _tensor_for_scalar_op(name, dtype, scalar_first):
    # Integer pow needs non-negative exponents; integer division by a tensor needs non-zero divisors.
    if name == "pow" and scalar_first and not dtype.is_floating_point:
        return tensor(dtype, "exponent")
    if name in ("div", "truediv") and scalar_first:
        return tensor(dtype, "nonzero")
    return tensor(dtype, "pos" if name == "pow" else "any")


SCALAR_CASES = [
    (name, dt, s, first)
    for name in SCALAR_OPS
    for dt in SCALAR_TENSOR_DTYPES
    for s in SCALARS
    for first in (False, True)
    if _scalar_case_ok(name, dt, s)
    and not (dt == BOOL and name in ("div", "truediv") and first)  # dividing by a bool tensor divides by 0
]


@pytest.mark.parametrize("kind", ["literal", "constant", "symbolic"])
@pytest.mark.parametrize(
    "name,dtype,scalar,scalar_first",
    SCALAR_CASES,
    ids=[f"{n}-{ids([d])[0]}-{s!r}-{'sfirst' if f else 'tfirst'}" for n, d, s, f in SCALAR_CASES],
)
def test_tensor_scalar(kind, name, dtype, scalar, scalar_first):
    x = _tensor_for_scalar_op(name, dtype, scalar_first)
    scalar_dtype = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double}[type(scalar)]

    def fusion(fd):
        t = fd.from_pytorch(x)
        if kind == "literal":
            s = scalar
        elif kind == "constant":
            s = fd.define_scalar(scalar)
        else:
            s = fd.define_scalar(dtype=scalar_dtype)
        args = (s, t) if scalar_first else (t, s)
        fd.add_output(getattr(fd.ops, name)(*args))

    inputs = [x] + ([scalar] if kind == "symbolic" else [])
    out = check_fusion(fusion, inputs, scalar_reference(name, scalar, scalar_first), **TOL)[0]
    common = torch.result_type(x, scalar)
    if name in ("eq", "lt"):
        assert out.dtype == BOOL
    elif name == "truediv":
        assert out.dtype == float_of(common)
    else:
        assert out.dtype == widen(common)


def test_float_tensor_with_double_scalar_stays_float():
    # A Double scalar does not promote a Float tensor (tensors dominate scalars of the same category).
    x = tensor(F32)
    out = check_fusion(
        lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(x), fd.define_scalar(dtype=DataType.Double))),
        [x, 1.1],
        lambda x, s: x * s,
    )[0]
    assert out.dtype == F32


def test_complex_scalar_promotes_float_tensor():
    x = tensor(F32)
    out = check_fusion(lambda fd: fd.add_output(fd.ops.add(fd.from_pytorch(x), 1.5j)), [x], lambda x: x + 1.5j)[0]
    assert out.dtype == C64


# --------------------------------------------------------------------------------------------------------------
# scalar-only expressions: the fusion output is a Python number


def _sym(fd, dtype):
    return fd.define_scalar(dtype=dtype)


SCALAR_EXPRS = [
    # (id, builder(fd) -> output, inputs, expected value, expected Python type)
    ("add-double", lambda fd: fd.ops.add(_sym(fd, DataType.Double), _sym(fd, DataType.Double)), [1.5, 2.25], 3.75, float),
    ("sub-int", lambda fd: fd.ops.sub(_sym(fd, DataType.Int), _sym(fd, DataType.Int)), [3, 10], -7, int),
    ("mul-int-double", lambda fd: fd.ops.mul(_sym(fd, DataType.Int), _sym(fd, DataType.Double)), [3, 0.5], 1.5, float),
    ("div-int-trunc", lambda fd: fd.ops.div(_sym(fd, DataType.Int), _sym(fd, DataType.Int)), [-7, 2], -3, int),
    ("truediv-int", lambda fd: fd.ops.truediv(_sym(fd, DataType.Int), _sym(fd, DataType.Int)), [7, 2], 3.5, float),
    ("pow", lambda fd: fd.ops.pow(_sym(fd, DataType.Double), 2), [1.5], 2.25, float),
    ("eq-int", lambda fd: fd.ops.eq(_sym(fd, DataType.Int), 4), [4], True, bool),
    ("lt-double", lambda fd: fd.ops.lt(_sym(fd, DataType.Double), 0.5), [0.75], False, bool),
    ("logical_and", lambda fd: fd.ops.logical_and(_sym(fd, DataType.Bool), True), [True], True, bool),
    ("bitwise_xor", lambda fd: fd.ops.bitwise_xor(_sym(fd, DataType.Int), 6), [5], 3, int),
    ("maximum", lambda fd: fd.ops.maximum(_sym(fd, DataType.Double), -1.0), [-2.5], -1.0, float),
    ("where", lambda fd: fd.ops.where(_sym(fd, DataType.Bool), 1.5, _sym(fd, DataType.Double)), [False, -4.0], -4.0, float),
    ("neg-int", lambda fd: fd.ops.neg(_sym(fd, DataType.Int)), [5], -5, int),
    ("abs-double", lambda fd: fd.ops.abs(_sym(fd, DataType.Double)), [-2.5], 2.5, float),
    ("exp-double", lambda fd: fd.ops.exp(_sym(fd, DataType.Double)), [1.0], math.exp(1.0), float),
    ("cast-double-int", lambda fd: fd.ops.cast(_sym(fd, DataType.Double), DataType.Int), [-3.7], -3, int),
    ("cast-int-bool", lambda fd: fd.ops.cast(_sym(fd, DataType.Int), DataType.Bool), [2], True, bool),
    ("chain", lambda fd: fd.ops.add(fd.ops.mul(_sym(fd, DataType.Int), 3), 1), [4], 13, int),
    ("constants-only", lambda fd: fd.ops.mul(fd.define_scalar(2.0), 3), [], 6.0, float),
    ("abs-complex", lambda fd: fd.ops.abs(_sym(fd, DataType.ComplexDouble)), [3 + 4j], 5.0, float),
]


@pytest.mark.parametrize("build,inputs,expected,pytype", [c[1:] for c in SCALAR_EXPRS], ids=[c[0] for c in SCALAR_EXPRS])
def test_scalar_only_expression(build, inputs, expected, pytype):
    out = check_fusion(lambda fd: fd.add_output(build(fd)), inputs, lambda *_: [expected])[0]
    assert type(out) is pytype


def test_scalar_expression_feeds_a_tensor_op():
    x = tensor(F32)

    def fusion(fd):
        t = fd.from_pytorch(x)
        s = fd.ops.add(fd.define_scalar(dtype=DataType.Double), fd.define_scalar(dtype=DataType.Double))
        fd.add_output(fd.ops.mul(t, s))
        fd.add_output(s)

    check_fusion(fusion, [x, 0.5, 0.25], lambda x, a, b: [x * (a + b), a + b])


# --------------------------------------------------------------------------------------------------------------
# broadcasting: [N, 1] (broadcast dim) and expanded (stride 0) tensors against [N, M]


@pytest.mark.parametrize("op", ["add", "mul", "sub", "maximum", "eq"])
def test_broadcast_column_against_full(op):
    a, b = make((5, 1)), make((5, 7))
    fn = getattr(torch, op)
    out = check_fusion(binary_fusion(op, a, b), [a, b], fn)[0]
    assert out.shape == (5, 7)
    out = check_fusion(binary_fusion(op, b, a), [b, a], fn)[0]
    assert out.shape == (5, 7)


def test_broadcast_explicit_define_tensor():
    a, b = make((5, 1)), make((5, 7))

    def fusion(fd):
        ta = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
        tb = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(ta, tb))

    check_fusion(fusion, [a, b], torch.add)


def test_broadcast_row_and_column():
    a, b = make((5, 1)), make((1, 7))
    out = check_fusion(binary_fusion("mul", a, b), [a, b], torch.mul)[0]
    assert out.shape == (5, 7)


@pytest.mark.parametrize("dim", [0, 1])
def test_expanded_input_against_full(dim):
    a, b = expanded((5, 7), dim), make((5, 7))
    check_fusion(binary_fusion("add", a, b), [a, b], torch.add)
    check_fusion(binary_fusion("sub", b, a), [b, a], torch.sub)


def test_broadcast_both_operands_stay_broadcast():
    # [5, 1] op [5, 1]: the output keeps the size-1 dim.
    a, b = make((5, 1)), make((5, 1))
    out = check_fusion(binary_fusion("add", a, b), [a, b], torch.add)[0]
    assert out.shape == (5, 1)


def test_where_broadcasts_predicate_and_values():
    c, a, b = make((5, 7), BOOL), make((5, 1)), make((1, 7))

    def fusion(fd):
        fd.add_output(fd.ops.where(fd.from_pytorch(c), fd.from_pytorch(a), fd.from_pytorch(b)))

    check_fusion(fusion, [c, a, b], torch.where)


# --------------------------------------------------------------------------------------------------------------
# non-contiguous inputs: a representative op of each kind over every layout

LAYOUT_MAKERS = {
    "transposed": lambda dt: transposed(SHAPE, dt),
    "sliced": lambda dt: sliced(SHAPE, dt),
    "expanded0": lambda dt: expanded(SHAPE, 0, dt),
    "expanded1": lambda dt: expanded(SHAPE, 1, dt),
}
LAYOUT_OPS = {
    # name: (fusion body on (fd, t0, t1), eager reference on (x, y))
    "exp": (lambda fd, t, u: fd.ops.exp(t), lambda x, y: torch.exp(x.float())),
    "relu": (lambda fd, t, u: fd.ops.relu(t), lambda x, y: torch.relu(x.float()).to(x.dtype)),
    "neg": (lambda fd, t, u: fd.ops.neg(t), lambda x, y: torch.neg(x.float())),
    "isnan": (lambda fd, t, u: fd.ops.isnan(t), lambda x, y: torch.isnan(x)),
    "cast": (lambda fd, t, u: fd.ops.cast(t, DataType.Double), lambda x, y: x.to(F64)),
    "set": (lambda fd, t, u: fd.ops.set(t), lambda x, y: x.clone()),
    "add": (lambda fd, t, u: fd.ops.add(t, u), lambda x, y: x.float() + y.float()),
    "lt": (lambda fd, t, u: fd.ops.lt(t, u), lambda x, y: x < y),
    "where": (
        lambda fd, t, u: fd.ops.where(fd.ops.gt(t, 0.0), t, u),
        lambda x, y: torch.where(x > 0, x, y),
    ),
    "lerp": (lambda fd, t, u: fd.ops.lerp(t, u, 0.25), lambda x, y: torch.lerp(x.float(), y.float(), 0.25)),
    "clamp": (lambda fd, t, u: fd.ops.clamp(t, -0.5, 0.5), lambda x, y: torch.clamp(x.float(), -0.5, 0.5).to(x.dtype)),
    "addcmul": (
        lambda fd, t, u: fd.ops.addcmul(t, u, t, 0.5),
        lambda x, y: torch.addcmul(x.float(), y.float(), x.float(), value=0.5),
    ),
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids([F32, BF16]))
@pytest.mark.parametrize("layout", list(LAYOUT_MAKERS))
@pytest.mark.parametrize("name", list(LAYOUT_OPS))
def test_noncontiguous_inputs(name, layout, dtype):
    body, reference = LAYOUT_OPS[name]
    x = LAYOUT_MAKERS[layout](dtype)
    y = make(SHAPE, dtype)
    check_fusion(lambda fd: fd.add_output(body(fd, fd.from_pytorch(x), fd.from_pytorch(y))), [x, y], reference, **TOL)
    # Both operands in the odd layout.
    y = LAYOUT_MAKERS[layout](dtype)
    check_fusion(lambda fd: fd.add_output(body(fd, fd.from_pytorch(x), fd.from_pytorch(y))), [x, y], reference, **TOL)


@pytest.mark.parametrize("name", list(LAYOUT_OPS))
def test_stride_order_defined_inputs(name):
    """Inputs declared with define_tensor(stride_order=...) rather than from_pytorch."""
    body, reference = LAYOUT_OPS[name]
    base = make((7, 3, 5))
    x = base.permute(1, 2, 0)  # logical [3, 5, 7]; allocation order [1, 2, 0] -> stride_order [0, 2, 1]
    y = make((3, 5, 7)).transpose(1, 2).contiguous().transpose(1, 2)  # stride_order [2, 0, 1]

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, stride_order=[1, 0, 2])
        u = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float, stride_order=[2, 0, 1])
        fd.add_output(body(fd, t, u))

    assert x.stride() == (5, 1, 15) and y.stride() == (35, 1, 5)
    check_fusion(fusion, [x, y], reference, **TOL)


# --------------------------------------------------------------------------------------------------------------
# ternary ops

WHERE_CASES = [(d, d, d) for d in ALL] + [
    (BF16, F32, F32),
    (I32, F16, F16),
    (I64, BOOL, I64),
]


@pytest.mark.parametrize("lhs,rhs,expected", WHERE_CASES, ids=[f"{ids([a])[0]}-{ids([b])[0]}" for a, b, _ in WHERE_CASES])
def test_where(lhs, rhs, expected):
    c, a, b = make(SHAPE, BOOL), tensor(lhs, layout="transposed"), tensor(rhs)

    def fusion(fd):
        fd.add_output(fd.ops.where(fd.from_pytorch(c), fd.from_pytorch(a), fd.from_pytorch(b)))

    # where selects values: it promotes like torch but does not widen BF16/Half to Float.
    out = check_fusion(fusion, [c, a, b], lambda c, a, b: torch.where(c, a.to(expected), b.to(expected)))[0]
    assert out.dtype == expected


@pytest.mark.parametrize(
    "lhs,rhs,dtype,expected",
    [(1.0, 2.0, F32, F64), (1, 2, F32, I64), (True, False, F32, BOOL), (2.5, None, I32, F32), (2, None, BF16, BF16)],
    ids=["double-double", "int-int", "bool-bool", "double-int32tensor", "int-bf16tensor"],
)
def test_where_with_scalars(lhs, rhs, dtype, expected):
    c, t = make(SHAPE, BOOL), tensor(dtype)

    def fusion(fd):
        pred = fd.from_pytorch(c)
        other = fd.from_pytorch(t) if rhs is None else rhs
        fd.add_output(fd.ops.where(pred, lhs, other))

    def reference(c, *rest):
        other = rest[0] if rest else torch.tensor(rhs, device=c.device)
        return torch.where(c, torch.tensor(lhs, dtype=expected, device=c.device), other.to(expected))

    out = check_fusion(fusion, [c] + ([t] if rhs is None else []), reference)[0]
    assert out.dtype == expected and out.shape == SHAPE


def test_where_symbolic_bool_predicate():
    x, y = tensor(F32), tensor(F32)

    def fusion(fd):
        p = fd.define_scalar(dtype=DataType.Bool)
        fd.add_output(fd.ops.where(p, fd.from_pytorch(x), fd.from_pytorch(y)))

    check_fusion(fusion, [False, x, y], lambda p, x, y: torch.where(torch.tensor(p), x, y))


@pytest.mark.parametrize("dtype", FLOATS + [C64], ids=ids(FLOATS + [C64]))
@pytest.mark.parametrize("weight", ["literal", "tensor"])
def test_lerp(dtype, weight):
    s, e = tensor(dtype), tensor(dtype, layout="transposed")
    w = tensor(dtype, "unit") if weight == "tensor" else 0.3

    def fusion(fd):
        ts, te = fd.from_pytorch(s), fd.from_pytorch(e)
        wv = fd.from_pytorch(w) if weight == "tensor" else w
        fd.add_output(fd.ops.lerp(ts, te, wv))

    c = float_of(dtype)
    inputs = [s, e] + ([w] if weight == "tensor" else [])

    def reference(s, e, *rest):
        wt = rest[0].to(c) if rest else w
        return torch.lerp(s.to(c), e.to(c), wt)

    out = check_fusion(fusion, inputs, reference, **TOL)[0]
    assert out.dtype == c


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=ids(FLOATS + INTS))
@pytest.mark.parametrize("bounds", [(-1, 2), (-0.5, 1.5)], ids=["int-bounds", "float-bounds"])
def test_clamp(dtype, bounds):
    lo, hi = bounds
    x = tensor(dtype, layout="sliced")

    def fusion(fd):
        fd.add_output(fd.ops.clamp(fd.from_pytorch(x), lo, hi))

    # clamp keeps the input dtype; the bounds are applied in the promoted type (so 1.5 clamps ints to 1).
    out = check_fusion(fusion, [x], lambda x: torch.clamp(x.to(widen(torch.result_type(x, hi))), lo, hi).to(x.dtype))[0]
    assert out.dtype == dtype


def test_clamp_symbolic_bounds():
    x = tensor(F32)

    def fusion(fd):
        lo, hi = fd.define_scalar(dtype=DataType.Double), fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.clamp(fd.from_pytorch(x), lo, hi))

    check_fusion(fusion, [-0.25, 0.75, x], lambda lo, hi, x: torch.clamp(x, lo, hi))


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=ids(FLOATS + INTS))
def test_threshold(dtype):
    x = tensor(dtype, layout="transposed")
    th, v = (1, 7) if not dtype.is_floating_point else (0.5, 2.5)

    def fusion(fd):
        fd.add_output(fd.ops.threshold(fd.from_pytorch(x), th, v))

    ref = lambda x: torch.nn.functional.threshold(x.to(widen(x.dtype)), th, v).to(x.dtype)  # noqa: E731
    out = check_fusion(fusion, [x], ref)[0]
    assert out.dtype == dtype


@pytest.mark.parametrize("th", [-0.5, 0.7, -2])
def test_threshold_of_ints_truncates_the_threshold(th):
    x = torch.tensor([[-2, -1, 0, 1, 2]], device=DEVICE)
    out = check_fusion(
        lambda fd: fd.add_output(fd.ops.threshold(fd.from_pytorch(x), th, 7)),
        [x],
        lambda x: torch.nn.functional.threshold(x, th, 7),
    )[0]
    assert out.dtype == I64


def test_threshold_keeps_nan():
    x = torch.tensor([[float("nan"), 0.2, 0.7, 0.5]], device=DEVICE)
    out = check_fusion(
        lambda fd: fd.add_output(fd.ops.threshold(fd.from_pytorch(x), 0.5, 2.0)),
        [x],
        lambda x: torch.nn.functional.threshold(x, 0.5, 2.0),
    )[0]
    assert math.isnan(out[0, 0].item())


@pytest.mark.parametrize("dtype", FLOATS + INTS + [C64], ids=ids(FLOATS + INTS + [C64]))
def test_addcmul(dtype):
    a, b, c = tensor(dtype), tensor(dtype, layout="transposed"), tensor(dtype)
    value = 2 if not (dtype.is_floating_point or dtype.is_complex) else 0.5

    def fusion(fd):
        fd.add_output(fd.ops.addcmul(fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(c), value))

    w = widen(dtype)
    out = check_fusion(fusion, [a, b, c], lambda a, b, c: torch.addcmul(a.to(w), b.to(w), c.to(w), value=value), **TOL)[0]
    assert out.dtype == w


def test_addcmul_default_value():
    a, b, c = tensor(F32), tensor(F32), tensor(F32)

    def fusion(fd):
        fd.add_output(fd.ops.addcmul(fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(c)))

    check_fusion(fusion, [a, b, c], lambda a, b, c: torch.addcmul(a, b, c), **TOL)


# --------------------------------------------------------------------------------------------------------------
# cast

CAST_TARGETS = {
    DataType.Float: F32,
    DataType.Double: F64,
    DataType.BFloat16: BF16,
    DataType.Half: F16,
    DataType.Int: I64,
    DataType.Int32: I32,
    DataType.Bool: BOOL,
    DataType.ComplexFloat: C64,
    DataType.Float8_e4m3fn: torch.float8_e4m3fn,
    DataType.Float8_e5m2: torch.float8_e5m2,
}
CAST_SOURCES = ALL + [torch.float8_e4m3fn]
CAST_CASES = [
    (src, dst)
    for src in CAST_SOURCES
    for dst in CAST_TARGETS
    if not (src.is_complex and CAST_TARGETS[dst].itemsize == 1 and CAST_TARGETS[dst] != BOOL)
]


@pytest.mark.parametrize("src,dst", CAST_CASES, ids=[f"{ids([s])[0]}-to-{d.name}" for s, d in CAST_CASES])
def test_cast(src, dst):
    x = make(SHAPE, src, low=-3, high=3) if src.itemsize == 1 and src != BOOL else tensor(src, layout="transposed")

    def fusion(fd):
        fd.add_output(fd.ops.cast(fd.from_pytorch(x), dst))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex -> real casts warn that the imaginary part is dropped
        out = check_fusion(fusion, [x], lambda x: x.to(CAST_TARGETS[dst]))[0]
    assert out.dtype == CAST_TARGETS[dst]


def test_cast_to_same_dtype_is_a_copy():
    x = tensor(F32, layout="transposed")
    fusion = lambda fd: fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.Float))  # noqa: E731
    check_fusion(fusion, [x], lambda x: x.clone())
    out = define(fusion).execute([x])[0]
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_cast_prints_dtype_keyword():
    x = tensor(F32)
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.Half)))
    assert "fd.ops.cast(tv0, dtype=DataType.Half)" in repr(fd)


# --------------------------------------------------------------------------------------------------------------
# result dtype rules, checked on the definition (TensorView dtype) and on the executed output

DTYPE_RULES = [
    # (id, builder(fd, x_bf16, x_f16, x_i32, x_i64, x_c64) -> Val, expected DataType)
    ("add(bf16,bf16)", lambda fd, b, h, i, l, c: fd.ops.add(b, b), DataType.Float),
    ("mul(f16,2.0)", lambda fd, b, h, i, l, c: fd.ops.mul(h, 2.0), DataType.Float),
    ("add(i32,i32)", lambda fd, b, h, i, l, c: fd.ops.add(i, i), DataType.Int32),
    ("add(i32,i64)", lambda fd, b, h, i, l, c: fd.ops.add(i, l), DataType.Int),
    ("add(i32,3)", lambda fd, b, h, i, l, c: fd.ops.add(i, 3), DataType.Int32),
    ("add(i64,2.5)", lambda fd, b, h, i, l, c: fd.ops.add(l, 2.5), DataType.Float),
    ("relu(bf16)", lambda fd, b, h, i, l, c: fd.ops.relu(b), DataType.BFloat16),
    ("ceil(f16)", lambda fd, b, h, i, l, c: fd.ops.ceil(h), DataType.Half),
    ("silu(bf16)", lambda fd, b, h, i, l, c: fd.ops.silu(b), DataType.BFloat16),
    ("abs(bf16)", lambda fd, b, h, i, l, c: fd.ops.abs(b), DataType.BFloat16),
    ("abs(c64)", lambda fd, b, h, i, l, c: fd.ops.abs(c), DataType.Float),
    ("neg(bf16)", lambda fd, b, h, i, l, c: fd.ops.neg(b), DataType.Float),
    ("neg(i32)", lambda fd, b, h, i, l, c: fd.ops.neg(i), DataType.Int32),
    ("exp(bf16)", lambda fd, b, h, i, l, c: fd.ops.exp(b), DataType.Float),
    ("exp(i64)", lambda fd, b, h, i, l, c: fd.ops.exp(l), DataType.Float),
    ("lt(bf16,bf16)", lambda fd, b, h, i, l, c: fd.ops.lt(b, b), DataType.Bool),
    ("eq(i64,3)", lambda fd, b, h, i, l, c: fd.ops.eq(l, 3), DataType.Bool),
    ("isnan(f16)", lambda fd, b, h, i, l, c: fd.ops.isnan(h), DataType.Bool),
    ("div(i64,i64)", lambda fd, b, h, i, l, c: fd.ops.div(l, l), DataType.Int),
    ("truediv(i64,i64)", lambda fd, b, h, i, l, c: fd.ops.truediv(l, l), DataType.Float),
    ("where(b,bf16,bf16)", lambda fd, b, h, i, l, c: fd.ops.where(fd.ops.gt(b, 0.0), b, b), DataType.BFloat16),
    ("real(c64)", lambda fd, b, h, i, l, c: fd.ops.real(c), DataType.Float),
    ("cast(i32,Half)", lambda fd, b, h, i, l, c: fd.ops.cast(i, DataType.Half), DataType.Half),
    ("add(bf16,f16)", lambda fd, b, h, i, l, c: fd.ops.add(b, h), DataType.Float),
]


@pytest.mark.parametrize("build,expected", [r[1:] for r in DTYPE_RULES], ids=[r[0] for r in DTYPE_RULES])
def test_result_dtype_rules(build, expected):
    inputs = [tensor(BF16), tensor(F16), tensor(I32, "pos"), tensor(I64, "pos"), tensor(C64)]
    seen = {}

    def fusion(fd):
        out = build(fd, *[fd.from_pytorch(t) for t in inputs])
        seen["dtype"] = out.dtype
        fd.add_output(out)

    fd = define(fusion)
    assert seen["dtype"] is expected
    out = fd.execute(inputs)[0]
    assert out.dtype == to_torch_dtype(expected)


@pytest.mark.parametrize("op", ["add", "mul", "where"])
def test_lower_rank_operand_broadcasts_from_the_right(op):
    # nvFuser's maybeBroadcast (and torch) align a lower-rank tensor operand to the right.
    a, b, c = make((4, 5)), make((5,)), make((4, 5)) > 0

    def fn(fd):
        ta, tb, tc = fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(c)
        fd.add_output(fd.ops.where(tc, ta, tb) if op == "where" else getattr(fd.ops, op)(ta, tb))

    ref = {"add": lambda a, b, c: a + b, "mul": lambda a, b, c: a * b, "where": lambda a, b, c: torch.where(c, a, b)}[op]
    check_fusion(fn, [a, b, c], ref)


def test_zero_dim_tensor_operand_broadcasts():
    x, s = make((3, 4)), make(())

    def fn(fd):
        fd.add_output(fd.ops.mul(fd.from_pytorch(s), fd.from_pytorch(x)))

    check_fusion(fn, [s, x], lambda s, x: s * x)


def test_aten_step_scalar_operands_follow_each_calls_value():
    """An ATen step keeps the last scalar operand's 0-dim tensor (found by identity): a runtime scalar that changes
    between calls, -0.0 after 0.0 (equal, other bits), True after 1 and a constant operand all give eager's
    values, bit for bit, call after call."""
    x = make((5,))
    fd = define(lambda fd: fd.add_output(fd.ops.add(fd.ops.mul(fd.from_pytorch(x), fd.define_scalar(DataType.Double)),
                                                    -0.0)))
    for s in (2.0, 3.5, 0.0, -0.0, 2.0, float("nan"), -0.0):
        (out,) = fd.execute([x, s], _disable_options=["kernel_codegen"])
        ref = x * torch.tensor(s, dtype=torch.float32) + torch.tensor(-0.0)
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32)) or (out.isnan().all() and ref.isnan().all())
    xi = torch.arange(-3, 3, dtype=torch.int64, device=DEVICE)
    fdi = define(lambda fd: fd.add_output(fd.ops.add(fd.from_pytorch(xi), fd.define_scalar(DataType.Int))))
    for s in (1, 2, 1):
        assert torch.equal(fdi.execute([xi, s], _disable_options=["kernel_codegen"])[0], xi + s)
