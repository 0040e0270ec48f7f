"""Random fusion programs for the differential fuzzer (tests/test_fuzz.py).

A program is a list of primitive ops over named values. From that one list we build
- the pyfuser fusion (``build_fusion``: one ``fd.ops.<name>`` call per op), and
- an independent eager reference (``run_reference``: one ATen call per op, with the dtype rules of
  docs/frontend.md "Result dtypes" written out here: promote like torch, compute Half/BF16 in Float, round only
  where an op's result dtype says so). The reference never touches pyfuser's evaluator.

Alongside dtype and shape, every value carries two numbers the comparison needs:
- ``mag``: a bound on its finite magnitudes (inputs are clamped), used to keep programs away from overflow;
- ``err``: a bound on |pyfuser - reference| for it. Ops that are correctly rounded in both implementations
  (add, sub, mul, div, casts, max/min, views, where, ...) keep ``err`` at 0 when their operands are exact, so
  exact chains are compared bit for bit; libdevice-vs-ATen transcendentals, float sums (summation order) and
  roundings of inexact values add to it. Discontinuous ops (comparisons, float->int casts, floor/round, fmod)
  only ever see exact operands, so a last-ulp difference upstream cannot flip them.
  A float ``mul`` is exact but flagged ``fma``: on a GPU, Triton may contract it with a following add/sub.

``Builder.apply(name, *args, **kwargs)`` infers the result values of one op (the regression tests in
test_fuzz.py write programs with it by hand); ``generate(seed)`` makes a random program with it.
``make_inputs`` builds the input tensors in their layouts, ``relaid_inputs`` the same values in other accepted
layouts. PYFUSER_FUZZ_MAX_DIM (default 9) raises the largest dim for GPU sweeps.
"""

from __future__ import annotations

import math
import os
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from pyfuser import DataType, FusionDefinition

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, BOOL = torch.int64, torch.int32, torch.bool
FLOATS = (F32, F64, BF16, F16)
REDUCED = (BF16, F16)
INTS = (I64, I32)

DATATYPE = {F32: DataType.Float, F64: DataType.Double, BF16: DataType.BFloat16, F16: DataType.Half,
            I64: DataType.Int, I32: DataType.Int32, BOOL: DataType.Bool}
SHORT = {F32: "f32", F64: "f64", BF16: "bf16", F16: "f16", I64: "i64", I32: "i32", BOOL: "bool"}
# One ulp, relative (the spacing of numbers in [1, 2)).
ULP = {F32: 2.0**-23, F64: 2.0**-52, BF16: 2.0**-7, F16: 2.0**-10}
# libdevice vs ATen transcendentals: a few ulps of the compute dtype.
TRANSCENDENTAL_ULPS = 4
FLOAT_MAG_LIMIT = 1e6  # keeps every float far from overflow
HALF_MAG_LIMIT = 1e4  # fp16's max is 65504
INT_MAG_LIMIT = 1e6
# PYFUSER_FUZZ_MAX_DIM (default 9) raises the largest dim, e.g. to 256 on the GPU for long rows and big tiles.
MAX_DIM = max(2, int(os.environ.get("PYFUSER_FUZZ_MAX_DIM", "9")))
MAX_NUMEL = max(512, 2 * MAX_DIM**2)
MAX_RANK = 4
MAX_OPS = 14  # primitive ops; a softmax or layer-norm chain is 6-10 of them


class Skip(Exception):
    """The generator's random choice does not fit the current values; it tries another."""


# --------------------------------------------------------------------------------------------------------------
# values and ops


@dataclass(eq=False)
class Val:
    name: str
    shape: tuple
    dtype: torch.dtype
    bcast: tuple = ()  # per dim: a size-1 broadcast dim in nvFuser's IR (may be expanded or squeezed)
    mag: float = 0.0  # bound on |finite values|
    err: float = 0.0  # bound on |pyfuser - reference|
    fma: bool = False  # a float product (a following add/sub may be contracted into an fma on the GPU)
    special: bool = False  # may hold NaN/inf
    lo: float = 0.0  # when > 0: every value is >= lo (so it is a safe divisor)
    scalar: bool = False  # a symbolic scalar input (a Python number at execute)
    # ops on this value's path that may legitimately decide the sign of a zero differently (ZERO_SIGN_OPS)
    zero_ops: frozenset = frozenset()
    # may hold an expanded broadcast dim in the IR (an expanded input, broadcast_in_dim/expand on its path): a
    # sum/prod over one scales by the extent, which makes a reduced-precision result Float, as in nvFuser
    repeats: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def exact(self) -> bool:
        return self.err == 0.0

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    def describe(self) -> str:
        flags = "".join([" special" if self.special else "", " fma" if self.fma else ""])
        kind = "scalar " if self.scalar else ""
        return f"{kind}{SHORT[self.dtype]}{list(self.shape)} mag={self.mag:.3g} err={self.err:.3g}{flags}"


@dataclass
class InputSpec:
    val: Val
    layout: str = "contiguous"  # see make_input
    dist: str = "normal"  # "normal" | "discrete" | "special" (floats only)
    seed: int = 0
    value: Any = None  # symbolic scalars: the Python number passed to execute
    static_sizes: bool = False  # fd.from_pytorch(t, static_sizes=True): concrete extents in the definition


@dataclass(eq=False)
class Op:
    name: str
    args: tuple
    kwargs: dict
    outs: list
    compute: Optional[torch.dtype] = None  # dtype the reference casts operands to


def _fmt(a) -> str:
    if isinstance(a, Val):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    if isinstance(a, DataType):
        return repr(a)
    return repr(a)


@dataclass
class Program:
    inputs: list = field(default_factory=list)  # InputSpec
    ops: list = field(default_factory=list)  # Op
    outputs: list = field(default_factory=list)  # Val
    seed: Optional[int] = None

    def describe(self, tensors: Optional[list] = None) -> str:
        lines = [f"program (seed {self.seed}):" if self.seed is not None else "program:", "  inputs:"]
        for k, spec in enumerate(self.inputs):
            v = spec.val
            if v.scalar:
                lines.append(f"    {v.name}: {v.describe()} = {spec.value!r}")
                continue
            extra = ""
            if tensors is not None:
                t = tensors[k]
                extra = f" strides={tuple(t.stride())} offset={t.storage_offset()}"
            static = " static_sizes" if spec.static_sizes else ""
            lines.append(f"    {v.name}: {v.describe()} layout={spec.layout} dist={spec.dist}{static}{extra}")
        lines.append("  ops:")
        for op in self.ops:
            lhs = ", ".join(o.name for o in op.outs)
            args = ", ".join([_fmt(a) for a in op.args] + [f"{k}={_fmt(v)}" for k, v in op.kwargs.items()])
            res = "; ".join(o.describe() for o in op.outs)
            lines.append(f"    {lhs} = {op.name}({args})    # {res}")
        lines.append("  outputs: " + ", ".join(o.name for o in self.outputs))
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# dtype rules (frontend.md "Result dtypes"), written independently of pyfuser


def promote(*operands) -> torch.dtype:
    """torch's promotion over Vals (tensors, or symbolic scalars) and Python numbers. Every tensor counts as a
    tensor, 0-dim ones included (nvFuser has no 0-dim special case)."""
    proxies = []
    for x in operands:
        if isinstance(x, Val) and not x.scalar:
            proxies.append(torch.empty(1, dtype=x.dtype))
        elif isinstance(x, Val):
            proxies.append({BOOL: False, I64: 0, I32: 0}.get(x.dtype, 0.0))
        else:
            proxies.append(x)
    result = proxies[0]
    for p in proxies[1:]:
        dt = torch.result_type(result, p)
        result = torch.empty(1, dtype=dt)
    return result.dtype if isinstance(result, torch.Tensor) else torch.result_type(torch.empty(1), result)


def _mag_limit(dt: torch.dtype) -> float:
    return HALF_MAG_LIMIT if dt == F16 else FLOAT_MAG_LIMIT if dt in FLOATS else INT_MAG_LIMIT


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    return F32 if dt in REDUCED else dt


def floatify(dt: torch.dtype) -> torch.dtype:
    return F32 if dt not in (F32, F64) else dt


def _rounding(dt: torch.dtype, mag: float, inexact: bool) -> float:
    """Error a rounding to ``dt`` can add: none when both sides round the same exact value."""
    return ULP.get(dt, 0.0) * mag if inexact else 0.0


def broadcast_shapes(vals: list) -> tuple[tuple, tuple]:
    """Right-aligned broadcast of tensor Vals. A size-1 dim only stretches when it is a broadcast dim in the IR
    (an Iteration dim of extent 1, e.g. from a slice, does not in nvFuser)."""
    rank = max(v.rank for v in vals)
    shape, bc = [], []
    for d in range(rank):
        sizes = []
        for v in vals:
            k = d - (rank - v.rank)
            if k >= 0:
                sizes.append((v.shape[k], v.bcast[k]))
        n = 0 if any(s == 0 for s, _ in sizes) else max(s for s, _ in sizes)
        for s, b in sizes:
            if s != n and not (s == 1 and b):
                raise Skip(f"shapes do not broadcast: {[v.shape for v in vals]}")
        shape.append(n)
        bc.append(all(b for s, b in sizes) and n == 1)
    return tuple(shape), tuple(bc)


# --------------------------------------------------------------------------------------------------------------
# op tables: (reference torch fn, ...) per op

# float unaries: name -> (torch fn, |f| bound given input mag, Lipschitz bound given the input Val, requirement)
def _lip_sqrt(x: Val, e: float) -> float:
    return e / (2 * math.sqrt(x.lo)) if x.lo > 0 else math.sqrt(e)


FLOAT_UNARY = {
    "exp": (torch.exp, lambda m: math.exp(m), lambda x, e: math.exp(x.mag) * e, lambda x: x.mag <= 6),
    "tanh": (torch.tanh, lambda m: 1.0, lambda x, e: e, None),
    "sigmoid": (torch.sigmoid, lambda m: 1.0, lambda x, e: 0.25 * e, None),
    "sin": (torch.sin, lambda m: 1.0, lambda x, e: e, None),
    "cos": (torch.cos, lambda m: 1.0, lambda x, e: e, None),
    "erf": (torch.erf, lambda m: 1.0, lambda x, e: 1.13 * e, None),
    "atan": (torch.atan, lambda m: 1.58, lambda x, e: e, None),
    "log1p": (torch.log1p, lambda m: math.log1p(m), lambda x, e: e, lambda x: x.lo > 0 or _nonneg(x)),
    "sqrt": (torch.sqrt, lambda m: math.sqrt(m), _lip_sqrt, lambda x: x.lo > 0 or _nonneg(x)),
    "log": (torch.log, lambda m: max(abs(math.log(m)), 1.0), lambda x, e: e / x.lo, lambda x: x.lo >= 0.5),
    "reciprocal": (torch.reciprocal, lambda m: 2.0, lambda x, e: e / x.lo**2, lambda x: x.lo >= 0.5),
    "rsqrt": (torch.rsqrt, lambda m: 1.5, lambda x, e: 0.5 * e * x.lo**-1.5, lambda x: x.lo >= 0.5),
}

# dtype-keeping unaries: name -> (torch fn, allowed dtypes, needs an exact (non-special) operand)
KEEP_UNARY = {
    "relu": (torch.relu, FLOATS + INTS, False),
    "abs": (torch.abs, FLOATS + INTS, False),
    "ceil": (torch.ceil, FLOATS + INTS, True),
    "floor": (torch.floor, FLOATS + INTS, True),
    "round": (torch.round, FLOATS + INTS, True),
    "trunc": (torch.trunc, FLOATS + INTS, True),
    "frac": (torch.frac, FLOATS, True),
    "sign": (torch.sign, FLOATS + INTS, True),
    "silu": (torch.nn.functional.silu, FLOATS, False),
    "bitwise_not": (torch.bitwise_not, INTS + (BOOL,), False),
    "set": (torch.clone, FLOATS + INTS + (BOOL,), False),
    "segment_set": (torch.clone, FLOATS + INTS + (BOOL,), False),
}

BOOL_UNARY = {
    "logical_not": (torch.logical_not, FLOATS + INTS + (BOOL,)),
    "isnan": (torch.isnan, FLOATS),
    "isfinite": (torch.isfinite, FLOATS),
    "signbit": (torch.signbit, FLOATS + INTS),
}

ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum}
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
LOGICAL = {"logical_and": torch.logical_and, "logical_or": torch.logical_or}
BITWISE = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor}
DIVISION = {"div", "truediv", "fmod", "remainder"}
REDUCTIONS = {"sum", "max", "min", "prod", "var", "var_mean"}
# Ops whose zero results may carry either sign depending on things eager does not fix: reductions combine ±0
# (and pad with +0) in an order of their own; on CPU, ATen's relu/maximum/minimum/clamp give a zero's sign by
# vectorized-vs-scalar loop (the kernels follow CUDA: max(+0, -0) = +0, min = -0, relu(-0) = +0).
ZERO_SIGN_OPS = {"sum", "max", "min", "prod", "var", "var_mean", "relu", "maximum", "minimum", "clamp", "cumsum"}
# Eager's CPU gather of bf16 (torch.gather, take_along_dim; torch 2.13) returns every NaN as 0xffff, a negative NaN,
# where the GPU and pyfuser move the bits unchanged (seed 100792 at MAX_DIM=40: signbit of gathered 0x7fc0). NaN
# signs are not values, so the model treats the sign of such a result's NaNs as unfixed (kept in ``zero_ops``).
NAN_SIGN_GATHER = "bf16 gather (NaN sign)"
# Eager's CPU scatter of bf16 and fp16 rewrites NaNs too, arg's included (bf16: 0xffff; fp16: arg's NaNs 0x7fff, a
# signalling NaN of src quieted; torch 2.13), where the kernel moves the bits unchanged: the same NaN-sign caveat.
NAN_SIGN_SCATTER = "16-bit scatter (NaN sign)"
ZERO_SIGN_OPS_EVERYWHERE = {"sum", "max", "min", "prod", "var", "var_mean", "cumsum"}
VIEWS = {"permute", "broadcast_in_dim", "broadcast", "expand", "squeeze", "reshape", "slice"}


def _nonneg(x: Val) -> bool:
    return getattr(x, "_nonneg", False)


def _nn(x) -> bool:
    """Known non-negative (a Val, or a Python number)."""
    return _nonneg(x) if isinstance(x, Val) else x >= 0


def _lo(x) -> float:
    return x.lo if isinstance(x, Val) else max(float(x), 0.0)


def _mark_nonneg(v: Val, flag: bool = True) -> Val:
    v._nonneg = flag
    return v


# --------------------------------------------------------------------------------------------------------------
# the builder: infers the values an op produces


class Builder:
    def __init__(self):
        self.program = Program()
        self.values: list[Val] = []  # every tensor Val (inputs and results), in creation order
        self._n = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    # --- inputs ---------------------------------------------------------------------------------------------
    def input(self, shape, dtype, layout="contiguous", dist="normal", seed=0) -> Val:
        shape = tuple(shape)
        if dist.startswith("index"):  # indices in [0, n)
            mag = float(int(dist[len("index"):]))
        elif dist == "distinct":  # a permutation of numel values (quarters for floats), see make_input
            mag = float(math.prod(shape)) / (4 if dtype in FLOATS else 1) + 1
        elif dtype == BOOL:
            mag = 1.0
        elif dtype in INTS:
            mag = float(torch.iinfo(dtype).max) if dist == "special" else 5.0
        else:
            mag = 2.0 if dist == "discrete" else 3.0
        v = Val(self._name("t"), shape, dtype, tuple(s == 1 for s in shape), mag=mag,
                special=dist in ("special", "distinct") and dtype in FLOATS)
        _mark_nonneg(v, dtype == BOOL)
        v.repeats = layout.startswith("expanded")
        self.program.inputs.append(InputSpec(v, layout, dist if dtype != BOOL else "normal", seed))
        self.values.append(v)
        return v

    def scalar_input(self, dtype, value) -> Val:
        v = Val(self._name("s"), (), dtype, (), mag=abs(float(value)), scalar=True)
        self.program.inputs.append(InputSpec(v, "scalar", value=value))
        return v

    def output(self, v: Val) -> None:
        self.program.outputs.append(v)

    # --- ops ------------------------------------------------------------------------------------------------
    def _emit(self, name, args, kwargs, outs, compute=None):
        inherited = frozenset().union(*[a.zero_ops for a in args if isinstance(a, Val)])
        if name in ZERO_SIGN_OPS:
            inherited |= {name}
        repeats = name in ("broadcast_in_dim", "expand") or any(a.repeats for a in args if isinstance(a, Val))
        for o in outs:
            o.zero_ops = o.zero_ops | inherited
            o.repeats = repeats
        self.program.ops.append(Op(name, tuple(args), dict(kwargs), outs, compute))
        self.values.extend(outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def apply(self, name: str, *args, **kwargs):
        if name in FLOAT_UNARY:
            return self._float_unary(name, *args)
        if name in KEEP_UNARY:
            return self._keep_unary(name, *args)
        if name == "neg":
            return self._neg(*args)
        if name in BOOL_UNARY:
            return self._bool_unary(name, *args)
        if name in ARITH or name in COMPARE or name in LOGICAL or name in BITWISE or name in DIVISION:
            return self._binary(name, *args)
        if name == "where":
            return self._where(*args)
        if name == "clamp":
            return self._clamp(*args)
        if name == "cast":
            return self._cast(*args, **kwargs)
        if name in REDUCTIONS:
            return self._reduction(name, *args, **kwargs)
        if name in VIEWS:
            return getattr(self, "_" + name)(*args, **kwargs)
        if name in ("index_select", "topk", "gather", "take_along_axis", "scatter", "argsort", "cumsum", "cummax",
                    "cummin"):
            return getattr(self, "_" + name)(*args, **kwargs)
        raise KeyError(name)

    # indexing and selection
    def _index_select(self, x: Val, index: Val, dim: int):
        shape, bc = list(x.shape), list(x.bcast)
        shape[dim], bc[dim] = index.shape[0], False
        out = self._new(shape, x.dtype, bc, x.mag, x.err, fma=x.fma, special=x.special, lo=x.lo, nonneg=_nonneg(x))
        return self._emit("index_select", [x, index], {"dim": dim}, [out])

    def _gather(self, x: Val, index: Val, dim: int):
        out = self._new(index.shape, x.dtype, index.bcast, x.mag, x.err, fma=x.fma, special=x.special, lo=x.lo,
                        nonneg=_nonneg(x))
        _mark_nan_sign(x, out)
        return self._emit("gather", [x, index], {"dim": dim}, [out])

    def _take_along_axis(self, x: Val, index: Val, dim: int):
        # Non-indexed dims broadcast between x and index; the indexed dim is the index's.
        shape = [i if d == dim or xs == 1 else xs for d, (i, xs) in enumerate(zip(index.shape, x.shape))]
        bc = [ib if d == dim else (ib and xb) for d, (ib, xb) in enumerate(zip(index.bcast, x.bcast))]
        out = self._new(shape, x.dtype, bc, x.mag, x.err, fma=x.fma, special=x.special, lo=x.lo, nonneg=_nonneg(x))
        _mark_nan_sign(x, out)
        return self._emit("take_along_axis", [x, index], {"dim": dim}, [out])

    def _scatter(self, x: Val, index: Val, src, dim: int):
        """Out-of-place scatter: every element is x's or src's (a tensor of x's dtype, or a number converted to it
        as ATen converts it), moved unchanged. An expanded dim of x becomes a plain one."""
        tensor = isinstance(src, Val)
        mag = max(x.mag, src.mag if tensor else abs(float(src)))
        err = max(x.err, src.err) if tensor else x.err
        special = x.special or (tensor and src.special)
        # (a number converted to an int dtype truncates: 0.5 into Int32 is 0, below any lo of x)
        lo = min(x.lo, _lo(src)) if tensor or x.is_float else 0.0
        bc = [b and n == 1 for b, n in zip(x.bcast, x.shape)]
        out = self._new(x.shape, x.dtype, bc, mag, err, fma=x.fma or (tensor and src.fma), special=special, lo=lo,
                        nonneg=_nonneg(x) and _nn(src))
        if x.dtype in (BF16, F16) and special:
            out.zero_ops = out.zero_ops | {NAN_SIGN_SCATTER}
        return self._emit("scatter", [x, index, src], {"dim": dim}, [out])

    def _cumsum(self, x: Val, dim: int):
        """Inclusive prefix sums along ``dim``: Int for integer/Bool inputs, else x's dtype computed in Float (or
        Double). Every prefix has the error bound of a sum over the whole dim (terms' errors plus an order-
        dependent rounding per term: eager's CPU loop, CUDA's tree and the kernel's tree all differ)."""
        out_dt = I64 if x.dtype in INTS + (BOOL,) else x.dtype
        c = compute_dtype(out_dt)
        n = x.shape[dim]
        mag = n * x.mag
        if c in FLOATS:
            if mag > _mag_limit(out_dt):
                raise Skip("magnitude")
            inexact = n > 1 or x.err > 0
            err = n * x.err + (ULP[c] * n * mag if inexact else 0.0)
            err += _rounding(out_dt, mag, inexact) if out_dt in REDUCED else 0.0
        else:
            if mag > INT_MAG_LIMIT:
                raise Skip("magnitude")
            err = 0.0
        out = self._new(x.shape, out_dt, x.bcast, mag, err, special=x.special, nonneg=_nonneg(x))
        return self._emit("cumsum", [x, dim], {}, [out], c)

    def _cummax(self, x: Val, dim: int):
        return self._running_extreme("cummax", x, dim)

    def _cummin(self, x: Val, dim: int):
        return self._running_extreme("cummin", x, dim)

    def _running_extreme(self, name, x: Val, dim: int):
        """cummax/cummin: x's dtype, exact (every prefix is one of x's values)."""
        out = self._new(x.shape, x.dtype, x.bcast, x.mag, x.err, special=x.special, lo=x.lo, nonneg=_nonneg(x))
        return self._emit(name, [x, dim], {}, [out], compute_dtype(x.dtype))

    def _argsort(self, x: Val, dim: int, descending: bool, stable: bool):
        out = self._new(x.shape, I64, x.bcast, float(x.shape[dim]), 0.0, nonneg=True)
        return self._emit("argsort", [x], {"dim": dim, "descending": descending, "stable": stable}, [out])

    def _topk(self, x: Val, k: int, dim: int, largest: bool):
        shape, bc = list(x.shape), list(x.bcast)
        shape[dim], bc[dim] = k, False
        values = self._new(shape, x.dtype, bc, x.mag, x.err, special=x.special, lo=x.lo, nonneg=_nonneg(x))
        indices = self._new(shape, I64, bc, float(x.shape[dim]), 0.0, nonneg=True)
        return self._emit("topk", [x, k], {"dim": dim, "largest": largest, "sorted": True}, [values, indices])

    def _new(self, shape, dtype, bcast, mag, err, *, fma=False, special=False, lo=0.0, nonneg=False) -> Val:
        v = Val(self._name("v"), tuple(shape), dtype, tuple(bcast), mag=mag, err=err, fma=fma, special=special, lo=lo)
        return _mark_nonneg(v, nonneg or lo > 0)

    # unaries
    def _float_unary(self, name, x: Val):
        fn, mag_fn, lip, req = FLOAT_UNARY[name]
        if req is not None and not req(x):
            raise Skip(f"{name} needs a different operand")
        c = floatify(x.dtype)
        mag = mag_fn(x.mag)
        err = lip(x, x.err) + TRANSCENDENTAL_ULPS * ULP[c] * max(mag, 1e-30)
        lo = {"exp": math.exp(-x.mag), "sqrt": math.sqrt(x.lo), "reciprocal": 1.0 / max(x.mag, 1e-30),
              "rsqrt": 1.0 / math.sqrt(max(x.mag, 1e-30))}.get(name, 0.0)
        nonneg = name in ("exp", "sigmoid", "sqrt", "log1p", "reciprocal", "rsqrt")
        out = self._new(x.shape, c, x.bcast, mag, err, special=x.special, lo=lo, nonneg=nonneg)
        return self._emit(name, [x], {}, [out], c)

    def _keep_unary(self, name, x: Val):
        fn, allowed, needs_exact = KEEP_UNARY[name]
        if x.dtype not in allowed or (needs_exact and (not x.exact or x.special)):
            raise Skip(name)
        c = compute_dtype(x.dtype)
        mag = {"frac": 1.0, "sign": 1.0, "ceil": x.mag + 1, "floor": x.mag + 1, "round": x.mag + 1}.get(name, x.mag)
        err = x.err
        if name == "silu":
            err = 1.1 * x.err + TRANSCENDENTAL_ULPS * ULP[c] * mag
        err += _rounding(x.dtype, mag, err > 0) if x.dtype in REDUCED else 0.0
        nonneg = name in ("relu", "abs") or (name in ("set", "segment_set") and _nonneg(x))
        lo = x.lo if name in ("abs", "relu", "set", "segment_set") else 0.0
        out = self._new(x.shape, x.dtype, x.bcast, mag, err, special=x.special, lo=lo, nonneg=nonneg)
        return self._emit(name, [x], {}, [out], c)

    def _neg(self, x: Val):
        if x.dtype == BOOL:
            raise Skip("neg of bool")
        c = compute_dtype(x.dtype)
        return self._emit("neg", [x], {}, [self._new(x.shape, c, x.bcast, x.mag, x.err, special=x.special)], c)

    def _bool_unary(self, name, x: Val):
        fn, allowed = BOOL_UNARY[name]
        if x.dtype not in allowed or not x.exact:
            raise Skip(name)
        if name == "signbit" and x.zero_ops & (ZERO_SIGN_OPS | {NAN_SIGN_GATHER, NAN_SIGN_SCATTER}):
            # The sign of a zero that an earlier op decides by its own order (relu(-0.0) on CPU: seed 50784), or of
            # a NaN that eager's CPU gather rewrites (below), would become a Bool that differs.
            raise Skip("signbit of a zero or NaN of unfixed sign")
        out = self._new(x.shape, BOOL, x.bcast, 1.0, 0.0)
        return self._emit(name, [x], {}, [out], compute_dtype(x.dtype))

    # binaries
    def _binary(self, name, a, b):
        tensors = [v for v in (a, b) if isinstance(v, Val) and not v.scalar]
        if not tensors:
            raise Skip("binary op without a tensor operand")
        shape, bc = broadcast_shapes(tensors)
        p = promote(a, b)
        ma = a.mag if isinstance(a, Val) else abs(a)
        mb = b.mag if isinstance(b, Val) else abs(b)
        ea = a.err if isinstance(a, Val) else 0.0
        eb = b.err if isinstance(b, Val) else 0.0
        fma_in = any(isinstance(v, Val) and v.fma for v in (a, b))
        special = any(isinstance(v, Val) and v.special for v in (a, b))
        exact_in = ea == 0 and eb == 0
        lo = 0.0
        nonneg = False
        fma = False
        if name in COMPARE or name in LOGICAL:
            if not exact_in:
                raise Skip(f"{name} of inexact operands")
            c = compute_dtype(p) if name in COMPARE else BOOL
            out = self._new(shape, BOOL, bc, 1.0, 0.0)
            return self._emit(name, [a, b], {}, [out], c)
        if name in BITWISE:
            if p not in INTS + (BOOL,):
                raise Skip(name)
            mag = 2 ** math.ceil(math.log2(max(ma, mb, 1) + 1))
            return self._emit(name, [a, b], {}, [self._new(shape, p, bc, mag, 0.0)], p)
        if name in DIVISION:
            return self._division(name, a, b, p, shape, bc, ma, mb, ea, eb, special)
        c = compute_dtype(p)
        if c == BOOL and name == "sub":
            raise Skip("sub of bools")
        if name in ("add", "sub"):
            mag = ma + mb
            inexact = not exact_in or (fma_in and c in FLOATS)
            err = ea + eb + (ULP.get(c, 0.0) * 2 * mag if inexact else 0.0)
            if name == "add" and all(_nn(v) for v in (a, b)):
                nonneg, lo = True, _lo(a) + _lo(b)
        elif name == "mul":
            if (isinstance(a, Val) and a.special and eb > 0) or (isinstance(b, Val) and b.special and ea > 0):
                # An inexact zero times an infinity: NaN where the value is exactly 0, ±inf where it is a
                # rounding away from it (seed 63741: x - mean(x) of equal values).
                raise Skip("mul of an inexact value by one that may be infinite")
            mag = ma * mb
            err = ea * mb + eb * ma + ea * eb + _rounding(c, mag, not exact_in)
            fma = c in FLOATS
            nonneg = all(_nn(v) for v in (a, b))
        else:  # maximum / minimum
            mag = max(ma, mb)
            err = max(ea, eb)
        if c == BOOL:
            mag = 1.0
        limit = _mag_limit(c)
        if mag > limit:
            raise Skip(f"{name}: magnitude {mag:g}")
        out = self._new(shape, c, bc, mag, err, fma=fma, special=special, lo=lo, nonneg=nonneg)
        return self._emit(name, [a, b], {}, [out], c)

    def _division(self, name, a, b, p, shape, bc, ma, mb, ea, eb, special):
        lob = _lo(b)
        if lob <= 0:
            raise Skip(f"{name}: the divisor must be known positive")
        if p == BOOL and name != "truediv":
            raise Skip(f"{name} of bools")
        if name == "truediv" or (name == "div" and p in FLOATS):
            c = floatify(p) if name == "truediv" else compute_dtype(p)
            mag = ma / lob
            err = ea / lob + ma * eb / lob**2 + _rounding(c, mag, not (ea == 0 and eb == 0))
            out = self._new(shape, c, bc, mag, err, special=special)
            return self._emit(name, [a, b], {}, [out], c)
        c = compute_dtype(p)
        # Integer div, fmod, remainder: discontinuous, so the operands must be exact; then the result is too.
        if ea or eb or special:
            raise Skip(f"{name} of inexact operands")
        if c in INTS and lob < 1:
            raise Skip("integer divisor may be 0")
        mag = ma if name == "div" else mb
        nonneg = name == "remainder"
        return self._emit(name, [a, b], {}, [self._new(shape, c, bc, mag, 0.0, nonneg=nonneg)], c)

    def _where(self, cond: Val, a, b):
        if not isinstance(cond, Val) or cond.dtype != BOOL or cond.scalar:
            raise Skip("where needs a bool tensor")
        operands = [cond] + [v for v in (a, b) if isinstance(v, Val) and not v.scalar]
        if len(operands) == 1:
            raise Skip("where of two scalars")
        shape, bc = broadcast_shapes(operands)
        p = promote(a, b)
        mags = [v.mag if isinstance(v, Val) else abs(v) for v in (a, b)]
        errs = [v.err if isinstance(v, Val) else 0.0 for v in (a, b)]
        special = any(isinstance(v, Val) and v.special for v in (a, b))
        # where only selects: promote() never narrows a tensor operand, so nothing is rounded
        out = self._new(shape, p, bc, max(mags), max(errs), special=special)
        return self._emit("where", [cond, a, b], {}, [out], p)

    def _clamp(self, x: Val, lo, hi):
        if x.dtype == BOOL:
            raise Skip("clamp of bool")
        c = compute_dtype(promote(x, lo, hi))
        if x.dtype in INTS and c in FLOATS and not x.exact:
            raise Skip("clamp to int of inexact")
        mag = min(x.mag, max(abs(lo), abs(hi)))
        err = x.err + _rounding(x.dtype, mag, x.err > 0)
        out = self._new(x.shape, x.dtype, x.bcast, mag, err, special=x.special)
        return self._emit("clamp", [x, lo, hi], {}, [out], c)

    def _cast(self, x: Val, dtype: torch.dtype):
        if dtype == x.dtype:
            raise Skip("cast to the same dtype")
        if x.is_float and dtype not in FLOATS:
            if not x.exact or x.special:
                raise Skip("float -> int/bool cast of an inexact value")
        if dtype == I32 and x.mag > 2**30:
            raise Skip("int32 overflow")
        if dtype == F16 and x.mag > HALF_MAG_LIMIT:
            raise Skip("fp16 overflow")
        mag = 1.0 if dtype == BOOL else (math.trunc(x.mag) if dtype in INTS and x.is_float else x.mag)
        narrowing = dtype in FLOATS and (x.dtype not in FLOATS or ULP[dtype] > ULP.get(x.dtype, 0.0))
        err = x.err + _rounding(dtype, x.mag, x.err > 0 and narrowing)
        if dtype in FLOATS:
            lo = x.lo * (1 - ULP[dtype])
        else:
            lo = math.floor(x.lo) if dtype in INTS and x.lo >= 1 else 0.0
        out = self._new(x.shape, dtype, x.bcast, mag, err if dtype in FLOATS else 0.0, special=x.special,
                        lo=lo, nonneg=_nonneg(x) and dtype != BOOL)
        return self._emit("cast", [x], {"dtype": dtype}, [out], dtype)

    # reductions
    def _reduction(self, name, x: Val, dims, keepdim=False, correction=None, dtype=None):
        dims = sorted(dims)
        if not dims or x.rank == 0:
            raise Skip("no dims")
        n = math.prod(x.shape[d] for d in dims)
        if keepdim:
            shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
            bc = tuple(True if d in dims else b for d, b in enumerate(x.bcast))
        else:
            shape = tuple(s for d, s in enumerate(x.shape) if d not in dims)
            bc = tuple(b for d, b in enumerate(x.bcast) if d not in dims)
        kwargs = {"dims": dims, "keepdim": keepdim}
        if name in ("sum", "prod"):
            src = dtype if dtype is not None else (I64 if x.dtype in INTS + (BOOL,) else x.dtype)
            if dtype is not None:
                kwargs["dtype"] = dtype
            if src in REDUCED and x.repeats:
                raise Skip("reduced-precision sum/prod over a possibly expanded dim (its dtype depends on the IR)")
            c = compute_dtype(src)
            mag = n * x.mag if name == "sum" else x.mag**n
            if c in FLOATS:
                if mag > _mag_limit(src):
                    raise Skip("magnitude")
                # every term may differ by err, and the summation order differs
                inexact = n > 1 or x.err > 0
                err = n * x.err if name == "sum" else n * x.err * max(x.mag, 1) ** (n - 1)
                err += ULP[c] * n * mag if inexact else 0.0
                err += _rounding(src, mag, inexact) if src in REDUCED else 0.0
            else:
                if x.is_float:
                    raise Skip("sum of floats into an integer dtype")
                if mag > INT_MAG_LIMIT:
                    raise Skip("magnitude")
                err = 0.0
            out = self._new(shape, src, bc, mag, err, special=x.special, nonneg=_nonneg(x))
            return self._emit(name, [x], kwargs, [out], c)
        if name in ("max", "min"):
            c = compute_dtype(x.dtype)
            out = self._new(shape, x.dtype, bc, x.mag, x.err, special=x.special, lo=x.lo, nonneg=_nonneg(x))
            return self._emit(name, [x], kwargs, [out], c)
        # var, var_mean
        if not x.is_float:
            raise Skip("var of a non-float")
        if x.special:
            # torch's Welford mean of a row holding inf is NaN (inf - inf in the update), a two-pass mean is inf:
            # a known difference (test_regression_var_mean_of_inf), kept out of the random programs.
            raise Skip("var of NaN/inf")
        c = compute_dtype(x.dtype)
        correction = 1 if correction is None else correction
        kwargs = {"dims": dims, "correction": correction, "keepdim": keepdim}
        err_mean = x.err + ULP[c] * n * x.mag
        special = x.special or n - correction <= 0
        denom = max(n - correction, 1)
        var_mag = (2 * x.mag) ** 2 * n / denom
        err_var = (2 * (2 * x.mag) * (x.err + err_mean) * n + ULP[c] * n * n * (2 * x.mag) ** 2) / denom
        var = self._new(shape, c, bc, var_mag, err_var, special=special, nonneg=True)
        if name == "var":
            return self._emit(name, [x], kwargs, [var], c)
        mean = self._new(shape, c, bc, x.mag, err_mean, special=x.special)
        return self._emit(name, [x], kwargs, [var, mean], c)

    # views
    def _view(self, name, x: Val, kwargs, shape, bcast):
        out = self._new(shape, x.dtype, bcast, x.mag, x.err, fma=x.fma, special=x.special, lo=x.lo, nonneg=_nonneg(x))
        return self._emit(name, [x], kwargs, [out])

    def _permute(self, x: Val, dims):
        return self._view("permute", x, {"dims": list(dims)}, [x.shape[d] for d in dims], [x.bcast[d] for d in dims])

    def _broadcast_in_dim(self, x: Val, shape, broadcast_dims):
        bc = [True] * len(shape)
        for j, d in enumerate(broadcast_dims):
            if x.shape[j] != shape[d] and not (x.shape[j] == 1 and x.bcast[j]):
                raise Skip("broadcast_in_dim of a non-broadcast dim")
            bc[d] = x.bcast[j] and shape[d] == 1
        bc = [b and s == 1 for b, s in zip(bc, shape)]
        return self._view("broadcast_in_dim", x, {"shape": list(shape), "broadcast_dims": list(broadcast_dims)},
                          shape, bc)

    def _broadcast(self, x: Val, is_broadcast_dim):
        it = iter(zip(x.shape, x.bcast))
        shape, bc = [], []
        for flag in is_broadcast_dim:
            s, b = (1, True) if flag else next(it)
            shape.append(s)
            bc.append(b)
        return self._view("broadcast", x, {"is_broadcast_dim": list(is_broadcast_dim)}, shape, bc)

    def _expand(self, x: Val, shape):
        new = len(shape) - x.rank
        bc = [s == 1 for s in shape[:new]]
        for i, (s, b) in enumerate(zip(x.shape, x.bcast)):
            if s != shape[new + i] and not (s == 1 and b):
                raise Skip("expand of a non-broadcast dim")
            bc.append(b and shape[new + i] == 1)
        return self._view("expand", x, {"shape": list(shape)}, shape, bc)

    def _squeeze(self, x: Val, dims):
        if any(not (x.shape[d] == 1 and x.bcast[d]) for d in dims):
            raise Skip("squeeze of a non-broadcast dim")
        keep = [d for d in range(x.rank) if d not in dims]
        return self._view("squeeze", x, {"dims": list(dims)}, [x.shape[d] for d in keep], [x.bcast[d] for d in keep])

    def _reshape(self, x: Val, new_shape):
        if math.prod(new_shape) != x.numel:
            raise Skip("reshape numel")
        return self._view("reshape", x, {"new_shape": list(new_shape)}, new_shape, [s == 1 for s in new_shape])

    def _slice(self, x: Val, start_indices, end_indices):
        shape, bc = [], []
        for s, e, n, b in zip(start_indices, end_indices, x.shape, x.bcast):
            if e - s == 1 and (s, e) != (0, n):
                # An extent of 1 cut out of a dim is a broadcast in the IR when the extent is known at definition
                # (nvFuser's resize), else an iteration dim: a reduction over it is a view in one case and a new
                # tensor in the other, which this model does not track (seed 30864 on the H200).
                raise Skip("a slice to extent 1")
            shape.append(e - s)
            bc.append(b if (s, e) == (0, n) else False)
        if all((s, e) == (0, n) for s, e, n in zip(start_indices, end_indices, x.shape)):
            raise Skip("a full slice is a set")
        return self._view("slice", x, {"start_indices": list(start_indices), "end_indices": list(end_indices)},
                          shape, bc)


# --------------------------------------------------------------------------------------------------------------
# building and running both sides


def make_input(spec: InputSpec, device) -> Any:
    """The tensor of an input spec, built on ``device`` with the spec's layout (views are taken on the device,
    so the layout survives the transfer)."""
    if spec.val.scalar:
        return spec.value
    v = spec.val
    shape, dt = list(v.shape), v.dtype
    g = torch.Generator().manual_seed(spec.seed)

    def fill(storage_shape):
        storage_shape = list(storage_shape)
        if spec.dist.startswith("index"):
            t = torch.randint(0, int(spec.dist[len("index"):]), storage_shape, generator=g).to(dt)
        elif spec.dist == "distinct":
            # No two elements equal (top-k's tie order is unspecified in eager): a permutation; floats in quarters
            # with one NaN, +inf, -inf and the zero made -0.0 at random places.
            n = math.prod(storage_shape)
            t = (torch.randperm(n, generator=g) - n // 2).to(torch.float64 if dt in FLOATS else dt)
            if dt in FLOATS:
                t = t * 0.25
                t = torch.where(t == 0, -0.0, t)
                pos = torch.randperm(n, generator=g)[:3]
                t[pos] = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)[: pos.numel()]
            t = t.reshape(storage_shape).to(dt)
        elif dt == BOOL:
            t = torch.randint(0, 2, storage_shape, generator=g).bool()
        elif dt in INTS:
            t = torch.randint(-5, 6, storage_shape, generator=g).to(dt)
            if spec.dist == "special":  # integer extremes among small values
                ii = torch.iinfo(dt)
                extremes = torch.tensor([ii.min, ii.max, ii.min + 1, 0, -1], dtype=dt)
                _sprinkle(t.view(-1), extremes, g)
        else:
            if spec.dist == "discrete":  # halves in [-2, 2]: ties for comparisons, max/min and round
                t = torch.randint(-4, 5, storage_shape, generator=g).double() * 0.5
                # half of the zeros negative: exact chains then check the sign of zero bit for bit
                t = torch.where((t == 0) & (torch.rand(storage_shape, generator=g) < 0.5), -0.0, t)
            else:
                t = torch.randn(storage_shape, generator=g, dtype=torch.float64).clamp(-3, 3)
            t = t.to(dt)
            if spec.dist == "special":
                _sprinkle(t.view(-1), special_floats(dt), g)
        return t.to(device)

    layout = spec.layout
    if layout == "contiguous":
        return fill(shape)
    if layout == "transposed":
        return fill(shape[:-2] + [shape[-1], shape[-2]]).transpose(-1, -2)
    if layout == "sliced":  # rows of a wider tensor
        return fill(shape[:-1] + [shape[-1] + 3])[..., : shape[-1]]
    if layout == "strided":  # every other element of the innermost dim
        return fill(shape[:-1] + [2 * shape[-1]])[..., ::2]
    if layout == "offset":  # a slice of the outermost dim: a storage offset
        return fill([shape[0] + 2] + shape[1:])[1 : 1 + shape[0]]
    if layout == "head":  # contiguous, at the start of a storage 8x taller (wrong indexing stays in bounds)
        return fill([8 * shape[0]] + shape[1:])[: shape[0]]
    if layout.startswith("expanded"):
        d = int(layout[len("expanded"):])
        base = list(shape)
        base[d] = 1
        return fill(base).expand(shape)
    if layout.startswith("permuted"):  # memory order given by the digits, outermost first
        order = [int(c) for c in layout[len("permuted"):]]
        t = fill([shape[d] for d in order])
        inverse = [order.index(d) for d in range(len(order))]
        return t.permute(inverse)
    if layout == "negbit":  # a view with the negative bit set: memory holds -value
        return torch._neg_view(torch.neg(fill(shape)))
    if layout == "conjimag":  # the imaginary part of a conjugated complex tensor (negative bit set)
        t = fill(shape)
        return torch.complex(torch.zeros_like(t), torch.neg(t)).conj().imag
    raise ValueError(layout)


def special_floats(dt: torch.dtype) -> torch.Tensor:
    """NaN, ±inf, ±0, subnormals (of ``dt`` itself) and the smallest normal number."""
    fi = torch.finfo(dt)
    return torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, fi.tiny / 4, -fi.tiny / 2, fi.tiny],
                        dtype=torch.float64).to(dt)


def _sprinkle(flat: torch.Tensor, values: torch.Tensor, g: torch.Generator) -> None:
    """Overwrite about an eighth of ``flat`` (at least one element) with draws from ``values``."""
    if flat.numel() == 0:
        return
    idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 8)]
    flat[idx] = values[torch.randint(0, values.numel(), (idx.numel(),), generator=g)]


def make_inputs(program: Program, device) -> list:
    return [make_input(spec, device) for spec in program.inputs]


def relaid_inputs(program: Program, inputs: list) -> Optional[list]:
    """The same values in other layouts the fusion's input definitions still accept (a second input signature
    for the same FusionDefinition): row-sliced, strided, offset and 'head' tensors become contiguous, contiguous
    ones move to a storage offset of one element (a pointer no longer 16-byte aligned). None if nothing moves."""
    out, moved = [], False
    for spec, x in zip(program.inputs, inputs):
        if not isinstance(x, torch.Tensor) or x.numel() <= 1:
            out.append(x)
        elif spec.layout in ("sliced", "strided", "offset", "head"):
            out.append(x.contiguous())
            moved = True
        elif spec.layout in ("negbit", "conjimag"):  # the same values without the negative bit
            out.append(x.resolve_neg().clone())
            moved = True
        elif spec.layout == "contiguous":
            buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
            alt = buf[1:].view(x.shape)
            alt.copy_(x)
            out.append(alt)
            moved = True
        else:
            out.append(x)
    return out if moved else None


def build_fusion(program: Program, inputs: list) -> FusionDefinition:
    with FusionDefinition() as fd:
        env: dict[int, Any] = {}
        for spec, x in zip(program.inputs, inputs):
            if spec.val.scalar:
                env[id(spec.val)] = fd.define_scalar(dtype=DATATYPE[spec.val.dtype])
            else:
                env[id(spec.val)] = fd.from_pytorch(x, static_sizes=spec.static_sizes)

        def res(a):
            if isinstance(a, Val):
                return env[id(a)]
            if isinstance(a, torch.dtype):
                return DATATYPE[a]
            return a

        for op in program.ops:
            args = [res(a) for a in op.args]
            kwargs = {k: res(v) for k, v in op.kwargs.items() if k != "symbolic"}
            if op.kwargs.get("symbolic"):
                kwargs["shape"] = _symbolic_shape(fd, op, args[0])
            result = getattr(fd.ops, op.name)(*args, **kwargs)
            results = result if isinstance(result, tuple) else (result,)
            if len(results) != len(op.outs):
                raise AssertionError(f"fd.ops.{op.name} returned {len(results)} values, expected {len(op.outs)}")
            for o, r in zip(op.outs, results):
                env[id(o)] = r
        for v in program.outputs:
            fd.add_output(env[id(v)])
    return fd


def _symbolic_shape(fd, op: Op, tv) -> list:
    """broadcast_in_dim/expand's shape with fd.ops.size(input, j) wherever the entry is input dim j's extent
    (as Thunder writes them): the extents are then Int scalars computed at run time."""
    x, shape = op.args[0], list(op.kwargs["shape"])
    if op.name == "broadcast_in_dim":
        src = {d: j for j, d in enumerate(op.kwargs["broadcast_dims"])}
    else:
        src = {len(shape) - x.rank + j: j for j in range(x.rank)}
    # Not for extent-1 dims: pyfuser's size() of a broadcast dim is a symbolic Int, which would make the dim an
    # expanded broadcast of unknown extent (squeeze then refuses it).
    return [fd.ops.size(tv, src[d]) if d in src and x.shape[src[d]] == n > 1 else n for d, n in enumerate(shape)]


def _cast_operand(x, dt, device):
    if isinstance(x, torch.Tensor):
        return x.to(dt)
    return torch.tensor(x, dtype=dt, device=device)


def _prod(x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


def _ref_op(op: Op, args: list, device):
    """One op, eagerly, with ATen."""
    name, kw, c = op.name, op.kwargs, op.compute
    out_dt = op.outs[0].dtype
    if name in FLOAT_UNARY:
        return FLOAT_UNARY[name][0](args[0].to(c))
    if name in KEEP_UNARY:
        return KEEP_UNARY[name][0](args[0].to(c)).to(out_dt)
    if name == "neg":
        return torch.neg(args[0].to(c))
    if name in BOOL_UNARY:
        return BOOL_UNARY[name][0](args[0].to(c))
    if name in ARITH or name in COMPARE or name in LOGICAL or name in BITWISE:
        fn = {**ARITH, **COMPARE, **LOGICAL, **BITWISE}[name]
        a, b = (_cast_operand(x, c, device) for x in args)
        return fn(a, b)
    if name in DIVISION:
        a, b = (_cast_operand(x, c, device) for x in args)
        if name == "div":
            return torch.div(a, b, rounding_mode="trunc") if c in INTS else torch.div(a, b)
        return {"truediv": torch.true_divide, "fmod": torch.fmod, "remainder": torch.remainder}[name](a, b)
    if name == "where":
        cond, a, b = args
        return torch.where(cond, _cast_operand(a, c, device), _cast_operand(b, c, device))
    if name == "clamp":
        x, lo, hi = args
        return torch.clamp(x.to(c), lo, hi).to(out_dt)
    if name == "cast":
        return args[0].to(kw["dtype"])
    if name in ("sum", "prod", "max", "min") and not kw["keepdim"] and all(
            op.args[0].bcast[d] and op.args[0].shape[d] == 1 for d in kw["dims"]):
        # Reducing only size-1 broadcast dims is a squeeze in nvFuser's IR and in pyfuser (after sum/prod's
        # dtype cast): a view, so it aliases what its operand aliases.
        x = args[0] if name in ("max", "min") else args[0].to(kw.get("dtype") or out_dt)
        return x.squeeze(kw["dims"])
    if name in ("sum", "prod"):
        x = args[0].to(kw.get("dtype") or out_dt).to(c)
        fn = (lambda t: torch.sum(t, kw["dims"], keepdim=kw["keepdim"])) if name == "sum" else (
            lambda t: _prod(t, kw["dims"], kw["keepdim"]))
        return fn(x).to(out_dt)
    if name in ("max", "min"):
        fn = torch.amax if name == "max" else torch.amin
        return fn(args[0].to(c), kw["dims"], keepdim=kw["keepdim"]).to(out_dt)
    if name == "var":
        return torch.var(args[0].to(c), kw["dims"], correction=kw["correction"], keepdim=kw["keepdim"])
    if name == "var_mean":
        return torch.var_mean(args[0].to(c), kw["dims"], correction=kw["correction"], keepdim=kw["keepdim"])
    if name == "index_select":
        return torch.index_select(args[0], kw["dim"], args[1])
    if name == "gather":
        return torch.gather(args[0], kw["dim"], args[1].long())
    if name == "scatter":  # on CPU: ATen's CPU scatter keeps the last of repeated indices (CUDA's is unspecified)
        x, idx, src = args
        src = src.cpu() if isinstance(src, torch.Tensor) else src
        return torch.scatter(x.cpu(), kw["dim"], idx.cpu().long(), src).to(x.device)
    if name == "cumsum":
        return torch.cumsum(args[0].to(out_dt).to(c), args[1]).to(out_dt)
    if name in ("cummax", "cummin"):
        return getattr(torch, name)(args[0], args[1]).values
    if name == "argsort":  # stable, or over 'distinct' inputs: one order either way
        return torch.argsort(args[0], dim=kw["dim"], descending=kw["descending"], stable=kw["stable"])
    if name == "take_along_axis":
        return torch.take_along_dim(args[0], args[1].long(), kw["dim"])
    if name == "topk":  # values all distinct (the "distinct" inputs): eager's tie order never matters
        return tuple(torch.topk(args[0], args[1], dim=kw["dim"], largest=kw["largest"], sorted=True))
    x = args[0]
    if name == "permute":
        return x.permute(kw["dims"])
    if name == "broadcast_in_dim":
        y = x
        for d in range(len(kw["shape"])):
            if d not in kw["broadcast_dims"]:
                y = y.unsqueeze(d)
        return y.expand(kw["shape"])
    if name == "broadcast":
        return x[tuple(None if f else slice(None) for f in kw["is_broadcast_dim"])]
    if name == "expand":
        return x.expand(kw["shape"])
    if name == "squeeze":
        return x.squeeze(kw["dims"]) if kw["dims"] else x
    if name == "reshape":
        return x.reshape(kw["new_shape"])
    if name == "slice":
        return x[tuple(slice(s, e) for s, e in zip(kw["start_indices"], kw["end_indices"]))]
    raise KeyError(name)


def run_reference(program: Program, inputs: list, device) -> list:
    env: dict[int, Any] = {}
    for spec, x in zip(program.inputs, inputs):
        env[id(spec.val)] = x
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var with correction >= count: eager's NaN is the expected value
        for op in program.ops:
            args = [env[id(a)] if isinstance(a, Val) else a for a in op.args]
            result = _ref_op(op, args, device)
            results = result if isinstance(result, tuple) else (result,)
            for o, r in zip(op.outs, results):
                assert r.dtype == o.dtype and tuple(r.shape) == o.shape, (
                    f"fuzzer bug: reference {op.name} gave {r.dtype}{tuple(r.shape)}, inferred {o.describe()}")
                env[id(o)] = r
    return [env[id(v)] for v in program.outputs]


# Relative tolerance per dtype (on top of the value's error bound): one rounding of the result.
RTOL = {F32: 1e-5, F64: 1e-12, BF16: 1e-2, F16: 2e-3}


def tolerances(v: Val) -> tuple[float, float]:
    """(atol, rtol) for comparing output ``v``: exact when both sides compute it exactly."""
    if v.dtype not in FLOATS or v.exact:
        return 0.0, 0.0
    return 4 * v.err + 1e-30, RTOL[v.dtype]


# --------------------------------------------------------------------------------------------------------------
# the random generator

DTYPE_WEIGHTS = [(F32, 34), (BF16, 14), (F16, 10), (F64, 10), (I64, 10), (I32, 10), (BOOL, 12)]
SCALARS = [0.5, 2.0, -1.5, 3.0, 1e-3, -0.25, 1, 2, -3]


class Generator:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.b = Builder()
        self.b.program.seed = seed
        self._input_seed = seed * 1000

    # --- helpers --------------------------------------------------------------------------------------------
    def dtype(self, choices=None) -> torch.dtype:
        pool = [(d, w) for d, w in DTYPE_WEIGHTS if choices is None or d in choices]
        return self.rng.choices([d for d, _ in pool], [w for _, w in pool])[0]

    def base_shape(self) -> tuple:
        r = self.rng
        rank = r.choices([1, 2, 3, 4], [15, 40, 35, 10])[0]
        if MAX_DIM <= 9:
            sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5]
        else:  # small ones, round ones, awkward ones, and the largest
            sizes = [1, 2, 3, 5, 8, 16, MAX_DIM, MAX_DIM - 1, r.randint(2, MAX_DIM), r.randint(2, MAX_DIM)]
        shape = [min(r.choice(sizes), MAX_DIM) for _ in range(rank)]
        while math.prod(shape) > MAX_NUMEL // 2:
            i = r.randrange(rank)
            shape[i] = max(1, shape[i] // 2)
        if r.random() < 0.03:  # an empty tensor
            shape[r.randrange(rank)] = 0
        return tuple(shape)

    def new_input(self, shape, dtype=None) -> Val:
        r = self.rng
        dtype = dtype or self.dtype()
        shape = tuple(shape)
        options = ["contiguous", "contiguous", "offset", "sliced", "strided"]
        if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
            options += ["transposed", "transposed"]
        big = [d for d, s in enumerate(shape) if s > 1]
        if big:
            options += ["expanded"] * 2
        if len(shape) >= 3:
            options += ["permuted"] * 2
        if dtype != BOOL:
            options += ["negbit"]
        if dtype in (F32, F64):
            options += ["conjimag"]
        layout = r.choice(options) if shape else "contiguous"
        if layout == "expanded":
            layout += str(r.choice(big))
        elif layout == "permuted":
            order = list(range(len(shape)))
            while order == sorted(order):
                r.shuffle(order)
            layout += "".join(map(str, order))
        dist = r.choices(["normal", "discrete", "special"], [66, 22, 12])[0]
        self._input_seed += 1
        v = self.b.input(shape, dtype, layout, dist, self._input_seed)
        self.b.program.inputs[-1].static_sizes = r.random() < 0.15
        return v

    def pick(self, pred=lambda v: True, recent=0.6) -> Val:
        cands = [v for v in self.b.values if pred(v)]
        if not cands:
            raise Skip("no candidate value")
        if self.rng.random() < recent:
            return cands[-1]
        return self.rng.choice(cands)

    def compatible(self, a: Val, b: Val) -> bool:
        try:
            shape, _ = broadcast_shapes([a, b])
        except Skip:
            return False
        return len(shape) <= MAX_RANK and math.prod(shape) <= MAX_NUMEL

    def partner(self, a: Val, pred=lambda v: True) -> Val:
        """A tensor broadcast-compatible with ``a`` (an existing value, or a new input shaped after ``a``)."""
        r = self.rng
        cands = [v for v in self.b.values if v is not a and pred(v) and self.compatible(a, v)]
        if cands and r.random() < 0.75:
            return cands[-1] if r.random() < 0.4 else r.choice(cands)
        if len(self.b.program.inputs) >= 5:
            raise Skip("too many inputs")
        shape = list(a.shape)
        form = r.random()
        if form < 0.3 and len(shape) > 1:  # lower rank: a suffix (broadcast from the right)
            shape = shape[r.randrange(1, len(shape)):]
        elif form < 0.6:  # size-1 (broadcast) dims
            shape = [1 if r.random() < 0.35 else s for s in shape]
        elif form < 0.75 and any(n == 1 and b for n, b in zip(shape, a.bcast)):
            # complementary: grow a's broadcast dims, broadcast a's other dims ([4, 1] with [1, 5])
            shape = [r.randint(2, 6) if (n == 1 and b) else (1 if r.random() < 0.5 else n)
                     for n, b in zip(shape, a.bcast)]
            if math.prod(broadcast_shapes([a, Val("", tuple(shape), F32, tuple(n == 1 for n in shape))])[0]) > MAX_NUMEL:
                raise Skip("partner too big")
        v = self.new_input(shape, self.dtype())
        if not pred(v) or not self.compatible(a, v):
            raise Skip("partner")
        return v

    def scalar(self, for_val: Val):
        r = self.rng
        if r.random() < 0.12 and len(self.b.program.inputs) < 5:
            if for_val.is_float or r.random() < 0.5:
                return self.b.scalar_input(F64, r.choice([0.75, -1.25, 2.5]))  # a Double scalar input
            return self.b.scalar_input(I64, r.choice([2, -1, 3]))
        return r.choice(SCALARS)

    # --- op families ----------------------------------------------------------------------------------------
    def gen_unary(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar)
        family = r.random()
        if family < 0.45:
            name = r.choice(list(FLOAT_UNARY))
            if name in ("log1p", "sqrt") and not (_nonneg(x) or x.lo > 0):
                x = self.b.apply("abs", x)
            elif name in ("log", "reciprocal", "rsqrt") and x.lo < 0.5:
                x = self.b.apply("add", self.b.apply("abs", x), 1.0 if x.is_float else 1)
            elif name == "exp" and x.mag > 6:
                x = self.b.apply("tanh", x)
            return self.b.apply(name, x)
        if family < 0.85:
            return self.b.apply(r.choice(list(KEEP_UNARY) + ["neg", "neg", "relu", "abs"]), x)
        return self.b.apply(r.choice(list(BOOL_UNARY)), x)

    def gen_binary(self):
        r = self.rng
        a = self.pick(lambda v: not v.scalar)
        name = r.choice(["add", "sub", "mul", "add", "mul", "maximum", "minimum", "div", "truediv", "fmod",
                         "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or"]
                        + list(COMPARE))
        exact_only = name in COMPARE or name in LOGICAL
        if exact_only and not a.exact:
            raise Skip("inexact")
        if name in DIVISION:
            if r.random() < 0.4:
                b = r.choice([2.0, 0.5, 3, 4, 1.5]) if a.is_float else r.choice([2, 3, 5])
            else:
                b = self.partner(a, lambda v: v.dtype != BOOL and (not exact_only or v.exact))
                if b.lo <= 0:
                    b = self.b.apply("add", self.b.apply("abs", b), 1 if b.dtype in INTS else 0.5)
            return self.b.apply(name, a, b)
        if r.random() < 0.3:
            b = self.scalar(a)
        else:
            b = self.partner(a, lambda v: not exact_only or v.exact)
        if r.random() < 0.5:
            a, b = b, a
        return self.b.apply(name, a, b)

    def gen_where(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar)
        conds = [v for v in self.b.values if v.dtype == BOOL and not v.scalar and self.compatible(x, v)]
        if conds and r.random() < 0.5:
            cond = r.choice(conds)
        else:
            src = self.pick(lambda v: not v.scalar and v.exact and v.dtype != BOOL and self.compatible(x, v))
            cond = self.b.apply(r.choice(list(COMPARE)), src, r.choice([0.0, 0.5, -1, 1]))
        other = self.scalar(x) if r.random() < 0.4 else self.partner(x)
        if r.random() < 0.5:
            return self.b.apply("where", cond, x, other)
        return self.b.apply("where", cond, other, x)

    def gen_cast(self):
        x = self.pick(lambda v: not v.scalar)
        return self.b.apply("cast", x, self.dtype())

    def gen_clamp(self):
        x = self.pick(lambda v: not v.scalar and v.dtype != BOOL)
        lo, hi = sorted(self.rng.sample([-2.0, -0.5, 0.0, 0.5, 1.5, -1, 2], 2))
        return self.b.apply("clamp", x, lo, hi)

    def gen_view(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar)
        kind = r.choice(["permute", "permute", "broadcast_in_dim", "broadcast_in_dim", "broadcast", "expand",
                         "squeeze", "reshape", "slice", "slice"])
        if kind == "permute":
            if x.rank < 2:
                raise Skip("rank")
            dims = list(range(x.rank))
            while dims == sorted(dims):
                r.shuffle(dims)
            return self.b.apply("permute", x, dims)
        if kind in ("broadcast_in_dim", "broadcast", "expand"):
            return self._grow(kind, x)
        if kind == "squeeze":
            dims = [d for d in range(x.rank) if x.shape[d] == 1 and x.bcast[d]]
            if not dims:
                raise Skip("nothing to squeeze")
            return self.b.apply("squeeze", x, r.sample(dims, r.randint(1, len(dims))))
        if kind == "reshape":
            return self._reshape(x)
        # slice
        if x.rank == 0 or all(s == 1 for s in x.shape):
            raise Skip("nothing to slice")
        starts, ends = [], []
        for s in x.shape:
            if s > 1 and r.random() < 0.6:
                a = r.randrange(0, s)
                b = r.randrange(a + 1, s + 1)
                starts.append(a)
                ends.append(b)
            else:
                starts.append(0)
                ends.append(s)
        return self.b.apply("slice", x, starts, ends)

    def _grow(self, kind, x: Val):
        r = self.rng
        new = r.randint(0, min(2, MAX_RANK - x.rank))
        out_rank = x.rank + new
        if kind == "expand":  # new dims lead
            positions = list(range(new, out_rank))
        else:
            positions = sorted(r.sample(range(out_rank), x.rank))
        shape = [1] * out_rank
        for j, d in enumerate(positions):
            shape[d] = x.shape[j]
            if x.shape[j] == 1 and x.bcast[j] and kind != "broadcast" and r.random() < 0.6:
                shape[d] = r.randint(2, 6)
        for d in range(out_rank):
            if d not in positions and kind != "broadcast" and r.random() < 0.6:
                shape[d] = r.randint(2, 5)
        if math.prod(shape) > MAX_NUMEL or (shape == list(x.shape)):
            raise Skip("grow")
        if kind == "broadcast":
            return self.b.apply("broadcast", x, [d not in positions for d in range(out_rank)])
        out = self.b.apply("expand", x, shape) if kind == "expand" else self.b.apply("broadcast_in_dim", x, shape, positions)
        if r.random() < 0.25:
            self.b.program.ops[-1].kwargs["symbolic"] = True
        return out

    def _reshape(self, x: Val):
        r = self.rng
        shape = list(x.shape)
        if len(shape) >= 2 and r.random() < 0.5:  # merge two adjacent dims
            i = r.randrange(len(shape) - 1)
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        else:  # split a dim into two factors
            splittable = [i for i, s in enumerate(shape) if s in (4, 6, 8, 9)]
            if not splittable or len(shape) >= MAX_RANK:
                raise Skip("reshape")
            i = r.choice(splittable)
            f = {4: 2, 6: r.choice([2, 3]), 8: r.choice([2, 4]), 9: 3}[shape[i]]
            shape[i:i + 1] = [f, shape[i] // f]
        return self.b.apply("reshape", x, shape)

    def gen_reduction(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.numel > 1)
        name = r.choice(["sum", "sum", "max", "min", "var_mean", "var", "prod"])
        if name in ("var", "var_mean") and not x.is_float:
            name = "sum"
        if name == "prod" and x.mag > 1.5:
            raise Skip("prod")
        nd = 1 if x.rank == 1 or r.random() < 0.6 else 2
        dims = sorted(r.sample(range(x.rank), nd))
        keepdim = r.random() < 0.5
        kwargs = {}
        if name in ("var", "var_mean"):
            kwargs["correction"] = r.choice([0, 1, 1])
        if name == "sum" and x.dtype in REDUCED and r.random() < 0.3:
            kwargs["dtype"] = F32
        res = self.b.apply(name, x, dims, keepdim, **kwargs)
        outs = res if isinstance(res, tuple) else (res,)
        red = outs[-1] if name == "var_mean" and r.random() < 0.5 else outs[0]
        if r.random() < 0.55 and x.is_float:
            # normalization pattern: broadcast the result back and combine it with the reduced value
            back = red
            if not keepdim or r.random() < 0.4:
                kept = [d for d in range(x.rank) if d not in dims] if not keepdim else list(range(x.rank))
                back = self.b.apply("broadcast_in_dim", red, list(x.shape), kept)
            op = r.choice(["sub", "sub", "mul", "add", "div"])
            if op == "div":
                if back.lo <= 0:
                    back = self.b.apply("add", self.b.apply("abs", back), 1.0)
            return self.b.apply(op, x, back)
        return res

    def gen_softmax(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.is_float and not v.special and v.numel > 0)
        if x.mag > 3:
            x = self.b.apply("tanh", x)
        d = r.randrange(x.rank)
        kept = [k for k in range(x.rank) if k != d]
        keep = r.random() < 0.4
        m = self.b.apply("max", x, [d], keep)
        mb = m if keep else self.b.apply("broadcast_in_dim", m, list(x.shape), kept)
        shifted = self.b.apply("sub", x, mb)
        e = self.b.apply("exp", shifted)
        # x - max(x) <= 0: exp is at most 1 and 1-Lipschitz there (the generic bound assumes |x - max| <= 2 mag)
        e.mag, e.err = 1.0, shifted.err + TRANSCENDENTAL_ULPS * ULP[e.dtype]
        s = self.b.apply("sum", e, [d], keep)
        sb = s if keep else self.b.apply("broadcast_in_dim", s, list(x.shape), kept)
        # sum >= 1 (the max's own term), so it is a safe divisor
        sb.lo = max(sb.lo, 1.0 - 1e-3)
        return self.b.apply("div", e, sb)

    def gen_layernorm(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.is_float and v.numel > 0)
        nd = 1 if x.rank == 1 or r.random() < 0.6 else 2
        dims = list(range(x.rank - nd, x.rank)) if r.random() < 0.7 else sorted(r.sample(range(x.rank), nd))
        kept = [k for k in range(x.rank) if k not in dims]
        var, mean = self.b.apply("var_mean", x, dims, False, correction=0)
        mb = self.b.apply("broadcast_in_dim", mean, list(x.shape), kept)
        inv = self.b.apply("rsqrt", self.b.apply("add", var, 0.5))
        ib = self.b.apply("broadcast_in_dim", inv, list(x.shape), kept)
        y = self.b.apply("mul", self.b.apply("sub", x, mb), ib)
        if r.random() < 0.6 and dims == list(range(x.rank - nd, x.rank)):
            w = self.new_input(x.shape[x.rank - nd:], r.choice([F32, F32, BF16, F16, F64]))
            y = self.b.apply("mul", y, w)
            if r.random() < 0.5:
                bias = self.new_input(x.shape[x.rank - nd:], w.dtype)
                y = self.b.apply("add", y, bias)
        return y

    def gen_index_select(self):
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.numel > 0)
        dim = r.randrange(x.rank)
        n = x.shape[dim]
        if len(self.b.program.inputs) >= 5:
            raise Skip("too many inputs")
        m = r.choice([1, 3, 5, 8, n])
        if r.random() < 0.4:  # the index computed in the kernel: flat index // 2 (as the MoE layer's token)
            flat = self._index_input(m, 2 * n)
            index = self.b.apply("div", flat, 2)
        else:
            index = self._index_input(m, n)
        return self.b.apply("index_select", x, index, dim)

    def _index_input(self, m, n) -> Val:
        r = self.rng
        self._input_seed += 1
        v = self.b.input((m,), r.choice([I64, I32]), r.choice(["contiguous", "offset", "strided", "sliced"]),
                         f"index{n}", self._input_seed)
        return v

    def gen_gather(self):
        """gather (an index no larger than x along the other dims) or take_along_axis (an index equal to x or of
        extent 1 along them, broadcast), by an index of x's rank, read from memory or computed in the kernel."""
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.numel > 0)
        if len(self.b.program.inputs) >= 5:
            raise Skip("too many inputs")
        dim = r.randrange(x.rank)
        n = x.shape[dim]
        op = r.choice(["gather", "take_along_axis"])
        shape = [r.choice([1, 3, 5, n]) if d == dim else (r.randint(1, s) if op == "gather" else r.choice([s, s, 1]))
                 for d, s in enumerate(x.shape)]
        if math.prod(shape) > MAX_NUMEL:
            raise Skip("gather size")
        self._input_seed += 1
        layout = r.choice(["contiguous", "offset", "sliced"] + (["transposed"] if len(shape) >= 2 else []))
        index = self.b.input(tuple(shape), r.choice([I64, I32]), layout, f"index{n}", self._input_seed)
        if r.random() < 0.4:  # computed in the kernel (stays in range)
            index = self.b.apply("sub", n - 1, index)
        gathered = self.b.apply(op, x, index, dim)
        if r.random() < 0.4:  # (a draw only gather programs make: other seeds keep their programs)
            return self._scatter(x, index, dim, gathered)
        return gathered

    def _scatter(self, x: Val, index: Val, dim: int, gathered: Val) -> Val:
        """scatter into x along dim by the gather's index (in range, no larger than x along the other dims, often
        repeated: the last write wins, as in ATen's CPU scatter). src: a number (sometimes a symbolic scalar), the
        gathered values (a gather's result: read back from memory by another kernel), a new input of the index's
        shape or larger, or that input through an elementwise op (recomputed at each position the kernel
        searches). Never a Skip: the gather stays drawn as before."""
        r = self.rng
        kind = r.choice(["number", "gathered", "input", "computed"])
        if kind in ("input", "computed") and len(self.b.program.inputs) >= 5:
            kind = "gathered"
        if kind == "number":
            src = self.scalar(x)
        elif kind == "gathered":
            src = gathered
        else:
            shape = [n + r.choice([0, 0, 1]) for n in index.shape]
            if math.prod(shape) > MAX_NUMEL:
                shape = list(index.shape)
            src = self.new_input(shape, x.dtype)
            if kind == "computed":
                src = self.b.apply("logical_not" if x.dtype == BOOL else "abs", src)
        return self.b.apply("scatter", x, index, src, dim)

    def gen_scan(self):
        """cumsum (or cummax/cummin) along one dim of any value, sometimes combined with the value again (x - cumsum: exclusive
        prefix sums)."""
        r = self.rng
        x = self.pick(lambda v: not v.scalar and v.rank >= 1 and v.numel > 0)
        if x.repeats:
            raise Skip("cumsum over a possibly expanded dim")
        dim = r.randrange(x.rank)
        name = r.choice(["cumsum", "cumsum", "cummax", "cummin"]) if x.dtype != BOOL else "cumsum"
        y = self.b.apply(name, x, dim)
        if r.random() < 0.4 and x.is_float:
            return self.b.apply("sub", y, x)
        return y

    def gen_argsort(self):
        """argsort over a small dim of a tensor of rank >= 2: stable over inputs with ties (any dtype), or
        unstable over 'distinct' inputs (eager's order of equal keys is unspecified); half of the time the
        values are taken along the order in the same kernel."""
        r = self.rng
        shape, dim = self._selection_shape("argsort", min_rank=2)
        stable = r.random() < 0.6
        layout = r.choice(["contiguous", "offset", "sliced", "transposed"])
        dtype = r.choice([F32, F64, BF16, I32, I64] + ([BOOL] if stable else []))
        dist = r.choice(["special", "discrete"]) if stable else "distinct"
        if dtype in (BF16,) and not stable:
            dtype = F32  # 'distinct' quarters need not stay distinct in bf16
        x = self.b.input(tuple(shape), dtype, layout, dist, self._input_seed)
        order = self.b.apply("argsort", x, dim, r.random() < 0.5, stable)
        if r.random() < 0.5:
            return self.b.apply("take_along_axis", x, order, dim)
        return order

    def _selection_shape(self, name: str, min_rank: int) -> tuple[list, int]:
        """(shape, dim) of a new input for a sort or selection along ``dim``, which gets 2-12 elements."""
        r = self.rng
        if len(self.b.program.inputs) >= 5:
            raise Skip("too many inputs")
        shape = list(self.base_shape())
        if len(shape) < min_rank or 0 in shape:
            raise Skip(f"{name} shape")
        dim = r.randrange(len(shape))
        shape[dim] = max(shape[dim], r.randint(2, 12))
        if math.prod(shape) > MAX_NUMEL:
            raise Skip(f"{name} size")
        self._input_seed += 1
        return shape, dim

    def gen_topk(self):
        r = self.rng
        shape, dim = self._selection_shape("topk", min_rank=1)
        layout = r.choice(["contiguous", "offset", "sliced"] + (["transposed"] if len(shape) >= 2 else []))
        x = self.b.input(tuple(shape), r.choice([F32, F64, I32, I64]), layout, "distinct", self._input_seed)
        k = r.randint(2, min(shape[dim], 3))
        values, indices = self.b.apply("topk", x, k, dim, r.random() < 0.7)
        if r.random() < 0.5 and values.is_float:  # renormalised, as the MoE router's weights
            values = self.b.apply("div", values, self.b.apply("add", self.b.apply("abs", values), 1.0))
        if r.random() < 0.35 and indices.numel >= 2:  # (a draw only topk programs make: other seeds unchanged)
            return self._routing(indices)
        return values

    def _routing(self, indices: Val) -> Val:
        """The MoE router's index pattern: the top-k indices flattened and stably argsorted (keys whose range the
        IR proves, so a counting-sort segment: segment/counting_sort.py), half of the time with the inverse
        permutation (an argsort of the permutation, stable or not: its values are distinct)."""
        r = self.rng
        flat = self.b.apply("reshape", indices, [indices.numel])
        perm = self.b.apply("argsort", flat, 0, False, True)
        if r.random() < 0.5:
            return self.b.apply("argsort", perm, 0, False, r.random() < 0.5)
        return perm

    FAMILIES = [("unary", 24), ("binary", 26), ("where", 6), ("cast", 8), ("clamp", 2), ("view", 14),
                ("reduction", 14), ("softmax", 3), ("layernorm", 3), ("index_select", 3), ("topk", 1),
                ("gather", 3), ("argsort", 2), ("scan", 3)]

    def generate(self) -> Program:
        r = self.rng
        base = self.base_shape()
        self.new_input(base)
        if r.random() < 0.5:
            other = list(base)
            if r.random() < 0.5:
                other = [1 if r.random() < 0.4 else s for s in other]
            self.new_input(other)
        target = r.randint(3, 10)
        attempts = 0
        while len(self.b.program.ops) < target and attempts < 200:
            attempts += 1
            family = r.choices([f for f, _ in self.FAMILIES], [w for _, w in self.FAMILIES])[0]
            n_ops, n_vals = len(self.b.program.ops), len(self.b.values)
            n_inputs = len(self.b.program.inputs)
            try:
                getattr(self, "gen_" + family)()
                if len(self.b.program.ops) > MAX_OPS:
                    raise Skip("program too long")
            except Skip:
                # roll back a partial macro (ops and inputs it created)
                del self.b.program.ops[n_ops:]
                del self.b.values[n_vals:]
                del self.b.program.inputs[n_inputs:]
        # Every value no op consumes is an output (dead code would only test dead-code handling), the last
        # value always; now and then an intermediate one too, or an input (eager returns the input itself).
        results = [o for op in self.b.program.ops for o in op.outs]
        used = {id(a) for op in self.b.program.ops for a in op.args if isinstance(a, Val)}
        leaves = [v for v in results if id(v) not in used]
        outputs = leaves[-4:] if leaves else [self.b.values[-1]]
        if results and results[-1] not in outputs:
            outputs.append(results[-1])
        for v in results:
            if v not in outputs and r.random() < 0.08 and len(outputs) < 5:
                outputs.insert(0, v)
        if r.random() < 0.03:
            outputs.append(self.b.program.inputs[0].val)
        if r.random() < 0.04:  # one value output twice
            outputs.append(outputs[r.randrange(len(outputs))])
        for v in outputs:
            self.b.output(v)
        return self.b.program


def _mark_nan_sign(x: Val, out: Val) -> None:
    if x.dtype == BF16 and x.special:
        out.zero_ops = out.zero_ops | {NAN_SIGN_GATHER}


def generate(seed: int) -> Program:
    return Generator(seed).generate()
